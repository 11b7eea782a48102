"""``kvsim exec``: an unchanged host program's ``import qbruntime`` resolves to kvsim's
simulated card in the child only, its ``time.perf_counter`` reads simulated time, its calls
are recorded; a real runtime is not shadowed unless asked. And the vendor's own NPU backend
(mblt-npu-python's ``MobilintNPUBackend``, when installed) creates, probes and launches a
kvsim compiled model through it."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from importlib.util import find_spec

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.app.vendor.execute import child_env, real_runtimes, run
from sim.runtime.vendor import SHIM_DIR

TINY = load_preset("tiny")


@pytest.fixture(scope="module")
def kvm(tmp_path_factory):
    from sim.device.hw import load_hardware

    cm = compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(
        load_hardware("aries")), kv="int8", core_mode="single", max_seq=8, cap=64, slots=2)
    folder = tmp_path_factory.mktemp("exec")
    cm.save(folder / "tiny.kvm")
    np.save(folder / "embed.npy", cm.weight_source().tensor("embed").astype(np.float32))
    return folder


def _exec(script: str, folder, *, shadow: bool = False) -> dict:
    """Run ``script`` in ``folder`` as ``kvsim exec`` runs a command; its JSON result."""
    (folder / "host.py").write_text(textwrap.dedent(script))
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = run([sys.executable, "host.py"], trace_calls="calls.json", shadow=shadow)
    finally:
        os.chdir(cwd)
    assert code == 0
    return json.loads((folder / "result.json").read_text())


HOST = """
import json, time
import numpy as np
import qbruntime

model = qbruntime.Model("tiny.kvm")
acc = qbruntime.Accelerator()
t0 = time.perf_counter_ns()
model.launch(acc)
table = np.load("embed.npy")
out = model.infer([table[[5, 17, 3]][None, None]], None, 0)
t1 = time.perf_counter_ns()
json.dump({"module": qbruntime.__file__, "top": int(np.argmax(out[0][0, 0, -1])),
           "ns": t1 - t0, "device": acc.get_device_name()}, open("result.json", "w"))
"""


def test_an_unchanged_host_program_runs_on_the_simulated_card(kvm):
    from sim.runtime import Accelerator, Model

    if real_runtimes():
        pytest.skip(f"a real runtime is installed here: {real_runtimes()}")
    got = _exec(HOST, kvm)
    acc = Accelerator(hw="aries")
    model = Model(str(kvm / "tiny.kvm"))
    model.launch(acc)
    want = model.infer(np.load(kvm / "embed.npy")[[5, 17, 3]], cache_size=0)[0]
    assert got["module"].startswith(str(SHIM_DIR)) and got["device"] == "aries-rb"
    assert got["top"] == int(np.argmax(want))
    # perf_counter_ns measured the launch and the call: the card's simulated time (ns)
    assert got["ns"] == acc.device.env.now // 1000
    rec = json.loads((kvm / "calls.json").read_text())
    assert {k: v["count"] for k, v in rec["qbruntime_calls"].items()} == {
        "Accelerator.__init__": 1, "Model.__init__": 1, "Model.launch": 1, "Model.infer": 1,
        "Accelerator.get_device_name": 1}
    assert rec["cards"][0]["device_calls"]["infer"]["count"] == 1


def test_the_child_gets_the_shim_first_and_the_system_described(tmp_path):
    env = child_env({"PYTHONPATH": "/x", "KVSIM_QB_FUNCTIONAL": "1"}, hw="tiny", cards=2,
                    clock="sim+host", functional=None, trace_calls=str(tmp_path / "c.json"))
    assert env["PYTHONPATH"] == os.pathsep.join([str(SHIM_DIR), "/x"])
    assert (env["KVSIM_QB_HW"], env["KVSIM_QB_CARDS"], env["KVSIM_QB_CLOCK"]) == (
        "tiny", "2", "sim+host")
    assert "KVSIM_QB_FUNCTIONAL" not in env  # not inherited from an outer exec


def test_a_real_runtime_is_not_shadowed_unless_asked(tmp_path, monkeypatch):
    fake = tmp_path / "qbruntime"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert any(str(tmp_path) in r for r in real_runtimes())
    with pytest.raises(ConfigError, match="a real runtime is installed here .*--shadow"):
        run([sys.executable, "-c", "pass"])
    assert run([sys.executable, "-c", "pass"], shadow=True) == 0


def test_bad_exec_arguments_name_the_field():
    with pytest.raises(ConfigError, match="no command given"):
        run(["--"])
    with pytest.raises(ConfigError, match="--hw: unknown hardware preset 'mla9'"):
        run(["true"], hw="mla9")
    with pytest.raises(ConfigError, match="--clock: 'cpu'"):
        run(["true"], clock="cpu")


BACKEND = """
import json
import numpy as np
from mblt_npu import MobilintNPUBackend

