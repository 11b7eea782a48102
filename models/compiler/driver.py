"""The driver: token tiles x layers, for one call and for a batched serving step alike.

A program runs a batch of sequences (``seqs``: :class:`StepSeq`, in batch order), each
``tokens`` tokens of one cache slot from cache position ``cache_size`` on. The host writes
the input embeddings (float32) of all of them first; the tokens are concatenated and go
through the layers in *token tiles* of at most ``m_tile`` tokens whose activations fit in
SRAM, so the GEMM, norm and MLP stages process every sequence of a tile at once and the
weights stream once per tile for the whole batch, while attention works per piece of a
sequence in the tile (a :class:`~.lowering.TileSeq`: its own cache slot, positions and
context). Each layer is its attention block, then its MLP block (:mod:`.blocks`); each
block is a sequence of *stages* whose outputs go to DRAM, the next stage's loads waiting
until every core's outputs are there (a barrier through flags).

- **One call** (:func:`lower_call`) is a batch of one sequence whose head reads its last
  token's hidden state directly; the host reads that token's logits. With
  ``all_logits`` (teacher forcing: the logits of every position) the call gathers every
  token's final hidden state as a serving step gathers its sampling rows, runs the LM head
  over all of them in head tiles and the host reads ``n x vocab`` logits: more head work
  and ``n`` times the bytes back over the host link (it needs the regions a step needs,
  :func:`.dram.batch_memory_map` with ``max_seqs`` >= ``n``).
- **A serving step** (:func:`lower_step`; continuous batching: some sequences decode one
  token each, some prefill a chunk of their prompt): after each tile the device's copy
  engine gathers the sampling sequences' (``logits``, default true) last hidden states
  into ``act.last`` (the next tile reuses the activation buffers); after the last tile the
  LM head runs over the gathered rows in head tiles of up to :func:`.blocks.io.head_rows`
  rows, and the host reads ``n_out x vocab`` int32 logits back. A step needs bigger host-I/O
  buffers than one call (:func:`.dram.batch_memory_map`).

``layers`` lowers only those layers (an SRAM probe, or a cost probe: the serving cost model
extrapolates the time of a full step from a few layers; not a forward pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from isa.instructions import HostRead, HostWrite, Program
from kvsim.errors import ConfigError

from .blocks.dense import DenseMlp
from .blocks.io import (
    LAST_REGION,
    LOGITS_REGION,
    gather_rows,
    head_rows,
    head_rows_of,
    stage_head,
    stage_head_rows,
    stage_input,
)
from .blocks.moe import MoeMlp
from .builder import Builder
from .calltrace import keep_trace, lookup_trace, record_trace
from .lowering import Lowering, TileSeq


class StepSeq(NamedTuple):
    """One sequence of a batched step: ``tokens`` tokens at cache positions ``cache_size
    ..`` of cache ``slot``; ``logits``: whether it samples (its last token's logits go to
    the host); ``key``: the sequence's identity for MoE routing (timing only): its token at
    position ``p`` routes by the key ``(key << 32) + p``, so that sequences at the same
    position route apart (0: by position alone, as a single-sequence call does);
    ``route``: the routing key of its first token instead (its tokens count up from it);
    ``shift``: its RoPE positions lie this far beyond its cache positions (see
    :class:`.lowering.TileSeq`)."""

    slot: int
    tokens: int
    cache_size: int
    logits: bool = True
    key: int = 0
    route: int | None = None
    shift: int = 0

    @property
    def first_route(self) -> int | None:
        if self.route is not None:
            return self.route
        return (self.key << 32) + self.cache_size if self.key else None



def tiles_of(seqs: Sequence[StepSeq], m_tile: int) -> list[tuple[TileSeq, ...]]:
    """The token tiles of a step: its sequences' tokens concatenated in batch order, cut
    every ``m_tile`` tokens; each tile lists the pieces of sequences it holds."""
    tiles: list[tuple[TileSeq, ...]] = []
    cur: list[TileSeq] = []
    fill = 0
    for s in seqs:
        done = 0
        route = s.first_route
        while done < s.tokens:
            n = min(s.tokens - done, m_tile - fill)
            cur.append(TileSeq(s.slot, s.cache_size + done, n, fill,
                               None if route is None else route + done, s.shift))
            done += n
            fill += n
            if fill == m_tile:
                tiles.append(tuple(cur))
                cur, fill = [], 0
    if cur:
        tiles.append(tuple(cur))
    return tiles



def lower_call(lw: Lowering, *, n: int, cache_size: int, slot: int = 0, host_in: int = 0,
               host_out: int = 0, name: str = "",
               layers: Sequence[int] | None = None, all_logits: bool = False,
               head: bool = True, shift: int = 0) -> Program:
    """The program of one call with ``n`` tokens at cache position ``cache_size`` (RoPE
    positions ``shift`` beyond: :class:`StepSeq`); with
    ``all_logits`` the logits of every one of its tokens go to the host (``n x vocab``
    int32, row ``i`` the logits after token ``i``), else its last token's. ``head=False``
    leaves out the head and the logits' read (an SRAM probe of the layers: the head of
    one call needs the same SRAM whatever its tokens)."""
    lw.check_call(n, cache_size, shift)
    name = name or f"forward n={n} cache_size={cache_size} slot={slot}"
    if shift:
        name += f" rope+{shift}"
    if not all_logits:
        return _lower(lw, [StepSeq(slot, n, cache_size, shift=shift)], layers=layers,
                      host_in=host_in, host_out=host_out, one_call=True, name=name, head=head)
    if not head:
        raise ConfigError("a call with all-position logits always runs its head")
    h = lw.model.hidden_size * lw.numerics.residual_bytes  # bytes per hidden state
    if LAST_REGION not in lw.mm or LOGITS_REGION not in lw.mm:
        raise ConfigError(f"a call with all-position logits needs the regions "
                          f"{LAST_REGION!r} and {LOGITS_REGION!r} (batch_memory_map)")
    if n * h > lw.mm[LAST_REGION].size:
        raise ConfigError(f"a call with all-position logits of {n} tokens: the memory map "
                          f"has room for the logits of {lw.mm[LAST_REGION].size // h}")
    return _lower(lw, [StepSeq(slot, n, cache_size, shift=shift)], layers=layers,
                  host_in=host_in, host_out=host_out, one_call=False, every_token=True,
                  name=f"{name} (all logits)")


def lower_step(lw: Lowering, seqs: Sequence[StepSeq | tuple], *,
               layers: Sequence[int] | None = None, host_in: int = 0, host_out: int = 0,
               name: str = "") -> Program:
    """The program of one batched step of ``seqs`` (see the module docstring)."""
    cfg = lw.model
    seqs = [StepSeq(*s) for s in seqs]
    if not seqs:
        raise ConfigError("a step needs at least one sequence")
    comp = lw.blocks.attention.components[0]
    for s in seqs:
        if s.tokens < 1:
            raise ConfigError(f"a sequence of a step needs at least one token, got {s.tokens}")
        if s.cache_size < 0 or s.cache_size + s.tokens > lw.cap:
            raise ConfigError(f"cache_size {s.cache_size} + {s.tokens} tokens exceed the "
                              f"cache capacity {lw.cap}")
        if s.shift:
            lw.check_call(1, s.cache_size + s.tokens - 1, s.shift)
        if lw.kv_region(s.slot, 0, comp) not in lw.mm:
            raise ConfigError(f"cache slot {s.slot} is not in the memory map")
    m_all = sum(s.tokens for s in seqs)
    if m_all > lw.max_seq:
        raise ConfigError(f"a step of {m_all} tokens exceeds the {lw.max_seq} tokens the "
                          f"input buffer holds")
    outs = [i for i, s in enumerate(seqs) if s.logits]
    if outs and (LAST_REGION not in lw.mm or LOGITS_REGION not in lw.mm):
        raise ConfigError(f"a step with logits needs the regions {LAST_REGION!r} and "
                          f"{LOGITS_REGION!r} (batch_memory_map)")
    row = cfg.hidden_size * lw.numerics.residual_bytes  # bytes per hidden state
    if outs and len(outs) * row > lw.mm[LAST_REGION].size:
        raise ConfigError(f"{len(outs)} sequences sample in this step; the memory map has "
                          f"room for {lw.mm[LAST_REGION].size // row}")
    return _lower(lw, seqs, layers=layers, host_in=host_in, host_out=host_out,
                  one_call=False, name=name or _name(seqs))


def _name(seqs: list[StepSeq]) -> str:
    dec = sum(1 for s in seqs if s.tokens == 1)
    return (f"step of {len(seqs)} sequences ({dec} decoding, "
            f"{sum(s.tokens for s in seqs)} tokens)")


def _lower(lw: Lowering, seqs: list[StepSeq], *, layers: Sequence[int] | None, host_in: int,
           host_out: int, one_call: bool, name: str, every_token: bool = False,
           head: bool = True) -> Program:
    cfg = lw.model
    tiles = tuple(tiles_of(seqs, lw.m_tile))
    layer_ids = range(cfg.num_layers) if layers is None else layers
    # a call whose blocks key by its shape alone: the last program of that shape with its
    # varying instructions re-made (:mod:`.calltrace`), or lowered and traced
    shape = (tuple((s.slot, s.tokens, s.logits) for s in seqs),
             None if layers is None else tuple(layers), host_in, host_out, one_call,
             every_token, head)
    traceable = _keys_by_shape(lw, layer_ids)
    if traceable:
        trace = lookup_trace(lw.memo, shape)
        if trace is not None:
            return trace.program(tiles, formats=lw.formats, name=name)
    b, marks = _walk(lw, seqs, tiles, layer_ids, host_in=host_in, host_out=host_out,
                     one_call=one_call, every_token=every_token, head=head,
                     trace=traceable)
    prog = Program(tuple(b.ins), formats=lw.formats, name=name, marks=marks)
    if traceable:  # (its instructions the very tuple: the next call names it as its base)
        keep_trace(lw.memo, shape, record_trace(b, prog.instructions, tiles, marks))
    return prog


def _keys_by_shape(lw: Lowering, layer_ids: Sequence[int]) -> bool:
    """Whether every block of a call keys its memo by the call's shape alone (its
    positions only as the blocks' varying arguments): the attention block says so, and
    the MLPs are those :func:`_lower_mlp` keys without the tile's positions."""
    if not getattr(lw.blocks.attention, "positions_as_args", False):
        return False
    return all(isinstance(lw.blocks.mlp(layer), DenseMlp | MoeMlp) for layer in layer_ids)


