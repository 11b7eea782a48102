"""Byte intervals are binned as they are recorded: memory grows with the number of bins,
not with the number of transfers, and every byte total stays exact (the bins, the
bandwidth curves of the report and the counter tracks of the trace all add up to the
bytes that were moved)."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest

from models.demo import gemv_layer
from sim.device.device import Device
from sim.device.hw import load_hardware
from traces.chrome import bandwidth_series, chrome_trace, chrome_trace_json
from traces.recorder import Recorder

from .test_trace_levels import assert_perfetto_ready


def _transfers(n: int, *, seed: int = 0, horizon_ps: int = 10**9) -> list[tuple]:
    """Random transfers on a few tracks: some within one bin, some across many, some of
    zero duration, some of zero bytes."""
    rng = random.Random(seed)
    tracks = [("dram", f"ch{c}") for c in range(4)] + [("pcie", "h2d"), ("pcie", "d2h")]
    out = []
    for _ in range(n):
        block, lane = rng.choice(tracks)
        start = rng.randrange(horizon_ps)
        dur = rng.choice([0, 1, 3, 999, 10**4, 10**6, 10**8])
        out.append((block, lane, start, start + dur, rng.choice([0, 1, 7, 4096, 10**6 + 3])))
    return out


def _record(rec: Recorder, transfers: list[tuple]) -> Counter:
    exact: Counter = Counter()
    for block, lane, start, end, n in transfers:
        rec.moved(block, lane, start, end, n)
        exact[(block, lane)] += n
    return exact


def _binned(rec: Recorder) -> Counter:
    out: Counter = Counter()
    for b in rec.bytes:
        out[(b.block, b.lane)] += b.nbytes
    return out


@pytest.mark.parametrize("bin_ps,max_bins", [(1, 8), (1_000, 4096), (7, 100)])
def test_binned_byte_totals_equal_the_sum_of_the_transfers_exactly(bin_ps, max_bins):
    rec = Recorder(level="ops", byte_bin_ps=bin_ps, max_byte_bins=max_bins)
    exact = _record(rec, _transfers(20_000))
    assert rec.dropped == 0
    assert _binned(rec) == exact  # integers: equal, not close
    assert rec.byte_totals == exact
    assert rec.binned_totals() == exact
    # the bins of a track are disjoint, in time order, and within the run
    for key in exact:
        spans = [(b.start_ps, b.end_ps) for b in rec.bytes if (b.block, b.lane) == key]
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        w = rec.byte_bin_width_ps
        assert all(s // w == max(s, e - 1) // w for s, e in spans)  # each within one bin


def test_a_transfer_across_bins_is_split_in_whole_bytes_in_proportion():
    rec = Recorder(level="ops", byte_bin_ps=10, max_byte_bins=100)
    rec.moved("pcie", "h2d", 5, 35, 10)  # 5/30 in bin 0, 10/30 in bins 1 and 2, 5/30 in 3
    assert [(b.start_ps, b.end_ps, b.nbytes) for b in rec.bytes] == [
        (5, 10, 1), (10, 20, 4), (20, 30, 3), (30, 35, 2)]  # cumulative floor: 1, 5, 8, 10
    assert rec.byte_records == 4 and rec.binned_totals() == {("pcie", "h2d"): 10}


@pytest.mark.parametrize("transfers", [1_000, 10_000, 100_000])
def test_stored_byte_records_are_bounded_by_the_bins_not_the_transfers(transfers):
    rec = Recorder(level="ops", byte_bin_ps=1_000, max_byte_bins=256)
    exact = _record(rec, _transfers(transfers, seed=transfers))
    records = rec.bytes
    assert len(records) == rec.byte_records
    assert len(records) <= len(exact) * 256
    per_track = Counter((b.block, b.lane) for b in records)
    assert max(per_track.values()) <= 256
    # the width doubled until the run fits in 256 bins: no finer than needed
    last = max(max(s, e - 1) for _, _, s, e, _ in _transfers(transfers, seed=transfers))
    w = rec.byte_bin_width_ps
    assert last // w < 256 <= last // (w // 2)
    assert _binned(rec) == exact


def test_a_longer_run_coarsens_the_bins_instead_of_growing():
    rec = Recorder(level="ops", byte_bin_ps=1_000, max_byte_bins=64)
    total = 0
    sizes = []
    for step in range(1, 20):
        for i in range(200):  # 200 transfers per step, over ever longer simulated time
            t = (step * 200 + i) * 10**step
            rec.moved("dram", "ch0", t, t + 50, 64)
            total += 64
        sizes.append(rec.byte_records)
    assert max(sizes) <= 64
    assert rec.binned_totals() == rec.byte_totals == {("dram", "ch0"): total}


def test_at_the_event_limit_whole_transfers_are_dropped_and_totals_stay_exact():
    rec = Recorder(level="ops", max_events=10, byte_bin_ps=100, max_byte_bins=1_000)
    for i in range(5):
        rec.span("core0", "mxu", "gemm", i, i + 1)
    kept: Counter = Counter()
    for t in range(0, 20_000, 50):
        before = rec.dropped
        rec.moved("dram", "ch0", t, t + 150, 300)  # across two or three bins
        if rec.dropped == before:
            kept[("dram", "ch0")] += 300
    assert rec.dropped > 0
    assert len(rec.spans) + rec.byte_records <= 10
    assert rec.binned_totals() == kept  # no transfer half-stored
    assert rec.byte_totals == {("dram", "ch0"): 300 * 400}  # every transfer reported
    rec.span("core0", "mxu", "gemm", 0, 1)  # spans count against the same limit
    assert len(rec.spans) == 5


def test_trace_off_bins_nothing():
    rec = Recorder(level="off")
    rec.moved("dram", "ch0", 0, 10, 5)
    assert rec.bytes == [] and rec.byte_totals == {} and rec.dropped == 0


def _unbinned_bytes(transfers: list[tuple], edges: np.ndarray) -> dict:
    """Bytes per bin of every transfer on its own, each spread uniformly over its
    duration: what the bandwidth curves showed before byte intervals were binned."""
    out = {}
    for key in {(b, ln) for b, ln, *_ in transfers}:
        arr = np.asarray([t[2:] for t in transfers if t[:2] == key], dtype=np.float64)
        s, e, n = arr[:, 0], np.maximum(arr[:, 1], arr[:, 0] + 1), arr[:, 2]
        ov = np.clip(np.minimum(e[:, None], edges[None, 1:])
                     - np.maximum(s[:, None], edges[None, :-1]), 0, None)
        out[key] = (ov * (n / (e - s))[:, None]).sum(axis=0)
    return out


@pytest.mark.parametrize("seed", [7, 8])
def test_bandwidth_curves_are_the_unbinned_curves_and_carry_every_byte(seed):
    transfers = _transfers(5_000, seed=seed)
    rec = Recorder(level="ops")
    exact = _record(rec, transfers)
    series = bandwidth_series(rec, bins=200)
    stop = max(e for *_, e, _ in transfers)
    assert set(series) == set(exact)
    t = next(iter(series.values()))[0]
    width = int(t[1] - t[0])
    # at most 200 bins, each a whole number of recorder bins, covering the run
    assert len(t) <= 200 and len(t) * width >= stop > (len(t) - 1) * width
    assert width % rec.byte_bin_width_ps == 0 and width >= -(-stop // 200)
    edges = np.arange(len(t) + 1, dtype=np.float64) * width
    ref = _unbinned_bytes(transfers, edges)
    for key, (ts, bps) in series.items():
        assert (ts == t).all()
        got = bps * width / 1e12  # bytes per bin
        assert got.sum() == pytest.approx(exact[key], rel=1e-9)
        # the same bytes in every bin: up to the whole-byte split of the transfers that
        # cross a bin edge (under one byte each, on the cumulative curve)
        crossing = [sum(1 for b, ln, s, e, _ in transfers if (b, ln) == key and s < x < e)
                    for x in edges[1:]]
        err = np.abs(np.cumsum(got) - np.cumsum(ref[key]))
        assert (err <= np.asarray(crossing) + 1e-9 * exact[key]).all()


def test_counter_tracks_of_the_trace_carry_every_byte():
    transfers = _transfers(5_000, seed=11)
    rec = Recorder(level="ops")
    exact = _record(rec, transfers)
    trace = chrome_trace(rec, counter_bins=200)
    assert_perfetto_ready(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    counters: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "C":
            key = (names[e["pid"]], e["name"].removesuffix(" GB/s"))
            counters.setdefault(key, []).append((e["ts"], e["args"]["GB/s"]))
    assert set(counters) == set(exact)
    for key, points in counters.items():
        ts = [t for t, _ in points]
        width_s = (ts[1] - ts[0]) / 1e6
        moved = sum(v for _, v in points) * 1e9 * width_s
        # GB/s rounded to 6 decimals in the JSON: 1 kB/s per bin at most
        assert moved == pytest.approx(exact[key], rel=1e-6, abs=200 * 1e3 * width_s)


def test_the_bins_of_a_simulated_run_hold_every_byte_the_dram_and_link_moved():
    hw = load_hardware("tiny")
    layer = gemv_layer(k=512, n=256, w_bits=8, num_cores=2, sram_bytes=hw.sram.bytes_per_core,
                       dram_bytes=hw.dram.capacity_bytes, host_bytes=hw.host.memory_bytes,
                       tile_bytes=4096)
    fine = Recorder(level="ops", byte_bin_ps=1, max_byte_bins=16)  # coarsens many times
    dev = Device(hw, layout=layer.layout, functional=False, recorder=fine)
    run = dev.run(layer.program)
    plain = Device(hw, layout=layer.layout, functional=False)  # no recorder: same timing
    assert plain.run(layer.program).duration_ps == run.duration_ps
    binned = fine.binned_totals()
    assert binned == fine.byte_totals and fine.dropped == 0
    dram = sum(v for (block, _), v in binned.items() if block == "dram")
    assert dram == dev.dram.bytes_read + dev.dram.bytes_written > 0
    traffic = run.stats["traffic"]
    for direction in ("h2d", "d2h"):
        assert binned.get(("pcie", direction), 0) == traffic.get(f"pcie_{direction}", 0)
    assert max(Counter((b.block, b.lane) for b in fine.bytes).values()) <= 16


def _many(rec: Recorder, transfers: list[tuple]) -> None:
    tracks = sorted({(b, lane) for b, lane, *_ in transfers})
    ids = {t: k for k, t in enumerate(tracks)}
    rec.moved_many(tracks, [ids[(b, lane)] for b, lane, *_ in transfers],
                   [t[2] for t in transfers], [t[3] for t in transfers],
                   [t[4] for t in transfers])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_events", [2_000_000, 300, 40])
def test_moving_many_at_once_bins_as_moving_each(seed, max_events):
    # in batches, after some single moves, across coarsenings, near and past the limit
    transfers = _transfers(400, seed=seed)
    one = Recorder(level="ops", max_events=max_events, byte_bin_ps=100, max_byte_bins=64)
    many = Recorder(level="ops", max_events=max_events, byte_bin_ps=100, max_byte_bins=64)
    _record(one, transfers)
    _record(many, transfers[:7])
    for lo in range(7, 400, 131):
        _many(many, transfers[lo: lo + 131])
    assert many._bins == one._bins
    assert list(many._bins) == list(one._bins)  # tracks in the order they first moved
    assert list(many.byte_totals.items()) == list(one.byte_totals.items())
    assert (many._nbins, many.dropped, many.byte_bin_width_ps) == (
        one._nbins, one.dropped, one.byte_bin_width_ps)
    assert many.bytes == one.bytes


def test_the_batch_takes_its_fast_path_when_nothing_can_be_dropped():
    rec = Recorder(level="ops", byte_bin_ps=100, max_byte_bins=64)
    calls = []
    rec.moved = lambda *a: calls.append(a)  # the one-by-one path would call it
    _many(rec, _transfers(300, seed=1))
    assert not calls and rec.byte_records > 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("max_events", [60, 150, 400])
def test_a_full_recorder_decides_what_to_drop_in_bulk_as_one_by_one(seed, max_events):
    # bins wide enough never to coarsen: once full, a transfer is kept exactly when all its
    # bins are stored, so the batch decides it at once (near the limit: one call each only
    # until the recorder is full); the trace JSON is the same as one call per transfer's
    transfers = [t for t in _transfers(900, seed=seed, horizon_ps=10**7)
                 if t[3] < 512 * 10**5][:600]
    one = Recorder(level="ops", max_events=max_events, byte_bin_ps=10**5, max_byte_bins=512)
    many = Recorder(level="ops", max_events=max_events, byte_bin_ps=10**5, max_byte_bins=512)
    for rec in (one, many):
        rec.span("core0", "mat", "gemm", 0, 10, args={"index": 0})
    _record(one, transfers)
    _record(many, transfers[:50])
    calls = []
    single = many.moved
    def moved(*a):  # note whether the recorder was full when called one by one
        calls.append(many.byte_records + len(many.spans) >= many.max_events)
        single(*a)

    many.moved = moved
    for lo in range(50, 600, 110):
        _many(many, transfers[lo: lo + 110])
    assert one.dropped > 0 and one.byte_bin_width_ps == 10**5  # past the limit, no merges
    assert not any(calls)  # one call each only where the order could matter
    assert many._bins == one._bins and list(many._bins) == list(one._bins)
    assert list(many.byte_totals.items()) == list(one.byte_totals.items())
    assert (many._nbins, many.dropped) == (one._nbins, one.dropped)
    assert many.can_take(5, [0], [10**6])  # full and staying so: order cannot matter
    assert chrome_trace(many, counter_bins=64) == chrome_trace(one, counter_bins=64)
    # the trace text encoded one event at a time is json.dumps of the whole dict
    assert chrome_trace_json(many, counter_bins=64) == json.dumps(
        chrome_trace(one, counter_bins=64), separators=(",", ":"))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("max_events", [2_000_000, 30])
def test_a_batch_of_transfers_each_inside_one_bin_bins_as_moving_each(seed, max_events):
    # every transfer of a batch inside one bin: the batch's one-bin path, with room and
    # once full (bins wide enough never to coarsen, so the bulk path is taken full too)
    rng = random.Random(seed)
    width = 10**4
    transfers = []
    for _ in range(300):
        b, lane = rng.choice([("dram", "ch0"), ("dram", "ch5"), ("pcie", "d2h")])
        start = rng.randrange(0, 200) * width + rng.randrange(0, width // 2)
        transfers.append((b, lane, start, start + rng.randrange(0, width // 2),
                          rng.randrange(0, 5000)))
    one = Recorder(level="ops", max_events=max_events, byte_bin_ps=width, max_byte_bins=256)
    many = Recorder(level="ops", max_events=max_events, byte_bin_ps=width, max_byte_bins=256)
    _record(one, transfers)
    _record(many, transfers[:40])
    for lo in range(40, 300, 65):
        _many(many, transfers[lo: lo + 65])
    assert many._bins == one._bins and list(many._bins) == list(one._bins)
    assert list(many.byte_totals.items()) == list(one.byte_totals.items())
    assert (many._nbins, many.dropped) == (one._nbins, one.dropped)
    assert (one.dropped > 0) == (max_events == 30)
