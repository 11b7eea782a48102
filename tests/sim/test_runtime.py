"""The host runtime and its KV-cache operations (dump/load, files, filter/move, host vs
device edits)."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from isa import kvformats
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.reference import ReferenceModel
from models.source import load_preset
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model, RuntimeApiError
from sim.runtime.cacheops import CacheOpError, evict_positions, requantize_through, score_eviction
from sim.units import ns_to_ps, transfer_ps

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")
ROOT = Path(__file__).resolve().parents[2]


def _cm(kv="int8", cap=160, **kw):
    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(TINY_HW), kv=kv,
                         core_mode="single", max_seq=16, cap=cap, **kw)


@pytest.fixture(scope="module")
def compiled():
    return {kv: _cm(kv) for kv in ("int8", "kivi-4", "qserve-kv4")}


@pytest.fixture(scope="module")
def emb(compiled):
    ref = ReferenceModel(TINY, compiled["int8"].weight_source())
    toks = np.random.default_rng(0).integers(0, TINY.vocab_size, size=48)
    return ref.embed(toks)


def _launched(cm, emb, tokens=32):
    acc = Accelerator(hw=TINY_HW)
    model = Model(cm)
    model.launch(acc)
    for a in range(0, tokens, 16):
        model.infer(emb[a : a + 16], cache_size=a)
    return acc, model


def test_dump_then_load_keeps_later_logits_bit_identical(compiled, emb):
    _, a = _launched(compiled["int8"], emb)
    _, b = _launched(compiled["int8"], emb)
    b.load_cache_memory(b.dump_cache_memory())
    for t in range(32, 36):
        la = a.infer(emb[t : t + 1], cache_size=t)[0]
        lb = b.infer(emb[t : t + 1], cache_size=t)[0]
        assert np.array_equal(la, lb)


@pytest.mark.parametrize("kv", ["int8", "kivi-4", "qserve-kv4"])
def test_host_and_device_evictions_leave_byte_identical_caches(compiled, emb, kv):
    _, host = _launched(compiled[kv], emb)
    _, dev = _launched(compiled[kv], emb)
    _, plain = _launched(compiled[kv], emb)
    drop = [3, 4, 10, 20, 31]
    rh = host.edit_cache_on_host(evict_positions(drop), cache_size=32)
    rd = dev.evict_on_device(drop, cache_size=32)
    assert rh.new_cache_size == rd.new_cache_size == 27
    assert host.dump_cache_memory() == dev.dump_cache_memory()
    assert rd.pcie_bytes == 0 and rh.pcie_bytes > 0
    lh = host.infer(emb[32:33], cache_size=27)[0]
    ld = dev.infer(emb[32:33], cache_size=27)[0]
    lp = plain.infer(emb[32:33], cache_size=32)[0]
    assert np.array_equal(lh, ld) and not np.array_equal(lh, lp)


def test_requantization_on_host_and_device_agree(compiled, emb):
    via = kvformats.parse("b4.token.g16.asym.scale-fp16.zero-fp16")
    _, host = _launched(compiled["int8"], emb)
    _, dev = _launched(compiled["int8"], emb)
    host.edit_cache_on_host(requantize_through(via), cache_size=32)
    dev.requantize_on_device(via, cache_size=32)
    assert host.dump_cache_memory() == dev.dump_cache_memory()


def test_score_policy_keeps_sinks_recent_and_budget(compiled, emb):
    _, m = _launched(compiled["int8"], emb)
    r = m.edit_cache_on_host(score_eviction(keep_sinks=2, keep_recent=4, budget=10),
                             cache_size=32)
    assert r.new_cache_size == 16


def test_in_the_loop_mode_reports_measured_host_time(compiled, emb):
    _, m = _launched(compiled["int8"], emb)
    r = m.edit_cache_on_host(lambda views: None, cache_size=32, mode="in_the_loop")
    assert r.host_measured_s > 0 and r.host_model_s > 0


def test_host_path_cost_matches_the_formula(compiled, emb):
    acc, m = _launched(compiled["int8"], emb)
    infos = m.get_cache_infos()
    r = m.edit_cache_on_host(lambda views: None, cache_size=32)
    hw = TINY_HW
    lat = ns_to_ps(hw.host_link.latency_ns)
    d2h = sum(lat + transfer_ps(i.size, hw.host_link.d2h_effective_bytes_per_s) for i in infos)
    h2d = sum(lat + transfer_ps(i.size, hw.host_link.h2d_effective_bytes_per_s) for i in infos)
    calls = 2 * ns_to_ps(hw.host.call_overhead_ns)
    expect = (d2h + h2d + calls) / 1e12 + r.host_model_s
    assert r.time_s == pytest.approx(expect, rel=0.01)
    assert r.time_s >= (d2h + h2d) / 1e12  # at least the cache crossing PCIe both ways
    total = sum(i.size for i in infos)
    assert r.pcie_bytes == 2 * total


def test_qwen_has_48_caches_whose_dump_crosses_pcie_exactly():
    hw = load_hardware("aries")
    cm = compile_model(load_preset("qwen2.5-0.5b"), build_bit_config({}),
                       HardwareTarget.from_hw(hw), kv="kivi-4", max_seq=16, cap=512,
                       functional=False)
    acc = Accelerator(hw=hw, functional=False)
    m = Model(cm)
    m.launch(acc)
    infos = m.get_cache_infos()
    assert len(infos) == 48
    pair = kvformats.pair("kivi-4")
    for i in infos:
        fmt = pair.k if i.cache_type == "key" else pair.v
        assert i.size == 2 * fmt.region_bytes(512, 64)  # 2 KV heads of head_dim 64
    bufs = m.dump_cache_memory()
    dump = acc.calls[-1]
    assert dump.stats["traffic"]["pcie_d2h"] == sum(i.size for i in infos)
    m.load_cache_memory(bufs)
    assert acc.calls[-1].stats["traffic"]["pcie_h2d"] == sum(i.size for i in infos)


# --- refused loads leave the cache unchanged ----------------------------------------------


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case", ["count", "size", "type", "model", "format", "checksum",
                                  "missing", "truncated", "not_a_dir"])
def test_refused_loads_leave_the_cache_unchanged(compiled, emb, tmp_path, case):
    _, m = _launched(compiled["int8"], emb)
    before = m.dump_cache_memory()
    bufs = list(before)
    snap = tmp_path / "snap"
    m.dump_cache_memory_to(snap)
    files = sorted(snap.glob("cache_*.bin"))
    if case == "count":
        call = lambda: m.load_cache_memory(bufs[:-1])  # noqa: E731
        needle = "got 3 buffers, the model has 4"
    elif case == "size":
        bufs[1] = bufs[1][:-1]
        call = lambda: m.load_cache_memory(bufs)  # noqa: E731
        needle = "buffer 1 .* bytes, the cache takes"
    elif case == "type":
        bufs[0] = 12
        call = lambda: m.load_cache_memory(bufs)  # noqa: E731
        needle = "not bytes-like"
    elif case in ("model", "format"):
        other = _cm("qserve-kv4") if case == "format" else compile_model(
            load_preset("tiny").model_copy(update={"name": "tiny-b"}), build_bit_config({}),
            HardwareTarget.from_hw(TINY_HW), core_mode="single", max_seq=16, cap=160)
        _, o = _launched(other, emb, tokens=16)
        foreign = tmp_path / "foreign"
        o.dump_cache_memory_to(foreign)
        snap = foreign
        call = lambda: m.load_cache_memory_from(snap)  # noqa: E731
        needle = "another model or KV format" if case == "model" else "another model"
    elif case == "checksum":
        _flip(files[2])
        call = lambda: m.load_cache_memory_from(snap)  # noqa: E731
        needle = "checksum mismatch"
    elif case == "missing":
        files[0].unlink()
        call = lambda: m.load_cache_memory_from(snap)  # noqa: E731
        needle = "is missing"
    elif case == "truncated":
        files[3].write_bytes(files[3].read_bytes()[:10])
        call = lambda: m.load_cache_memory_from(snap)  # noqa: E731
        needle = "truncated header"
    else:
        call = lambda: m.load_cache_memory_from(tmp_path / "nope")  # noqa: E731
        needle = "is not a directory"
    with pytest.raises(CacheOpError, match=needle):
        call()
    assert m.dump_cache_memory() == before


# --- filter_cache_tail and move_cache_tail against a list model ----------------------------


def _tokens(model, cache_size):
    """Per token, the int8 values of every cache (a comparable list)."""
    views = model._views(model.dump_cache_memory(), cache_size, 0)
    return [tuple(v.values[t].tobytes() for v in views) for t in range(cache_size)]


@pytest.mark.parametrize("tail", [1, 2, 3, 5])
def test_filter_cache_tail_matches_a_list_model_for_every_mask(compiled, emb, tail):
    _, m = _launched(compiled["int8"], emb)
    original = _tokens(m, 32)
    snapshot = m.dump_cache_memory()
    for mask in itertools.product([False, True], repeat=tail):
        m.load_cache_memory(snapshot)
        new = m.filter_cache_tail(32, tail, list(mask))
        head = original[: 32 - tail]
        kept = [tok for tok, k in zip(original[32 - tail :], mask, strict=True) if k]
        assert new == len(head) + len(kept)
        assert _tokens(m, new) == head + kept


@pytest.mark.parametrize("num_head,num_tail", [(0, 5), (4, 6), (10, 22), (31, 1), (5, 0)])
def test_move_cache_tail_matches_a_list_model(compiled, emb, num_head, num_tail):
    _, m = _launched(compiled["int8"], emb)
    original = _tokens(m, 32)
    new = m.move_cache_tail(num_head, num_tail, 32)
    assert new == num_head + num_tail
    assert _tokens(m, new) == original[:num_head] + original[32 - num_tail :]


@pytest.mark.parametrize("args,needle", [
    ((32, 33, [True] * 33), "tail_size 33 must be 1..32"),
    ((32, 2, [True]), r"mask has shape \(1,\), expected \(2,\)"),
    ((32, 2, [[True, False]]), "mask has shape"),
    ((32, 2, [2, 0]), "booleans"),
    ((32, 2, ["yes", "no"]), "booleans"),
    ((1, 2, [True, True]), "exceeds cache_size"),
    ((500, 2, [True, True]), "cache_size 500 must be an integer in 0..160"),
])
def test_filter_cache_tail_refuses_bad_arguments(compiled, emb, args, needle):
    _, m = _launched(compiled["int8"], emb)
    before = m.dump_cache_memory()
    with pytest.raises(CacheOpError, match=needle):
        m.filter_cache_tail(*args)
    assert m.dump_cache_memory() == before


def test_calls_after_dispose_and_bad_inputs_are_refused(compiled, emb):
    _, m = _launched(compiled["int8"], emb)
    with pytest.raises(RuntimeApiError, match="inputs: shape"):
        m.infer(emb[:2, :10], cache_size=32)
    with pytest.raises(RuntimeApiError, match="exceed the cache capacity"):
        m.infer(emb[:1], cache_size=160)
    m.dispose()
    with pytest.raises(RuntimeApiError, match="disposed"):
        m.infer(emb[:1], cache_size=0)


def test_a_vendor_style_host_program_runs_unchanged(compiled, tmp_path):
    path = tmp_path / "tiny.kvm"
    compiled["int8"].save(path)
    spec = importlib.util.spec_from_file_location("vendor_pattern",
                                                  ROOT / "examples" / "vendor_pattern.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    trace = tmp_path / "host.json"
    tokens = mod.generate(str(path), prompt_tokens=24, new_tokens=4, npu_prefill_chunk_size=8,
                          trace=str(trace))
    again = mod.generate(str(path), prompt_tokens=24, new_tokens=4, npu_prefill_chunk_size=8)
    assert len(tokens) == 4 and tokens == again
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names.count("infer") == 3 + 4 and names.count("dump_cache_memory") == 1


@pytest.mark.parametrize("op", [
    {"op": "evict", "policy": "window", "sinks": 2, "recent": 8},
    {"op": "evict", "policy": "positions", "drop": [1, 5, 9]},
    {"op": "requantize", "format": "b4.token.g16.asym.scale-fp16.zero-fp16"},
])
def test_scheduled_cache_ops_agree_on_host_and_device(op):
    from sim.app.config import build_run_config, load_tree
    from sim.app.run import run

    results = {}
    for where in ("host", "device"):
        tree = load_tree(None)
        tree["hardware"] = {"preset": "tiny"}
        tree["model"] = {"preset": "tiny"}
        tree["compile"] = {"core_mode": "single"}
        tree["sim"] = {"fidelity": "functional"}
        tree["outputs"] = {"trace": "off"}
        tree["workload"] = {"prompt_tokens": 16, "output_tokens": 4,
                            "cache_ops": [{"at_token": 16, "where": where, **op}]}
        m = run(build_run_config(tree)).metrics.to_metrics()
        results[where] = m
    h, d = results["host"], results["device"]
    assert h["generated_tokens"] == d["generated_tokens"]
    assert h["cache_ops"][0]["new_cache_size"] == d["cache_ops"][0]["new_cache_size"]
    assert h["cache_ops"][0]["pcie_bytes"] > 0 == d["cache_ops"][0]["pcie_bytes"]
    assert h["cache_ops"][0]["time_s"] > d["cache_ops"][0]["time_s"]


def test_call_records_are_bounded_and_counted(compiled, emb):
    acc = Accelerator(hw=TINY_HW, functional=False, keep_calls=4)
    model = Model(compiled["int8"])
    model.launch(acc)
    ends = []
    for i in range(10):
        model.infer(emb[i : i + 1], cache_size=i)
        ends.append(acc.calls[-1].end_ps)
    assert acc.num_calls == 11 and len(acc.calls) == 4  # launch + 10 infers, 4 kept
    assert [c.end_ps for c in acc.calls] == ends[-4:]
    assert [c.end_ps for c in acc.calls_since(acc.num_calls - 2)] == ends[-2:]
    with pytest.raises(RuntimeApiError, match="5 calls were made since, 4 are kept"):
        acc.calls_since(acc.num_calls - 5)