def _walk(lw: Lowering, seqs: list[StepSeq], tiles: tuple, layer_ids: Sequence[int], *,
          host_in: int, host_out: int, one_call: bool, every_token: bool, head: bool,
          trace: bool) -> tuple[Builder, tuple[tuple[str, int, int], ...]]:
    """Lower the call's blocks into a new builder (logging its top-level blocks when
    ``trace``); returns it and the layer marks."""
    cfg = lw.model
    blocks = lw.blocks
    b = Builder(lw.target)
    if trace:
        b.trace = []
    h = cfg.hidden_size
    emb = lw.mm["io.emb"].base
    m_all = sum(s.tokens for s in seqs)
    # the host I/O, input and head blocks read no position either: replayed as they are
    lw.memo.lower(b, ("host_in", host_in, emb, m_all), lambda: b.emit(
        HostWrite(src=host_in, dst=emb, nbytes=4 * m_all * h, signal=b.barrier())))
    # the tokens (global indices) whose final hidden states the head needs: each sampling
    # sequence's last one (``every_token``: every token of every sampling sequence)
    ends, t = [], 0
    for s in seqs:
        if s.logits:
            ends.extend(range(t, t + s.tokens) if every_token else (t + s.tokens - 1,))
        t += s.tokens
    xbuf = [lw.mm["act.x0"].base, lw.mm["act.x1"].base]
    cur = 0
    t0 = m = 0
    marks: list[tuple[str, int, int]] = []  # (layer, instruction range) for reports
    for segs in tiles:
        m = sum(sq.n for sq in segs)
        src, dst = emb + 4 * t0 * h, xbuf[cur]
        lw.memo.lower(b, ("input", src, dst, m),
                      lambda src=src, dst=dst, m=m: stage_input(b, lw, src, dst, m))
        for layer in layer_ids:
            first = len(b.ins)
            blocks.attention.lower(b, lw, layer, xbuf[cur], m, segs)
            _lower_mlp(b, lw, layer, xbuf[1 - cur], m, segs)
            marks.append((f"layer {layer}", first, len(b.ins)))
            cur = 1 - cur
        rows = [(j, e - t0) for j, e in enumerate(ends) if t0 <= e < t0 + m]
        if rows and not one_call:
            gather_rows(b, lw, xbuf[cur], rows)
        t0 += m
    done = b.shared("logits")
    if one_call and not head:
        return b, tuple(marks)
    if one_call:  # the head reads the last token's hidden state where it is
        x_last = xbuf[cur] + (m - 1) * h * lw.numerics.residual_bytes

        def head() -> None:
            stage_head(b, lw, x_last)
            b.emit(HostRead(src=lw.mm["io.logits"].base, dst=host_out,
                            nbytes=4 * cfg.vocab_size,
                            wait=(done,) * sum(1 for c in lw.target.cores
                                               if head_rows_of(lw, c))))

        lw.memo.lower(b, ("head", x_last, host_out), head)
        return b, tuple(marks)
    n_out = len(ends)
    if not n_out:
        return b, tuple(marks)
    per = head_rows(lw)
    logits = lw.mm[LOGITS_REGION].base
    stores = 0
    for r0 in range(0, n_out, per):
        r = min(per, n_out - r0)
        stores += stage_head_rows(b, lw, lw.mm[LAST_REGION].base
                                  + r0 * h * lw.numerics.residual_bytes, r,
                                  logits + 4 * r0 * cfg.vocab_size)
    b.emit(HostRead(src=logits, dst=host_out, nbytes=4 * n_out * cfg.vocab_size,
                    wait=(done,) * stores))
    return b, tuple(marks)


def _lower_mlp(b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
               segs: tuple[TileSeq, ...]) -> None:
    """The MLP of ``layer``, replayed from the memo when it was lowered before with the
    same arguments: a dense MLP does not read the tile's positions (``segs``), so decode
    steps and prefill tiles of one size share it, as do MoE layers (their schedule does not
    depend on the routing: blocks/moe.py); other MLPs key by them."""
    mlp = lw.blocks.mlp(layer)
    key = ("mlp", layer, x_next, m, None if isinstance(mlp, DenseMlp | MoeMlp) else segs)
    lw.memo.lower(b, key, lambda: mlp.lower(b, lw, layer, x_next, m, segs))
