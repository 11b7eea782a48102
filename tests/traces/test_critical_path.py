"""The critical path read back from the event log: tiny timelines with a known chain, and
on a real run, a path that covers every call exactly."""

from __future__ import annotations

import pytest

from sim.config import load_run_config
from sim.run import run
from traces.critical import GAP, critical_path, time_by_group
from traces.recorder import Span


def _ins(block, lane, start, end, index):
    return Span(block, lane, "x", start, end, {"index": index})


def _chain(path):
    return [(k.group, k.start_ps, k.end_ps) for k in path]


def test_the_path_follows_what_each_piece_waited_for():
    # load 0-10 feeds the gemm 10-30 (a flag: another lane); a second load 10-25 on the
    # load lane ends before the gemm, so it is off the path; the store 30-40 waits for
    # the gemm; a vec 5-12 ends at no start on the path
    spans = [_ins("core0", "dma_in", 0, 10, 0), _ins("core0", "dma_in", 10, 25, 1),
             _ins("core0", "mxu", 10, 30, 2), _ins("core0", "vpu", 5, 12, 3),
             _ins("core0", "dma_out", 30, 40, 4)]
    assert _chain(critical_path(spans)) == [
        ("DRAM → SRAM loads", 0, 10), ("matrix unit", 10, 30), ("SRAM → DRAM stores", 30, 40)]


def test_same_lane_first_and_a_gap_where_nothing_ends():
    # two spans end at 20: the store lane's own previous store is taken over the gemm;
    # before 12 nothing ends at the store's start: a gap back to the vec's end
    spans = [_ins("core0", "vpu", 0, 8, 0), _ins("core0", "dma_out", 12, 20, 1),
             _ins("core0", "mxu", 14, 20, 2), _ins("core0", "dma_out", 20, 30, 3)]
    assert _chain(critical_path(spans)) == [
        ("vector unit", 0, 8), (GAP, 8, 12), ("SRAM → DRAM stores", 12, 20),
        ("SRAM → DRAM stores", 20, 30)]
    # the summary lanes (calls, layers) are never on the path
    more = [*spans, Span("runtime", "calls", "infer", 0, 30),
            Span("runtime", "layers", "layer 0", 0, 30)]
    assert _chain(critical_path(more)) == _chain(critical_path(spans))


def test_time_by_group_clips_the_path_to_each_window():
    spans = [_ins("core0", "dma_in", 0, 10, 0), _ins("core0", "mxu", 10, 30, 1)]
    path = critical_path(spans)
    got = time_by_group(path, [("a", 0, 5), ("b", 5, 25), ("a", 25, 30)])
    assert got == {"a": {"DRAM → SRAM loads": 5, "matrix unit": 5},
                   "b": {"DRAM → SRAM loads": 5, "matrix unit": 15}}


@pytest.fixture(scope="module")
def tiny():
    return run(load_run_config(None, [
        "hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=4"]))


def test_on_a_run_the_path_covers_every_call_and_is_as_long_as_the_run(tiny):
    rec = tiny.recorder
    path = critical_path(rec.spans)
    calls = [s for s in rec.spans if s.block == "runtime" and s.lane == "calls"]
    assert path[0].start_ps == 0 and path[-1].end_ps == calls[-1].end_ps
    for a, b in zip(path, path[1:], strict=False):  # links follow each other
        assert a.end_ps == b.start_ps
    windows = [(f"{i}", s.start_ps, s.end_ps) for i, s in enumerate(calls)]
    per_call = time_by_group(path, windows)
    for i, s in enumerate(calls):
        assert sum(per_call[f"{i}"].values()) == s.end_ps - s.start_ps
    # the launch is the weights over the host link; prefill mostly loads weights
    assert max(per_call["0"], key=per_call["0"].get) == "host link"
    assert max(per_call["1"], key=per_call["1"].get) == "DRAM → SRAM loads"