b = MobilintNPUBackend(mxq_path="tiny.kvm", core_mode="single", target_cores=["0:0:1"],
                       max_batch_size=2)
b.create()
b.launch()
m = b.mxq_model
x = np.load("embed.npy")[[5, 17, 3]][None, None]
out = b(x)
json.dump({"k": b.k_per_model, "n": b.n_models, "layout": b.output_layout,
           "cores": [repr(c) for c in m.get_target_cores()], "dtype": b.get_dtype(),
           "top": int(np.argmax(out[0][0, 0, -1]))}, open("result.json", "w"))
b.dispose()
"""


@pytest.mark.skipif(find_spec("mblt_npu") is None, reason="mblt-npu-python is not installed "
                    "(pip install --no-deps mblt-npu-python==0.1.0)")
def test_the_vendors_npu_backend_runs_a_kvsim_model(kvm):
    got = _exec(BACKEND, kvm, shadow=True)
    # two cache slots: K = 2 per model, so one model serves max_batch_size 2
    assert (got["k"], got["n"], got["layout"]) == (2, 1, "n_items")
    assert got["cores"] == ["CoreId(cluster=Cluster.Cluster0, core=Core.Core1)"]
    assert got["dtype"] == "DataType.Float32"
    calls = json.loads((kvm / "calls.json").read_text())["qbruntime_calls"]
    assert {"ModelConfig.set_single_core_mode", "Model.get_cache_infos", "Model.launch",
            "Model.infer", "Model.dispose"} <= set(calls)
    assert all(v["not_simulated"] == 0 and v["errors"] == 0 for v in calls.values())


def test_the_vendor_folder_of_a_synthetic_model(tmp_path):
    from safetensors.numpy import load_file

    from sim.app.vendor.folder import write_folder
    from sim.runtime.vendor import api as qb
    from sim.runtime.vendor.system import Settings, reset_system

    f = write_folder("tiny", tmp_path / "tiny", max_seq=8, cap=64, slots=2, timing_only=True)
    conf = json.loads((f.path / "config.json").read_text())
    assert (conf["model_type"], conf["architectures"], conf["mxq_path"]) == (
        "mobilint-qwen2", ["MobilintQwen2ForCausalLM"], "tiny.kvm")
    assert (conf["npu_prefill_chunk_size"], conf["max_batch_size"], conf["core_mode"]) == (
        8, 2, "global8")
    assert conf["auto_map"]["AutoModelForCausalLM"] == "proxy_qwen2.MobilintQwen2ForCausalLM"
    assert "from transformers_mblt.models.qwen2.modeling_qwen2 import" in (
        f.path / "proxy_qwen2.py").read_text()
    table = load_file(str(f.path / "model.safetensors"))["embed_tokens.weight"]
    assert table.shape == (TINY.vocab_size, TINY.hidden_size)
    tok = json.loads((f.path / "tokenizer_config.json").read_text())
    assert tok["eos_token"] == f"<t{TINY.vocab_size - 1}>"
    assert conf["eos_token_id"] == TINY.vocab_size - 1
    s = reset_system(Settings())
    try:
        m = qb.Model(str(f.kvm))
        # two slots take two 8-token chunks in one call
        assert m.get_input_buffer_info()[0].max_width == 16
        assert {i.num_batches for i in m.get_cache_infos()} == {2}
    finally:
        s.close()
