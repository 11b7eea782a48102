"""Traces stay usable on big runs and open in Perfetto: the trace level (off / ops / tiles)
and the event limit bound what is written, and every trace is well-formed Chrome Trace
Event JSON whose slices nest on each thread (Perfetto drops ``X`` events that partly
overlap on one thread)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from sim.app.cli.main import main
from sim.app.config import load_run_config
from sim.app.run import render_outputs, run
from traces.chrome import chrome_trace
from traces.recorder import Recorder, Span

TINY = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=3"]


def assert_perfetto_ready(trace: dict) -> None:
    """What Perfetto's JSON importer needs: known phases with their fields, µs
    timestamps, names for every process and thread, and slices that nest per thread."""
    assert set(trace) <= {"traceEvents", "otherData"} and "displayTimeUnit" not in trace
    events = trace["traceEvents"]
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_tids = {(e["pid"], e["tid"]) for e in events
                  if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = defaultdict(list)
    for e in events:
        assert e["ph"] in ("M", "X", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and e["ts"] >= 0 and e["dur"] >= 0
            assert (e["pid"], e["tid"]) in named_tids
            # back to integer picoseconds: nesting is exact there, not in float µs
            start = round(e["ts"] * 1e6)
            slices[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1e6)))
        elif e["ph"] == "C":
            assert e["pid"] in named_pids and e["ts"] >= 0
            assert all(isinstance(v, int | float) for v in e["args"].values())
    for lane, spans in slices.items():
        stack: list[int] = []
        for start, end in sorted(spans, key=lambda se: (se[0], -se[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"slices overlap on thread {lane}"
            stack.append(end)


@pytest.mark.parametrize("level", ["ops", "tiles"])
def test_traces_are_perfetto_ready(level):
    result = run(load_run_config(None, [*TINY, f"outputs.trace={level}"]))
    trace = json.loads(render_outputs(result)["trace.json"])
    assert_perfetto_ready(trace)
    assert trace["otherData"] == {"dropped_events": 0, "trace_level": level}


def test_tiles_record_more_than_ops_and_overlapping_chunks_get_their_own_track():
    ops = run(load_run_config(None, [*TINY, "outputs.trace=ops"])).recorder
    tiles = run(load_run_config(None, [*TINY, "outputs.trace=tiles"])).recorder
    assert len(tiles.spans) > len(ops.spans)
    names = [e["args"]["name"] for e in chrome_trace(tiles)["traceEvents"]
             if e["name"] == "thread_name"]
    assert "dma_in" in names and "dma_in #2" in names  # two chunks in flight at once


def test_overlapping_spans_of_a_lane_split_into_nesting_tracks():
    rec = Recorder(level="ops")
    for start, end in [(0, 10), (2, 4), (5, 12), (11, 20), (13, 14)]:
        rec.span("core0", "dma_in", "x", start, end)
    trace = chrome_trace(rec)
    assert_perfetto_ready(trace)
    tids = [e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"]
    # (2,4) nests in (0,10); (5,12) overlaps it: track 2; (11,20) fits after (0,10) ends?
    # no: (0,10) ended, so (11,20) is back on track 1 and (13,14) nests inside it
    assert tids == [1, 1, 2, 1, 1]


def test_event_limit_bounds_the_trace(tmp_path):
    out = tmp_path / "o"
    args = ["run", "--out", str(out), "-q"]
    for s in [*TINY, "outputs.trace=tiles", "outputs.max_trace_events=200"]:
        args += ["--set", s]
    assert main(args) == 0
    trace = json.loads((out / "trace.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["trace"]["dropped_events"] > 0
    assert trace["otherData"]["dropped_events"] == metrics["trace"]["dropped_events"]
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) <= 200
    assert_perfetto_ready(trace)
    assert "event limit reached" in (out / "report.html").read_text()


def test_trace_off_writes_no_trace(tmp_path):
    out = tmp_path / "o"
    args = ["run", "--out", str(out), "-q"]
    for s in [*TINY, "outputs.trace=off"]:
        args += ["--set", s]
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "report.html"]


def test_a_mark_spans_from_the_first_start_to_the_last_end_of_its_instructions():
    rec = Recorder(level="tiles")
    rec.span("core0", "mxu", "old", 0, 5, args={"index": 1})  # before ``since``: not read
    since = len(rec.spans)
    for block, lane, start, end, index in [
            ("core0", "mxu", 10, 20, 3), ("core1", "mxu", 8, 30, 3), ("core0", "vpu", 25, 40, 4),
            ("core0", "dma_in", 2, 9, 0), ("core0", "dma_in", 50, 70, 9)]:
        rec.span(block, lane, "x", start, end, args={"index": index})
    rec.span("dram", "ch0", "read", 0, 99, detail="tiles", args={"bytes": 64})
    rec.span("core0", "vpu", "odd", 1, 2, args={"index": None})
    added = rec.mark(since, [("a", 0, 4), ("b", 4, 9), ("none", 5, 9), ("c", 1, 10),
                             ("d", 20, 30)])
    assert added == 3
    assert [(s.name, s.start_ps, s.end_ps, s.args) for s in rec.spans[-3:]] == [
        ("a", 2, 30, {"first": 0, "end": 4}), ("b", 25, 40, {"first": 4, "end": 9}),
        ("c", 8, 70, {"first": 1, "end": 10})]
    assert all(s.block == "runtime" and s.lane == "layers" for s in rec.spans[-3:])
    assert rec.mark(len(rec.spans), [("e", 0, 9)]) == 0


@pytest.mark.parametrize("level", ["off", "ops", "tiles"])
def test_add_spans_records_what_one_span_call_each_would(level):
    spans = [Span("core0", "mxu", "gemm", 10 * i, 10 * i + 5, {"index": i}) for i in range(7)]
    one, many = (Recorder(level=level, max_events=5) for _ in range(2))
    one.moved("dram", "ch0", 0, 10, 64)  # a byte bin counts towards the limit
    many.moved("dram", "ch0", 0, 10, 64)
    for s in spans:
        one.span(*s[:5], args=s[5])
    assert many.room() == (5 if level == "off" else 4)
    many.add_spans(spans)
    assert many.spans == one.spans
    assert many.dropped == one.dropped == (0 if level == "off" else 3)
    assert many.room() == one.room() == (5 if level == "off" else 0)
