"""Lowering one *batched step* of a serving engine (continuous batching) to an ISA program.

A step runs several sequences at once: some decode one token each at their own cache
positions, some prefill a chunk of their prompt (``seqs``: ``(slot, tokens, cache_size)``
each, in batch order). The tokens of all sequences are concatenated and go through the
layers in token tiles of at most ``m_tile`` tokens, as :func:`.lower.lower_forward` runs
one sequence's tokens: so the GEMM, norm and MLP stages process ``m`` = the tile's tokens
of every sequence at once and the weights stream once per tile for the whole batch, while
the attention stages work per sequence of the tile (a :class:`.lower.TileSeq`: its own
cache slot region, positions and context). The stages are lower.py's and lower_mla.py's
own (their ``segs`` parameter); MLA tiles of more than one sequence attend with
:func:`_stage_mla_attend_batch` (below), MoE tiles route each token by its sequence's key
and position (:attr:`StepSeq.key`, :func:`.lower_mla.tile_keys`).

A sequence that samples in this step (``logits``, default true: a decode step or the last
chunk of a prompt) needs the logits of its last token. After each tile the device's copy
engine gathers those tokens' final hidden states into ``act.last`` (the next tile reuses
the activation buffers); after the last tile the LM head runs over the gathered rows in
head tiles of up to :func:`head_rows` rows, its weights streamed once per head tile and
every weight tile's logits stored at once (a batch's logits do not fit SRAM), and the host
reads ``n_out x vocab`` float32 logits back.

A batched step needs bigger host-I/O buffers than one call: :func:`batch_memory_map` builds
the compiled model's memory map with an input buffer for ``max_tokens`` tokens and adds
``act.last`` and ``io.logits.batch`` for ``max_seqs`` sequences.

``layers`` lowers only those layers (a cost probe: the serving cost model extrapolates the
time of a full step from a few layers; not a forward pass). Timing only (the MLA/MoE
stages are timing-only; a GQA step is not checked functionally either).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from isa.errors import ConfigError
from isa.instructions import (
    NO_ADDR,
    Attn,
    DmaCopy,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Nop,
    Program,
)

from .lower import (
    _SEMS,
    LOGITS_DONE,
    Lowering,
    Matrix,
    SramOverflow,
    SramPlan,
    TileSeq,
    _norm,
    _rows,
    _stage_attention,
    _stage_input,
    _stage_mlp_down,
    _stage_mlp_up,
    _stage_o,
    split,
)
from .lower_mla import (
    _MLA_SEMS,
    _SEMS_PER_CORE,
    MlaBuilder,
    _attn_groups,
    _Dims,
    _stage_mla_attend,
    _stage_mla_o,
    _stage_mla_prep,
    _stage_moe_combine,
    _stage_moe_experts,
    _stage_q_latent,
    cache_owner,
    mla_attention_bytes,
    tile_keys,
)
from .memmap import MemoryMap

#: Copy engine <- every core's DMA_OUT: a tile's final hidden states are stored.
ROWS_STORED = 2
#: Semaphores this lowering adds to each core's set (after lower.py's and lower_mla.py's).
_BATCH_SEMS = ("out_mxu",)  # DMA_OUT -> MXU: a logits output buffer is free again
#: Regions a batched step needs beside the compiled model's.
LAST_REGION = "act.last"
LOGITS_REGION = "io.logits.batch"


class StepSeq(NamedTuple):
    """One sequence of a batched step: ``tokens`` tokens at cache positions ``cache_size
    ..`` of cache ``slot``; ``logits``: whether it samples (its last token's logits go to
    the host); ``key``: the sequence's identity for MoE routing (timing only): its token at
    position ``p`` routes by the key ``(key << 32) + p``, so that sequences at the same
    position route apart (0: by position alone, as a single-sequence call does);
    ``route``: the routing key of its first token instead (its tokens count up from it)."""

    slot: int
    tokens: int
    cache_size: int
    logits: bool = True
    key: int = 0
    route: int | None = None

    @property
    def first_route(self) -> int | None:
        if self.route is not None:
            return self.route
        return (self.key << 32) + self.cache_size if self.key else None


class BatchBuilder(MlaBuilder):
    """:class:`.lower_mla.MlaBuilder` with the batched head's semaphore."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(_SEMS) + len(_MLA_SEMS) + len(_BATCH_SEMS) > _SEMS_PER_CORE:
            raise AssertionError("too many semaphores per core")
        for c in self.target.cores:  # after the core's lower.py and lower_mla.py semaphores
            base = self.sem(c, _SEMS[0]) + len(_SEMS) + len(_MLA_SEMS)
            for j, name in enumerate(_BATCH_SEMS):
                self._ids[(c, name)] = base + j


