"""The recorder's calls the array loop logged, replayed in order
(:mod:`sim.device.engine.array` hands over each batch of the loop's logs).

The loop logs what the processes would have told the recorder (instruction spans, DRAM
bursts, link chunks, DMA chunks: ``loopdefs.LOG_*``); :func:`replay` makes the same calls
in the same order, in batches where the recorder's event limit cannot make order matter.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter

import numpy as np

from sim.device.components.dma import DIRECTIONS as _DIRECTIONS
from sim.device.engine import loopdefs as pl
from traces.recorder import Span

#: Log rows below which a batch whose order matters is replayed one call per row rather
#: than in halves (a choice of this module: halving costs a check per half).
REPLAY_EACH_ROWS = 1 << 10
#: ``Span(*fields)`` from a tuple of all six fields, without the generated ``__new__``'s
#: Python frame (``tuple.__new__(Span, fields)``)
_new_span = tuple.__new__
_MNEMONIC = attrgetter("mnemonic")


def replay(rec, logs: np.ndarray, names, instrs, res, link_block: str) -> None:
    """The recorder's calls the loop logged, in order. When nothing can be dropped at the
    event limit (so order cannot matter to it), the bytes moved go in one batch
    (``Recorder.moved_many``: the same bins) and the spans at once (level ``ops``) or one
    call each; otherwise each half of the rows in turn, the same way."""
    code = logs[:, 0]
    is_move = (code == pl.LOG_DRAM) | (code == pl.LOG_LINK)
    moves = np.flatnonzero(is_move)
    if not rec.can_take(len(logs), logs[moves, 2], logs[moves, 3]):
        # order matters somewhere in the batch (the event limit): its halves in turn, each
        # replayed at once where its order cannot matter, down to one call per row
        if len(logs) <= REPLAY_EACH_ROWS:
            _replay_each(rec, logs.tolist(), names, instrs, res, link_block)
        else:
            half = len(logs) // 2
            replay(rec, logs[:half], names, instrs, res, link_block)
            replay(rec, logs[half:], names, instrs, res, link_block)
        return
    tiles = rec.wants("tiles")
    span = rec.span
    if not tiles:  # the rows of detail "tiles" are no-ops: the instruction spans at once
        _add_instruction_spans(rec, logs[code == pl.LOG_INS], names, instrs)
        rows = logs[:0]
    else:
        rows = logs
    if rec.full():
        # full and staying full (``can_take``): every span is dropped, one count each; of
        # the rows only instruction spans are of detail "ops", the rest are "tiles"
        ins = int((rows[:, 0] == pl.LOG_INS).sum())
        rec.drop((ins if rec.wants("ops") else 0) + (len(rows) - ins if tiles else 0))
        rows = rows[:0]
    for code_, a, b, c, d, e in rows.tolist():
        if code_ == pl.LOG_INS:
            block, lane = names[a]
            span(block, lane, instrs[b].mnemonic, c, d, args={"index": b})
        elif code_ == pl.LOG_DRAM:
            span("dram", f"ch{a}", "write" if e else "read", b, c, detail="tiles",
                 args={"bytes": d})
        elif code_ == pl.LOG_LINK:
            span(link_block, "h2d" if a == 0 else "d2h", "chunk", b, c, detail="tiles",
                 args={"bytes": d})
        else:
            r = res[a]
            span(r.block, r.lane, f"{_DIRECTIONS[b]} chunk", c, d, detail="tiles",
                 args={"bytes": e})
    if not len(moves):
        return
    m = logs[moves]
    dram = m[:, 0] == pl.LOG_DRAM
    channels = int(m[dram, 1].max(initial=-1)) + 1
    tracks = [("dram", f"ch{c}") for c in range(channels)] + [(link_block, "h2d"),
                                                               (link_block, "d2h")]
    track_of = np.where(dram, m[:, 1], channels + m[:, 1])
    rec.moved_many(tracks, track_of, m[:, 2], m[:, 3], m[:, 4])


def _add_instruction_spans(rec, rows: np.ndarray, names, instrs) -> None:
    """``rec.span`` of each instruction row in turn, in one ``Recorder.add_spans``: the
    spans built in C-level maps, only as many as the recorder has room for (the rest
    counted as dropped, as those calls would)."""
    if not rec.wants("ops") or not len(rows):
        return
    total = len(rows)
    rows = rows[:min(total, rec.room())]
    queue, index = rows[:, 1], rows[:, 2].tolist()
    blocks = np.array([b for b, _ in names], object)[queue].tolist()
    lanes = np.array([lane for _, lane in names], object)[queue].tolist()
    mnemonics = list(map(_MNEMONIC, map(instrs.__getitem__, index)))
    args = [{"index": i} for i in index]
    spans = list(map(_new_span, repeat(Span), zip(blocks, lanes, mnemonics,
                                                   rows[:, 3].tolist(), rows[:, 4].tolist(),
                                                   args, strict=True)))
    rec.add_spans(spans)
    if total > len(rows):
        rec.drop(total - len(rows))


def _replay_each(rec, logs: list[list[int]], names, instrs, res, link_block: str) -> None:
    tiles = rec.wants("tiles")
    span = rec.span
    moved = rec.moved
    lanes = {}
    for code, a, b, c, d, e in logs:
        if code == pl.LOG_INS:
            block, lane = names[a]
            span(block, lane, instrs[b].mnemonic, c, d, args={"index": b})
        elif code == pl.LOG_DRAM:
            lane = lanes.get(a)
            if lane is None:
                lane = lanes[a] = f"ch{a}"
            moved("dram", lane, b, c, d)
            if tiles:
                span("dram", lane, "write" if e else "read", b, c, detail="tiles",
                     args={"bytes": d})
        elif code == pl.LOG_LINK:
            direction = "h2d" if a == 0 else "d2h"
            moved(link_block, direction, b, c, d)
            span(link_block, direction, "chunk", b, c, detail="tiles", args={"bytes": d})
        else:
            r = res[a]
            span(r.block, r.lane, f"{_DIRECTIONS[b]} chunk", c, d, detail="tiles",
                 args={"bytes": e})
