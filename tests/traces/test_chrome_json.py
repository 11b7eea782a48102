"""The trace text written from columns is ``json.dumps`` of the trace dict, byte for byte:
on random recorders (overlapping lanes, every kind of span argument, names that need
escaping, batches cut anywhere) and on a simulated run at trace level ``tiles``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import traces.chrome as chrome
from sim.app.config import load_run_config
from sim.app.run import run
from traces.chrome import chrome_trace, chrome_trace_json, lane_tracks
from traces.recorder import Recorder


def _dumps(rec: Recorder) -> str:
    return json.dumps(chrome_trace(rec, counter_bins=16), separators=(",", ":"))


def _random_recorder(seed: int) -> Recorder:
    rng = random.Random(seed)
    rec = Recorder(level="tiles")
    lanes = [("core0", "mxu"), ("core0", "dma_in"), ("core12", "vpu"), ("dram", "ch3"),
             ("pcie", "h2d"), ("host", "runtime"), ("runtime", "calls"), ("zeta", "x")]
    names = ["GEMM", "read", "chunk", 'say "hi"\\', "größe ✓", "tab\there", ""]
    args = [None, {}, {"index": 7}, {"index": 0}, {"bytes": 4096}, {"index": True},
            {"index": 1.5}, {"first": 0, "end": 12}, {"index": -3}, {"name": "é\n"},
            {"index": 2**70}]
    for _ in range(rng.randrange(0, 200)):
        block, lane = rng.choice(lanes)
        start = rng.randrange(0, 10**7) * rng.choice((1, 1, 997, 10**6))
        end = start + rng.choice((0, 1, 999, 123_457, 10**9 + 7))
        rec.span(block, lane, rng.choice(names), start, end, detail="tiles",
                 args=rng.choice(args))
    for _ in range(rng.randrange(0, 20)):
        start = rng.randrange(0, 10**9)
        rec.moved("dram", f"ch{rng.randrange(2)}", start, start + rng.randrange(1, 10**7),
                  rng.randrange(0, 10**6))
    return rec


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("batch", [1, 7, chrome.SPAN_BATCH])
def test_the_trace_text_is_json_dumps_of_the_trace(seed, batch, monkeypatch):
    monkeypatch.setattr(chrome, "SPAN_BATCH", batch)
    rec = _random_recorder(seed)
    assert chrome_trace_json(rec, counter_bins=16) == _dumps(rec)


def test_an_empty_recorder_gives_an_empty_trace():
    rec = Recorder()
    assert chrome_trace_json(rec) == _dumps(rec) == (
        '{"traceEvents":[],"otherData":{"dropped_events":0,"trace_level":"ops"}}')


def _reference_tracks(starts: list[int], ends: list[int]) -> list[int]:
    """Tracks of one lane, one span at a time: the first track whose open spans the span
    nests in (visited by start, the longer first)."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i], i))
    stacks: list[list[int]] = []
    out = [0] * len(starts)

    def fits(stack: list[int], i: int) -> bool:
        while stack and stack[-1] <= starts[i]:
            stack.pop()
        return not stack or ends[i] <= stack[-1]

    for i in order:
        k = next((k for k, stack in enumerate(stacks) if fits(stack, i)), len(stacks))
        if k == len(stacks):
            stacks.append([])
        stacks[k].append(ends[i])
        out[i] = k
    return out


@pytest.mark.parametrize("seed", range(30))
def test_lane_tracks_nest_as_one_span_at_a_time(seed):
    rng = random.Random(seed)
    n = rng.randrange(0, 40)
    if seed % 2:  # back to back, in any recorded order: all on track 0 (the fast path)
        lengths = [rng.randrange(0, 5) for _ in range(n)]
        starts = list(np.cumsum([0, *lengths[:-1]]))[:n]
        ends = [int(s) + d for s, d in zip(starts, lengths, strict=True)]
        starts = [int(s) for s in starts]
        pick = rng.sample(range(n), n)
        starts, ends = [starts[i] for i in pick], [ends[i] for i in pick]
    else:
        starts = [rng.randrange(0, 30) for _ in range(n)]
        ends = [s + rng.randrange(0, 12) for s in starts]
    got = lane_tracks(np.array(starts, np.int64), np.array(ends, np.int64))
    want = _reference_tracks(starts, ends)
    assert got == want
    if seed % 2:
        assert got == [0] * n


def test_the_trace_text_of_a_run_at_tile_detail_is_json_dumps_of_its_trace():
    result = run(load_run_config(None, [
        "hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=2", "outputs.trace=tiles"]))
    rec = result.recorder
    kinds = {tuple(s.args) if s.args else () for s in rec.spans}
    assert {("index",), ("bytes",)} <= kinds  # instructions and chunks both written
    assert chrome_trace_json(rec, counter_bins=16) == _dumps(rec)
