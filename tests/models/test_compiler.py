"""The compiler and functional decode: accuracy against the float reference, timing-only
vs functional runs, the roofline, compiled-model files, and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from isa import kvformats
from models.bits import build_bit_config
from models.compiler import CompiledModel, CompileError, HardwareTarget, compile_model
from models.reference import ReferenceModel
from models.source import load_preset
from sim.app.run import roofline_s
from sim.device.device import Device, static_roofline
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")
#: 2-bit and 4-bit per-token formats without a full-precision window, so that a short
#: test context is really quantized (KIVI keeps its last 128 tokens in fp16).
FORMATS = {
    "int8": "int8",
    "4-bit": "b4.token.g16.asym.scale-fp16.zero-fp16",
    "2-bit": "b2.token.g16.asym.scale-fp16.zero-fp16",
}


def _compile(kv="int8", bits="W8", functional=True, **kw):
    opts = {"core_mode": "single", "max_seq": 16, "cap": 64} | kw
    return compile_model(TINY, build_bit_config({"weights": bits}),
                         HardwareTarget.from_hw(TINY_HW), kv=kv, functional=functional, **opts)


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _decode_cosines(cm: CompiledModel, steps: int = 6, *, same_weights: bool) -> list[float]:
    """Prefill 10 tokens, decode ``steps``; cosine of each call's logits to the float
    reference model, whose weights are quantized like the device's (``same_weights``:
    the error of the integer pipeline alone) or not (the error of the whole build)."""
    acc = Accelerator(hw=TINY_HW, functional=True)
    model = Model(cm)
    model.launch(acc)
    ref = ReferenceModel(TINY, cm.weight_source(),
                         weight_bits=cm.bits.weights if same_weights else None)
    toks = np.random.default_rng(1).integers(0, TINY.vocab_size, size=10 + steps)
    want = ref.prefill(toks)
    emb = ref.embed(toks)
    out = [_cos(model.infer(emb[:10], cache_size=0)[0], want[9])]
    for i in range(10, 10 + steps):
        out.append(_cos(model.infer(emb[i : i + 1], cache_size=i)[0], want[i]))
    return out


@pytest.fixture(scope="module")
def cosines():
    """Mean logit cosine against the unquantized float reference per (weights, KV)."""
    return {
        (bits, name): float(np.mean(_decode_cosines(_compile(kv=fmt, bits=bits),
                                                    same_weights=False)))
        for bits, name, fmt in [("W8", n, f) for n, f in FORMATS.items()]
        + [("W4V8", "int8", "int8")]
    }


def test_w8_int8_functional_decode_matches_the_float_reference():
    """Logit cosine of the integer pipeline (prefill and decode calls) to the float model
    with the same W8 weights: 0.9925 on average over three prompts (worst call 0.963)."""
    cos = _decode_cosines(_compile(), same_weights=True)
    assert float(np.mean(cos)) >= 0.99, cos


def test_accuracy_orders_by_bits(cosines):
    print({f"{b} {k}": round(v, 5) for (b, k), v in cosines.items()})
    assert cosines[("W8", "int8")] >= 0.98
    assert cosines[("W8", "int8")] > cosines[("W8", "4-bit")] > cosines[("W8", "2-bit")]
    assert cosines[("W8", "int8")] > cosines[("W4V8", "int8")]


def _run_program(cm, functional, tokens, cache_size):
    dev = Device(TINY_HW, functional=functional, layout=cm.layout(host_bytes=1 << 24))
    if functional:
        for addr, data in cm.weight_image():
            dev.mem.dram.write(addr, data)
    return dev.run(cm.program(tokens=tokens, cache_size=cache_size))


@pytest.mark.parametrize("kv", ["int8", "kivi-4", FORMATS["2-bit"]])
def test_timing_only_and_functional_runs_agree_cycle_for_cycle(kv):
    f = _run_program(_compile(kv=kv), True, 12, 0)
    t = _run_program(_compile(kv=kv, functional=False), False, 12, 0)
    assert f.duration_ps == t.duration_ps and f.stats == t.stats


@pytest.mark.parametrize("hw_name,model", [("tiny", "tiny"), ("aries", "qwen2.5-0.5b")])
@pytest.mark.parametrize("tokens,cache_size", [(16, 0), (1, 40)])
def test_simulated_time_is_never_below_the_roofline(hw_name, model, tokens, cache_size):
    hw = load_hardware(hw_name)
    cm = compile_model(load_preset(model), build_bit_config({}), HardwareTarget.from_hw(hw),
                       core_mode="single" if hw_name == "tiny" else "global8", max_seq=16,
                       cap=64, functional=False)
    run = Device(hw, functional=False, layout=cm.layout(host_bytes=1 << 30)).run(
        cm.program(tokens=tokens, cache_size=cache_size))
    bound = roofline_s(run.stats, hw, "w8a8").bound_s
    assert run.duration_ps / 1e12 >= bound > 0
    static = static_roofline(cm.program(tokens=tokens, cache_size=cache_size), hw)
    assert static["bound_s"] == pytest.approx(bound, rel=1e-9)


def test_decode_time_grows_with_context_and_kv_bytes_follow_the_format():
    hw = load_hardware("aries")
    model = load_preset("qwen2.5-0.5b")
    times, kv_read = {}, {}
    for kv in ("int8", "bf16"):
        cm = compile_model(model, build_bit_config({}), HardwareTarget.from_hw(hw), kv=kv,
                           max_seq=16, cap=4096, functional=False)
        dev = Device(hw, functional=False, layout=cm.layout(host_bytes=1 << 30))
        for ctx in (256, 2048):
            run = dev.run(cm.program(tokens=1, cache_size=ctx - 1))
            times[(kv, ctx)] = run.duration_ps
            kv_read[(kv, ctx)] = run.stats["link_kind"][("dram_read", "kv_cache")]
    assert times[("int8", 2048)] > times[("int8", 256)]
    assert times[("bf16", 2048)] > times[("int8", 2048)]
    # attention streams each layer's K and V once: exactly the format's bytes
    hd, kvh, layers = model.head_dim, model.num_kv_heads, model.num_layers
    for kv in ("int8", "bf16"):
        fmt = kvformats.parse(kv)
        expect = layers * kvh * 2 * fmt.read_bytes(0, 2048, hd)
        assert kv_read[(kv, 2048)] == expect
    assert kv_read[("int8", 2048)] * 2 == kv_read[("bf16", 2048)]


def test_compiled_model_file_round_trips(tmp_path):
    cm = _compile()
    path = tmp_path / "tiny.kvm"
    cm.save(path)
    back = CompiledModel.load(path)
    assert back.model == cm.model and back.bits == cm.bits and back.kv == cm.kv
    assert back.mm.to_json() == cm.mm.to_json()
    assert back.programs == cm.programs
    for (a, x), (b, y) in zip(cm.weight_image(), back.weight_image(), strict=True):
        assert a == b and np.array_equal(x, y)
    assert back.program(tokens=3, cache_size=5) == cm.program(tokens=3, cache_size=5)


def test_a_corrupt_or_foreign_compiled_file_is_refused(tmp_path):
    bad = tmp_path / "bad.kvm"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CompileError, match="not a kvsim compiled model"):
        CompiledModel.load(bad)
    with pytest.raises(CompileError, match="does not exist"):
        CompiledModel.load(tmp_path / "missing.kvm")


def test_weights_that_do_not_fit_dram_are_refused():
    small = load_hardware("aries", {"dram.capacity_bytes": 256 * 2**20})
    with pytest.raises(CompileError, match=r"needs \d+ MiB of DRAM .* aries has 256 MiB"):
        compile_model(load_preset("qwen2.5-0.5b"), build_bit_config({}),
                      HardwareTarget.from_hw(small), functional=False)


def test_a_tile_that_cannot_fit_sram_is_refused():
    tiny_sram = load_hardware("tiny", {"sram.bytes_per_core": 1024})
    with pytest.raises(CompileError, match="does not fit tiny's SRAM even one token at a time"):
        compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(tiny_sram),
                      core_mode="single", max_seq=4, cap=16, functional=False)
