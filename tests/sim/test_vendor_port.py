"""The port test: host programs in the vendor model zoo's patterns (tests/sim/zoo_host.py,
whose only kvsim line is its import) run on the simulated card, and give exactly what the
same work gives through kvsim's own calls: the same logits, the same simulated time."""

from __future__ import annotations

import io
import json
import tokenize
from pathlib import Path

import numpy as np
import pytest

import sim.runtime as qbruntime
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.runtime import Accelerator, BatchParam, Model, RuntimeApiError
from sim.runtime.cacheops import CacheOpError
from tests.sim import zoo_host

ARIES = "aries"
TINY = load_preset("tiny")
SLOTS = 3
PROMPT = [5, 17, 3, 99, 42, 7, 61, 8, 23, 11, 70, 2, 9, 33, 14, 50, 1, 4, 88, 19]


@pytest.fixture(scope="module")
def cm():
    from sim.device.hw import load_hardware

    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(load_hardware(ARIES)),
                         kv="int8", core_mode="single", max_seq=16, cap=96, slots=SLOTS)


@pytest.fixture(scope="module")
def path(cm, tmp_path_factory):
    p = tmp_path_factory.mktemp("port") / "tiny.kvm"
    cm.save(p)
    return str(p)


@pytest.fixture(scope="module")
def table(cm):
    return cm.weight_source().tensor("embed")


def _kvsim_model(path):
    acc = Accelerator(hw=ARIES)
    model = Model(path)
    model.launch(acc)
    return acc, model


def _kvsim_generate(path, table, prompt, new_tokens, chunk):
    """The same generation through kvsim's own calls (2-D arrays, (vocab,) logits)."""
    acc, model = _kvsim_model(path)
    for a in range(0, len(prompt), chunk):
        logits = model.infer(table[prompt[a:a + chunk]], cache_size=a)[0]
    tokens, n = [], len(prompt)
    for _ in range(new_tokens):
        tokens.append(int(np.argmax(logits)))
        logits = model.infer(table[[tokens[-1]]], cache_size=n)[0]
        n += 1
    return tokens, acc.device.env.now


def test_the_host_programs_know_nothing_of_kvsim_but_their_import():
    text = Path(zoo_host.__file__).read_text()
    lines = text.splitlines()
    # names in the code (not in strings or comments) that know of kvsim
    names = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.NAME and t.string in ("sim", "kvsim")]
    assert [lines[t.start[0] - 1] for t in names] == ["import sim.runtime as qbruntime"]


def test_chunked_prefill_and_decode_match_kvsim_calls_in_logits_and_time(path, table):
    want, want_ps = _kvsim_generate(path, table, PROMPT, 6, chunk=8)
    got = zoo_host.generate(path, table, PROMPT, new_tokens=6, chunk=8)
    assert got == want
    # the same calls cost the same simulated time: measure the vendor-style run's clock
    acc = Accelerator(0)
    model = Model(path, qbruntime.ModelConfig())
    model.launch(acc)
    cache = zoo_host.CacheLayer(model)
    logits = zoo_host.prefill(model, cache, table, PROMPT, 8)
    zoo_host.decode(model, cache, table, logits, 6)
    assert acc.device.env.now == want_ps


def test_dump_and_restore_mid_generation_changes_nothing(path, table, tmp_path):
    plain = zoo_host.generate(path, table, PROMPT, new_tokens=6, chunk=8)
    trace = tmp_path / "host.json"
    restored = zoo_host.generate(path, table, PROMPT, new_tokens=6, chunk=8, snapshot_at=3,
                                 trace=str(trace))
    assert restored == plain
    events = json.loads(trace.read_text())["traceEvents"]
    calls = [e["name"] for e in events if e["ph"] == "X"]
    # launch, 3 prefill chunks, 3 decodes, dump, reset, load, 3 decodes
    assert calls == (["launch"] + ["infer"] * 6 + ["dump_cache_memory", "reset_cache_memory",
                                                   "load_cache_memory"] + ["infer"] * 3)
    dump = next(e for e in events if e["name"] == "dump_cache_memory")
    assert dump["args"]["pcie_d2h_bytes"] > 0


def test_batch_decoding_with_cache_slots_matches_one_model_per_request(path, table):
    prompts = [PROMPT[:10], PROMPT[4:9], PROMPT[::2]]
    got = zoo_host.batch_decode(path, table, prompts, steps=4, chunk=8)
    for prompt, tokens in zip(prompts, got, strict=True):
        want, _ = _kvsim_generate(path, table, prompt, 5, chunk=8)
        assert tokens == want


def test_filter_cache_tail_after_drafts_equals_never_having_seen_the_rejected(path, table):
    drafts = [31, 32, 33, 34, 35]
    size, logits = zoo_host.speculative_step(path, table, PROMPT[:12], drafts, accepted=2)
    assert size == 14
    _, ref = _kvsim_model(path)
    ref.infer(table[PROMPT[:12] + drafts[:2]], cache_size=0)
    want = ref.infer(table[[drafts[0]]], cache_size=14)[0]
    assert np.array_equal(logits, want)


def test_a_slot_dump_holds_one_slot_and_restores_only_it(path, table):
    acc, model = _kvsim_model(path)
    infos = model.get_cache_infos()
    model.infer(table[PROMPT[:8]], cache_size=0, cache_id=1)
    bufs = model.dump_cache_memory(1)
    assert [len(b) for b in bufs] == [i.size for i in infos]
    whole = model.dump_cache_memory()
    assert all(w[i.size:2 * i.size] == b for w, b, i in zip(whole, bufs, infos, strict=True))
    model.reset_cache_memory()
    model.load_cache_memory(bufs, 2)  # a slot's dump loads into another slot
    after = model.dump_cache_memory()
    assert all(a[2 * i.size:3 * i.size] == b and not any(a[i.size:2 * i.size])
               for a, b, i in zip(after, bufs, infos, strict=True))
    with pytest.raises(CacheOpError, match="slot 0 of the cache takes"):
        model.load_cache_memory(whole, 0)


