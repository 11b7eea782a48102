"""Stages B and C of an MLA layer (:mod:`.mla`): attention over the latent cache, the
value up-projection per head, the output projection and the residual add."""

from __future__ import annotations

from isa.instructions import Attn, DmaStore

from ..builder import Builder, split
from ..lowering import Lowering, TileSeq
from ..ops import proj_residual
from ..sram import SramPlan
from .mla_shape import MlaDims, attn_groups, cache_owner, mla_attention_bytes


def stage_attend(b: Builder, lw: Lowering, layer: int, q, m: int, pos0: int,
                      slot: int) -> None:
    """B: attention over the latent cache, then v_b_proj per head -> act.ao."""
    d = MlaDims.of(lw.model)
    p = f"layers.{layer}."
    qs = lw.mm["act.qs"].base
    ao = lw.mm["act.ao"].base
    lat = lw.mm["act.lat"].base
    creg = lw.mm[lw.kv_region(slot, layer, "c")]
    mvb = lw.matrix(p + "v_b_proj", q.v)
    ctx = pos0 + m
    kn, vn = mla_attention_bytes(lw.k_fmt, ctx, d.w)
    hw = d.heads * d.w
    for c, ha, hb in attn_groups(lw, layer, m):
        gh = hb - ha
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mvb, (ha * d.v, (ha + 1) * d.v))
        qb = plan.take(m * gh * d.w, f"score queries heads {ha}..{hb - 1}")
        b.load(c, qs + ha * d.w, qb, gh * d.w, rows=m, src_stride=hw, to="in_mxu")
        ob = plan.take(m * gh * d.w, f"attention output heads {ha}..{hb - 1}")
        b.emit(Attn(core=c, q_len=m, ctx=ctx, heads=gh, kv_heads=1, head_dim=d.w, pos=pos0,
                    cap=lw.cap, k_fmt=0, v_fmt=0, q=qb, k=creg.base, v=creg.base + kn,
                    out=ob, k_nbytes=kn, v_nbytes=vn,
                    score_mult=q.attn.score_mult, score_shift=q.attn.score_shift,
                    out_mult=q.attn.out_mult, out_shift=q.attn.out_shift,
                    wait=(b.sem(c, "in_mxu"),),
                    signal=(b.sem(c, "mxu_out"),) if m > 1 else ()))
        vo = plan.take(m * gh * d.v, "value heads")
        if m > 1:  # gather each head's latent rows through DRAM
            b.emit(DmaStore(core=c, src=ob, dst=lat + ha * d.w, nbytes=gh * d.w, rows=m,
                            dst_stride=hw, wait=(b.sem(c, "mxu_out"),),
                            signal=(b.sem(c, "out_in"),)))
        for i, hd in enumerate(range(ha, hb)):
            last = (b.sem(c, "mxu_out"),) if i == gh - 1 else ()
            rows = (hd * d.v, (hd + 1) * d.v)
            if m == 1:
                b.gemm(c, mvb, rows, a=ob + i * d.w, m=1, out=vo + i * d.v, plan=plan,
                       last_signal=last)
                continue
            lb = plan.take(m * d.kvr, f"latent head {hd}")
            b.load(c, lat + hd * d.w, lb, d.kvr, rows=m, src_stride=hw, to="in_mxu",
                   wait=(b.sem(c, "out_in"),) if i == 0 else ())
            b.gemm_into(c, mvb, rows, a=lb, m=m, out=vo + i * d.v, row_stride=gh * d.v,
                        plan=plan, first_wait=(b.sem(c, "in_mxu"),), last_signal=last)
        b.emit(DmaStore(core=c, src=vo, dst=ao + ha * d.v, nbytes=gh * d.v, rows=m,
                        dst_stride=d.heads * d.v, wait=(b.sem(c, "mxu_out"),),
                        signal=b.barrier()))


def stage_o(b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """C: o_proj slice (num_heads * v_head_dim inputs) + residual add -> act.xm."""
    d = MlaDims.of(lw.model)
    proj_residual(b, lw, lw.matrix(f"layers.{layer}.o_proj", q.o), q.add1, m=m,
                   src=lw.mm["act.ao"].base, k=d.heads * d.v, resid=x,
                   dst=lw.mm["act.xm"].base, what=("value heads", "o_proj"))


def stage_attend_batch(b: Builder, lw: Lowering, layer: int, q, m: int,
                            segs: tuple[TileSeq, ...]) -> None:
    """B for a tile of several sequences, in two parts with a barrier between:

    1. attention: a decoding sequence (one token) attends on one core with every head,
       so its cache is streamed once (the sequences go round the cores from the layer's
       cache owner); a prefill piece splits its heads over the cores as a single
       sequence's prefill tile does. Outputs -> ``act.lat``.
    2. ``v_b_proj`` per head over all ``m`` rows of the tile (its weights streamed once per
       tile, not once per sequence), heads split over the cores -> ``act.ao``.
    """
    d = MlaDims.of(lw.model)
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
            for c, ha, hb in attn_groups(lw, layer, sq.n):
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