def batch_memory_map(build, *, max_tokens: int, max_seqs: int, hidden: int,
                     vocab: int) -> MemoryMap:
    """``build(max_seq)`` (the compiler's memory map for calls of up to ``max_seq``
    tokens) with ``max_tokens`` tokens of input, plus the gathered hidden states and the
    logits of ``max_seqs`` sequences."""
    mm = build(max_tokens)
    mm.add(LAST_REGION, max_seqs * hidden, "activations")
    mm.add(LOGITS_REGION, 4 * max_seqs * vocab, "host_io")
    return mm


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
                               None if route is None else route + done))
            done += n
            fill += n
            if fill == m_tile:
                tiles.append(tuple(cur))
                cur, fill = [], 0
    if cur:
        tiles.append(tuple(cur))
    return tiles


def head_rows(lw: Lowering) -> int:
    """Rows per head tile: the most whose input, normed rows and two logits buffers fit a
    core's SRAM beside the weight tile buffers."""
    cfg = lw.model
    h = cfg.hidden_size
    mh = lw.matrix(cfg.lm_head_tensor, lw.numerics.head, requant=False)
    step = lw.target.tile_bytes // mh.row_bytes
    free = lw.target.sram_bytes - 2 * lw.target.tile_bytes - 2 * h - 4 * 64
    per_row = 2 * h + 2 * 4 * step
    return max(1, free // per_row)


def lower_step(lw: Lowering, seqs: Sequence[StepSeq | tuple], *,
               layers: Sequence[int] | None = None, host_in: int = 0, host_out: int = 0,
               name: str = "") -> Program:
    """The program of one batched step of ``seqs`` (see the module docstring)."""
    cfg = lw.model
    seqs = [StepSeq(*s) for s in seqs]
    if not seqs:
        raise ConfigError("a step needs at least one sequence")
    for s in seqs:
        if s.tokens < 1:
            raise ConfigError(f"a sequence of a step needs at least one token, got {s.tokens}")
        if s.cache_size < 0 or s.cache_size + s.tokens > lw.cap:
            raise ConfigError(f"cache_size {s.cache_size} + {s.tokens} tokens exceed the "
                              f"cache capacity {lw.cap}")
        if lw.kv_region(s.slot, 0, "c" if cfg.is_mla else "k") not in lw.mm:
            raise ConfigError(f"cache slot {s.slot} is not in the memory map")
    m_all = sum(s.tokens for s in seqs)
    if m_all > lw.max_seq:
        raise ConfigError(f"a step of {m_all} tokens exceeds the {lw.max_seq} tokens the "
                          f"input buffer holds")
    outs = [i for i, s in enumerate(seqs) if s.logits]
    if outs and (LAST_REGION not in lw.mm or LOGITS_REGION not in lw.mm):
        raise ConfigError(f"a step with logits needs the regions {LAST_REGION!r} and "
                          f"{LOGITS_REGION!r} (batch_memory_map)")
    if outs and len(outs) * cfg.hidden_size > lw.mm[LAST_REGION].size:
        raise ConfigError(f"{len(outs)} sequences sample in this step; the memory map has "
                          f"room for {lw.mm[LAST_REGION].size // cfg.hidden_size}")
    b = BatchBuilder(lw.target)
    h = cfg.hidden_size
    emb = lw.mm["io.emb"].base
    b.emit(HostWrite(src=host_in, dst=emb, nbytes=4 * m_all * h, signal=b.barrier()))
    # the token (global index) whose final hidden state each sampling sequence needs
    ends, t = [], 0
    for s in seqs:
        t += s.tokens
        if s.logits:
            ends.append(t - 1)
    xbuf = [lw.mm["act.x0"].base, lw.mm["act.x1"].base]
    cur = 0
    t0 = 0
    layer_ids = range(cfg.num_layers) if layers is None else layers
    for segs in tiles_of(seqs, lw.m_tile):
        m = sum(sq.n for sq in segs)
        _stage_input(b, lw, emb + 4 * t0 * h, xbuf[cur], m)
        for layer in layer_ids:
            q = lw.numerics.layers[layer]
            if cfg.is_mla:
                _mla_layer(b, lw, layer, q, xbuf[cur], xbuf[1 - cur], m, segs)
            else:
                one = segs if len(segs) > 1 else None
                _stage_attention(b, lw, layer, q, xbuf[cur], m, segs[0].pos0, segs[0].slot,
                                 one)
                _stage_o(b, lw, layer, q, xbuf[cur], m)
                _stage_mlp_up(b, lw, layer, q, m)
                _stage_mlp_down(b, lw, layer, q, xbuf[1 - cur], m)
            cur = 1 - cur
        rows = [(j, e - t0) for j, e in enumerate(ends) if t0 <= e < t0 + m]
        if rows:
            _gather_rows(b, lw, xbuf[cur], rows)
        t0 += m
    if not outs:
        return Program(tuple(b.ins), formats=lw.formats, name=name or _name(seqs))
    n_out = len(outs)
    per = head_rows(lw)
    logits = lw.mm[LOGITS_REGION].base
    stores = 0
    for r0 in range(0, n_out, per):
        r = min(per, n_out - r0)
        stores += _stage_head_rows(b, lw, lw.mm[LAST_REGION].base + r0 * h, r,
                                   logits + 4 * r0 * cfg.vocab_size)
    b.emit(HostRead(src=logits, dst=host_out, nbytes=4 * n_out * cfg.vocab_size,
                    wait=(LOGITS_DONE,) * stores))
    return Program(tuple(b.ins), formats=lw.formats, name=name or _name(seqs))


def _name(seqs: list[StepSeq]) -> str:
    dec = sum(1 for s in seqs if s.tokens == 1)
    return (f"step of {len(seqs)} sequences ({dec} decoding, "
            f"{sum(s.tokens for s in seqs)} tokens)")


def _mla_layer(b: BatchBuilder, lw: Lowering, layer: int, q, x: int, x_next: int, m: int,
               segs: tuple[TileSeq, ...]) -> None:
    cfg = lw.model
    one = len(segs) == 1
    s0 = segs[0]
    if cfg.q_lora_rank:
        _stage_q_latent(b, lw, layer, q, x, m)
    _stage_mla_prep(b, lw, layer, q, x, m, s0.pos0, s0.slot, None if one else segs)
    if one:
        _stage_mla_attend(b, lw, layer, q, m, s0.pos0, s0.slot)
    else:
        _stage_mla_attend_batch(b, lw, layer, q, m, segs)
    _stage_mla_o(b, lw, layer, q, x, m)
    keys = None if one and s0.route is None else tile_keys(segs)
    if cfg.layer_is_moe(layer):
        _stage_moe_experts(b, lw, layer, q, m, s0.pos0, keys)
        _stage_moe_combine(b, lw, layer, q, x_next, m, s0.pos0, keys)
    else:
        _stage_mlp_up(b, lw, layer, q, m)
        _stage_mlp_down(b, lw, layer, q, x_next, m)


def _gather_rows(b: BatchBuilder, lw: Lowering, x: int, rows: list[tuple[int, int]]) -> None:
    """Copy tile rows ``(out index, row)`` of ``x`` (the tile's final hidden states) to
    ``act.last``, after every core's stores of the tile; every core's next load waits for
    the copies (the next tile overwrites ``x``)."""
    h = lw.model.hidden_size
    last = lw.mm[LAST_REGION].base
    # the cores whose stores wrote x: its column slices (stage E, or the input stage)
    writers = [c for c in lw.target.cores if _rows(lw, h, c)[1] > _rows(lw, h, c)[0]]
    for c in writers:
        b.emit(Nop(core=c, on=Engine.DMA_OUT, signal=(ROWS_STORED,)))
    runs: list[list[int]] = []  # [out index, row, count]
    for j, r in rows:
        if runs and runs[-1][0] + runs[-1][2] == j and runs[-1][1] + runs[-1][2] == r:
            runs[-1][2] += 1
        else:
            runs.append([j, r, 1])
    for i, (j, r, n) in enumerate(runs):
        b.emit(DmaCopy(src=x + r * h, dst=last + j * h, nbytes=n * h,
                       wait=(ROWS_STORED,) * len(writers) if i == 0 else (),
                       signal=b.barrier() if i == len(runs) - 1 else ()))


def _stage_head_rows(b: BatchBuilder, lw: Lowering, x: int, r: int, out: int) -> int:
    """Final RMSNorm of ``r`` gathered rows at ``x`` and the LM head (int32 logits) ->
    ``out`` (``r`` rows of ``vocab``), each weight tile's logits stored as it is done;
    returns how many stores signal :data:`LOGITS_DONE`."""
    cfg = lw.model
    h, vocab = cfg.hidden_size, cfg.vocab_size
    mh = lw.matrix(cfg.lm_head_tensor, lw.numerics.head, requant=False)
    t = lw.target
    done_stores = 0
    for c in t.cores:
        r0, r1 = _rows(lw, vocab, c)
        if r1 <= r0:
            continue
        plan = SramPlan(t, c)
        b.prefetch(c, mh, (r0, r1))
        xs = plan.take(r * h, "last hidden states")
        b.load(c, x, xs, r * h, to="in_vpu")
        xn = _norm(b, lw, c, plan, "final_norm", lw.numerics.final_norm, xs, r, h,
                   to="vpu_mxu")
        tiles = b._tiles(mh, (r0, r1))
        step = t.tile_bytes // mh.row_bytes
        obuf = [plan.take(4 * r * step, "logits tile"), plan.take(4 * r * step, "logits tile")]
        done = b.prefetched.pop((c, mh.name, (r0, r1)), 0)
        first_buf = (b.tiles[c] - done) % 2
        for i, (lo, hi) in enumerate(tiles):
            buf = (first_buf + i) % 2 if i < done else b._tile_load(c, mh, lo, hi)
            wait = (b.sem(c, f"ld{buf}"),)
            if i == 0:
                wait += (b.sem(c, "vpu_mxu"),)
            if i >= 2:
                wait += (b.sem(c, "out_mxu"),)
            b.emit(Gemm(core=c, m=r, k=mh.k, n=hi - lo, w_bits=mh.bits, a=xn,
                        w=buf * t.tile_bytes, out=obuf[i % 2], bias=NO_ADDR, scale=NO_ADDR,
                        shift=mh.shift, out_stride=4 * (hi - lo) if r > 1 else 0, wait=wait,
                        signal=(b.sem(c, f"free{buf}"), b.sem(c, "mxu_out"))))
            last = i == len(tiles) - 1
            b.emit(DmaStore(core=c, src=obuf[i % 2], dst=out + 4 * lo, nbytes=4 * (hi - lo),
                            rows=r, dst_stride=4 * vocab, wait=(b.sem(c, "mxu_out"),),
                            signal=(b.sem(c, "out_mxu"),) + ((LOGITS_DONE,) if last else ())))
        # the last two stores' credits: taken here, so the next head tile starts afresh
        b.emit(Nop(core=c, on=Engine.MXU, wait=(b.sem(c, "out_mxu"),) * min(2, len(tiles))))
        done_stores += 1
    return done_stores


def _stage_mla_attend_batch(b: BatchBuilder, lw: Lowering, layer: int, q, m: int,
                            segs: tuple[TileSeq, ...]) -> None:
    """B for a tile of several sequences, in two parts with a barrier between:

    1. attention: a decoding sequence (one token) attends on one core with every head,
       so its cache is streamed once (the sequences go round the cores from the layer's
       cache owner); a prefill piece splits its heads over the cores as a single
       sequence's prefill tile does. Outputs -> ``act.lat``.
    2. ``v_b_proj`` per head over all ``m`` rows of the tile (its weights streamed once per
       tile, not once per sequence), heads split over the cores -> ``act.ao``.
    """
    d = _Dims.of(lw.model)
    p = f"layers.{layer}."
    cores = lw.target.cores
    qs = lw.mm["act.qs"].base
    ao = lw.mm["act.ao"].base
    lat = lw.mm["act.lat"].base
    mvb = lw.matrix(p + "v_b_proj", q.v)
    hw = d.heads * d.w
    work: dict[int, list[tuple[TileSeq, int, int]]] = {c: [] for c in cores}
    start = cores.index(cache_owner(lw, layer))
    k = 0
    for sq in segs:
        if sq.n == 1:
            work[cores[(start + k) % len(cores)]].append((sq, 0, d.heads))
            k += 1
        else:
            for c, ha, hb in _attn_groups(lw, layer, sq.n):
                work[c].append((sq, ha, hb))
    for c in cores:
        items = work[c]
        if not items:
            continue
        plan = SramPlan(lw.target, c)
        for i, (sq, ha, hb) in enumerate(items):
            gh = hb - ha
            creg = lw.mm[lw.kv_region(sq.slot, layer, "c")]
            ctx = sq.pos0 + sq.n
            kn, vn = mla_attention_bytes(lw.k_fmt, ctx, d.w)
            qb = plan.take(sq.n * gh * d.w, f"score queries heads {ha}..{hb - 1}")
            b.load(c, qs + sq.off * hw + ha * d.w, qb, gh * d.w, rows=sq.n, src_stride=hw,
                   to="in_mxu")
            ob = plan.take(sq.n * gh * d.w, f"attention output heads {ha}..{hb - 1}")
            b.emit(Attn(core=c, q_len=sq.n, ctx=ctx, heads=gh, kv_heads=1, head_dim=d.w,
                        pos=sq.pos0, cap=lw.cap, k_fmt=0, v_fmt=0, q=qb, k=creg.base,
                        v=creg.base + kn, out=ob, k_nbytes=kn, v_nbytes=vn,
                        score_mult=q.attn.score_mult, score_shift=q.attn.score_shift,
                        out_mult=q.attn.out_mult, out_shift=q.attn.out_shift,
                        wait=(b.sem(c, "in_mxu"),), signal=(b.sem(c, "mxu_out"),)))
            b.emit(DmaStore(core=c, src=ob, dst=lat + sq.off * hw + ha * d.w,
                            nbytes=gh * d.w, rows=sq.n, dst_stride=hw,
                            wait=(b.sem(c, "mxu_out"),),
                            signal=b.barrier() if i == len(items) - 1 else ()))
    # part 2: the value up-projection over the whole tile
    for c, (ha, hb) in zip(cores, split(d.heads, len(cores)), strict=True):
        gh = hb - ha
        if gh <= 0:
            continue
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mvb, (ha * d.v, (ha + 1) * d.v))
        vo = plan.take(m * gh * d.v, "value heads")
        for i, hd in enumerate(range(ha, hb)):
            last = (b.sem(c, "mxu_out"),) if i == gh - 1 else ()
            lb = plan.take(m * d.kvr, f"latent head {hd}")
            b.load(c, lat + hd * d.w, lb, d.kvr, rows=m, src_stride=hw, to="in_mxu")
            b.gemm_into(c, mvb, (hd * d.v, (hd + 1) * d.v), a=lb, m=m, out=vo + i * d.v,
                        row_stride=gh * d.v, plan=plan, first_wait=(b.sem(c, "in_mxu"),),
                        last_signal=last)
        b.emit(DmaStore(core=c, src=vo, dst=ao + ha * d.v, nbytes=gh * d.v, rows=m,
                        dst_stride=d.heads * d.v, wait=(b.sem(c, "mxu_out"),),
                        signal=b.barrier()))


__all__ = ["StepSeq", "lower_step", "tiles_of", "head_rows", "batch_memory_map",
           "SramOverflow", "Matrix"]