def test_vendor_shapes_and_refusals(path, table):
    model = qbruntime.load(path)
    info = model.get_input_buffer_info()[0]
    assert (info.max_cache_size, info.max_width, info.max_channel) == (96, 16, TINY.hidden_size)
    x = table[PROMPT[:4]][None, None].astype(np.float32)
    out = model.infer(x, None, 0)  # a bare array is accepted
    assert out[0].shape == (1, 1, 1, TINY.vocab_size)
    empty: list = []
    assert model.infer([x], empty, 0) is None and empty[0].shape == (1, 1, 1, TINY.vocab_size)
    with pytest.raises(RuntimeApiError, match=r"outputs\[0\]: shape \(1, 1, 2, \d+\)"):
        model.infer([x], [np.zeros((1, 1, 2, TINY.vocab_size), np.float32)], 0)
    with pytest.raises(ValueError, match="the model has 1 input"):  # the vendor's type
        model.infer([x, x], None, 0)
    with pytest.raises(RuntimeApiError, match="add up to 3 tokens, the inputs hold 4"):
        model.infer([x], None, 0, [BatchParam(1, 0, 0), BatchParam(2, 0, 1)])
    with pytest.raises(RuntimeApiError, match=r"batch_params\[1\].cache_id 0: two requests"):
        model.infer([x], None, 0, [BatchParam(2, 0, 0), BatchParam(2, 0, 0)])
    with pytest.raises(RuntimeApiError, match="pass 0"):
        model.infer([x], None, 5, [BatchParam(4, 0, 0)])
    with pytest.raises(RuntimeApiError, match="unknown device type 'mla100'"):
        qbruntime.Accelerator("mla100", 0)
    with pytest.raises(RuntimeApiError, match="does not match the compiled model's 'single'"):
        mc = qbruntime.ModelConfig()
        mc.set_global8_core_mode()
        qbruntime.Model(path, mc)
    with pytest.raises(RuntimeApiError, match="kvsim simulates one model instance"):
        qbruntime.ModelConfig().set_single_core_mode(4)


def test_infer_speedrun_is_the_program_without_its_transfers(path, table):
    acc, model = _kvsim_model(path)
    model.infer(table[PROMPT[:8]], cache_size=0)
    before = model.dump_cache_memory()
    infer = [c for c in acc.calls if c.op == "infer"][-1]
    t = model.infer_speedrun()
    speed = acc.calls[-1]
    assert speed.op == "infer_speedrun" and t == speed.time_s
    assert "pcie_h2d" not in speed.stats["traffic"] and "pcie_d2h" not in speed.stats["traffic"]
    assert 0 < t < infer.time_s
    assert model.dump_cache_memory() == before


def test_tracing_refuses_misuse(tmp_path):
    with pytest.raises(RuntimeApiError, match="tracing is not on"):
        qbruntime.stop_tracing_events()
    with pytest.raises(RuntimeApiError, match="cannot write into the folder"):
        qbruntime.start_tracing_events(tmp_path / "no" / "such" / "t.json")
    qbruntime.start_tracing_events(tmp_path / "t.json")
    try:
        with pytest.raises(RuntimeApiError, match="already on"):
            qbruntime.start_tracing_events(tmp_path / "u.json")
    finally:
        qbruntime.stop_tracing_events()
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"] == []


@pytest.mark.parametrize("kv", ["int8", "kivi-4"])
def test_a_batch_is_one_program_exact_per_request_and_streams_the_weights_once(kv, table):
    from sim.device.hw import load_hardware

    cm = compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(load_hardware(ARIES)),
                       kv=kv, core_mode="single", max_seq=16, cap=96, slots=SLOTS)
    prompts = [PROMPT[:9], PROMPT[9:12], PROMPT[3:15]]

    def filled():
        acc = Accelerator(hw=ARIES)
        model = Model(cm)
        model.launch(acc)
        for i, p in enumerate(prompts):
            model.infer(table[p], cache_size=0, cache_id=i)
        return acc, model

    acc, model = filled()
    assert model.batched is not None
    # a decode step for two requests and a prefill chunk for the third, in one call
    x = table[[40, 41] + [50, 51, 52]][None, None].astype(np.float32)
    params = [BatchParam(1, 9, 0), BatchParam(1, 3, 1), BatchParam(3, 12, 2)]
    out = model.infer([x], None, 0, params)[0]
    batch = acc.calls[-1]
    assert acc.num_calls == 1 + 3 + 1 and out.shape == (1, 1, 3, TINY.vocab_size)
    acc1, one = filled()
    singles = []
    for (a, b), bp in zip([(0, 1), (1, 2), (2, 5)], params, strict=True):
        want = one.infer(x[0, 0, a:b], cache_size=bp.cache_size, cache_id=bp.cache_id)[0]
        assert np.array_equal(out[0, 0, bp.cache_id], want)
        singles.append(acc1.calls[-1])
    assert model.dump_cache_memory() == one.dump_cache_memory()
    weights = [c.stats["by_kind"].get("weights", 0) for c in (batch, *singles)]
    # a request alone streams every weight once; the batch about once, not three times
    assert 0 < max(weights[1:]) <= weights[0] < 2 * min(weights[1:])
    assert batch.time_s < sum(c.time_s for c in singles)
