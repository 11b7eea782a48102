"""Stages A0 and A of an MLA layer (:mod:`.mla`): the query path, the absorption and RoPE
of the score queries, and the cache owner's append of ``[latent | rope key]`` records."""

from __future__ import annotations

from isa.instructions import DmaStore, Engine, KvWrite, Nop, Vec, VecFunc

from ..builder import Builder, Credits, Matrix
from ..lowering import Lowering, TileSeq
from ..ops import end_stage, norm
from ..sram import SramPlan
from .mla_shape import (
    LATENT_REQUANT,
    MlaDims,
    absorbed_matrix,
    cache_owner,
    head_split,
    latent_matrix,
    mla_params,
    q_matrix,
)


def stage_q_latent(b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """A0 (models with a query latent): RMSNorm and ``q_a_proj`` row slices -> act.qa."""
    d = MlaDims.of(lw.model)
    p = f"layers.{layer}."
    mqa = lw.matrix(p + "q_a_proj", mla_params(q).q_a)
    qa = lw.mm["act.qa"].base
    for c in lw.target.cores:
        r0, r1 = lw.rows(d.qr, c)
        if r1 <= r0:
            continue
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mqa, (r0, r1))
        xs = plan.take(m * d.h, "layer input")
        b.load(c, x, xs, m * d.h, to="in_vpu")
        xn = norm(b, lw, c, plan, p + "attn_norm", q.attn_norm, xs, m, d.h, to="vpu_mxu")
        out = plan.take(m * (r1 - r0), "q_a_proj output")
        b.gemm(c, mqa, (r0, r1), a=xn, m=m, out=out, plan=plan,
               first_wait=(b.sem(c, "vpu_mxu"),), last_signal=(b.sem(c, "mxu_out"),))
        b.emit(DmaStore(core=c, src=out, dst=qa + r0, nbytes=r1 - r0, rows=m, dst_stride=d.qr,
                        wait=(b.sem(c, "mxu_out"),), signal=b.barrier()))


def stage_prep(b: Builder, lw: Lowering, layer: int, q, x: int, m: int,
                    segs: tuple[TileSeq, ...]) -> None:
    """A: query path, absorption and RoPE per head -> act.qs; the cache owner appends the
    layer's [latent | rope key] records. ``segs``: the tile's pieces of sequences, each
    with its own cache slot and positions."""
    cfg = lw.model
    d = MlaDims.of(cfg)
    p = f"layers.{layer}."
    owner = cache_owner(lw, layer)
    split_heads = head_split(lw, layer, q)
    mq = q_matrix(lw, layer, q)
    mkv = lw.matrix(p + "kv_a_proj", q.k)
    qs = lw.mm["act.qs"].base
    cregs = [lw.mm[lw.kv_region(sq.slot, layer, "c")] for sq in segs]
    cos, sin = lw.mm["rope.cos"].base, lw.mm["rope.sin"].base
    hw = d.heads * d.w  # act.qs row: every head's score query
    for c in lw.target.cores:
        heads = split_heads[c]
        own = c == owner
        if not heads and not own:
            continue
        plan = SramPlan(lw.target, c)
        if heads:  # the stage's first GEMM: the first head's q_nope rows, or kv_a_proj
            b.prefetch(c, mq, (heads[0] * d.qhd, heads[0] * d.qhd + d.nope))
        else:
            b.prefetch(c, latent_matrix(mkv), (0, d.kvr))
        in_vpu = Credits(b.sem(c, "in_vpu"))
        # inputs: the query latent (if any) first, then the normed layer input
        qin = xn = -1
        if d.qr and heads:
            qa = plan.take(m * d.qr, "q latent")
            b.load(c, lw.mm["act.qa"].base, qa, m * d.qr, to="in_vpu")
            qin = norm(b, lw, c, plan, p + "q_a_norm", mla_params(q).q_a_norm, qa, m, d.qr,
                       to="vpu_mxu")
            in_vpu.skip(2)
        if own or not d.qr:
            xs = plan.take(m * d.h, "layer input")
            b.load(c, x, xs, m * d.h, to="in_vpu")
            xn = norm(b, lw, c, plan, p + "attn_norm", q.attn_norm, xs, m, d.h, to="vpu_mxu")
            in_vpu.skip(2)
            if not d.qr:
                qin = xn
        tab = plan.take(2 * m * d.rope, "RoPE tables")
        for sq in segs:  # per sequence: [cos | sin] of its positions
            t = tab + 2 * sq.off * d.rope
            b.load(c, cos + sq.pos0 * d.rope, t, sq.n * d.rope, to="in_vpu")
            b.load(c, sin + sq.pos0 * d.rope, t + sq.n * d.rope, sq.n * d.rope, to="in_vpu")
            in_vpu.issue()
            tables = in_vpu.issue()
        # the query heads: q_nope -> absorbed latent query, q_rope -> RoPE
        nh = len(heads)
        first = (b.sem(c, "vpu_mxu"),)
        lat_q = []
        qr = plan.take(m * nh * d.rope, "rope queries") if heads else -1
        for i, hd in enumerate(heads):
            qn = plan.take(m * d.nope, f"q_nope head {hd}")
            b.gemm(c, mq, (hd * d.qhd, hd * d.qhd + d.nope), a=qin, m=m, out=qn, plan=plan,
                   first_wait=first)
            first = ()
            ql = plan.take(m * d.kvr, f"latent query head {hd}")
            b.gemm(c, absorbed_matrix(lw, layer, q, hd), (0, d.kvr), a=qn, m=m, out=ql, plan=plan,
                   last_signal=(b.sem(c, "mxu_out"),))
            lat_q.append((hd, ql))
            b.gemm_into(c, mq, (hd * d.qhd + d.nope, (hd + 1) * d.qhd), a=qin, m=m,
                        out=qr + i * d.rope, row_stride=nh * d.rope, plan=plan,
                        last_signal=(b.sem(c, "mxu_vpu"),) if i == nh - 1 else ())
        for hd, ql in lat_q:
            b.emit(DmaStore(core=c, src=ql, dst=qs + hd * d.w, nbytes=d.kvr, rows=m,
                            dst_stride=hw, wait=(b.sem(c, "mxu_out"),)))
        if heads:
            for i, sq in enumerate(segs):
                row = qr + sq.off * nh * d.rope
                b.emit(Vec(core=c, func=VecFunc.ROPE, rows=sq.n, cols=nh * d.rope, src0=row,
                           src1=tab + 2 * sq.off * d.rope, dst=row, p0=d.rope, p1=d.rope,
                           wait=((b.sem(c, "mxu_vpu"),) + in_vpu.upto(tables)) if i == 0
                           else (),
                           signal=(b.sem(c, "vpu_out"),) if i == len(segs) - 1 else ()))
            for i, hd in enumerate(heads):
                b.emit(DmaStore(core=c, src=qr + i * d.rope, dst=qs + hd * d.w + d.kvr,
                                nbytes=d.rope, rows=m, src_stride=nh * d.rope, dst_stride=hw,
                                wait=(b.sem(c, "vpu_out"),) if i == 0 else ()))
        if own:
            # the normed input's signal is still due unless the query path read it
            kv_wait = (b.sem(c, "vpu_mxu"),) if d.qr or not heads else ()
            append_latent(b, lw, layer, q, c, plan, in_vpu, kv_wait, xn, tab, tables, m,
                           segs, cregs, mkv)
        rest = in_vpu.rest()
        if rest:  # loads nobody consumed (cannot happen today): take their credits
            b.emit(Nop(core=c, on=Engine.VPU, wait=rest))
        end_stage(b, c)


def append_latent(b: Builder, lw: Lowering, layer: int, q, c: int, plan: SramPlan,
                   in_vpu: Credits, kv_wait: tuple[int, ...], xn: int, tab: int,
                   tables: int, m: int, segs: tuple[TileSeq, ...], cregs,
                   mkv: Matrix) -> None:
    """The cache owner's part of stage A: kv_a_proj, latent RMSNorm, RoPE key, KvWrite."""
    d = MlaDims.of(lw.model)
    p = f"layers.{layer}."
    gamma = plan.take(2 * d.kvr, "kv_a_norm gain")
    b.load(c, lw.mm[f"p.{p}kv_a_norm"].base, gamma, 2 * d.kvr, to="in_vpu")
    g_ticket = in_vpu.issue()
    norm = mla_params(q).kv_a_norm
    rec = plan.take(m * d.w, "cache records")
    # the latent stays int32 from the GEMM into its RMSNorm (one scale across the row, so
    # no per-channel step could absorb its outlier channels); the rope key is int8
    lat = plan.take(4 * m * d.kvr, "latent (int32)")
    b.gemm(c, latent_matrix(mkv), (0, d.kvr), a=xn, m=m, out=lat, plan=plan,
           first_wait=kv_wait)
    if m == 1:
        ln, rp = rec, rec + d.kvr
    else:
        rp = plan.take(m * d.rope, "rope key")
        ln = plan.take(m * d.kvr, "normed latent")
    b.gemm(c, mkv, (d.kvr, d.w), a=xn, m=m, out=rp, plan=plan,
           last_signal=(b.sem(c, "mxu_vpu"),))
    b.emit(Vec(core=c, func=VecFunc.RMSNORM_WIDE, rows=m, cols=d.kvr, src0=lat, src1=gamma,
               dst=lat, p0=norm.eps_q, p1=norm.shift, p2=32,
               wait=(b.sem(c, "mxu_vpu"),) + in_vpu.upto(g_ticket)))
    # the norm's gain already puts its int32 output on the latent's int8 grid
    # (mla_calib: LATENT_REQUANT): this only saturates it to int8
    b.emit(Vec(core=c, func=VecFunc.REQUANT, rows=m, cols=d.kvr, src0=lat, dst=ln,
               p0=LATENT_REQUANT[0], p1=LATENT_REQUANT[1]))
    for i, sq in enumerate(segs):
        row = rp + sq.off * d.rope
        b.emit(Vec(core=c, func=VecFunc.ROPE, rows=sq.n, cols=d.rope, src0=row,
                   src1=tab + 2 * sq.off * d.rope, dst=row, p0=d.rope, p1=d.rope,
                   wait=in_vpu.upto(tables) if i == 0 else (),
                   signal=(b.sem(c, "vpu_out"),) if m > 1 and i == len(segs) - 1 else ()))
    if m > 1:  # join [latent | rope key] into token records through DRAM
        kv = lw.mm["act.kv"].base
        b.emit(DmaStore(core=c, src=ln, dst=kv, nbytes=d.kvr, rows=m, dst_stride=d.w,
                        wait=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=rp, dst=kv + d.kvr, nbytes=d.rope, rows=m,
                        dst_stride=d.w, signal=(b.sem(c, "out_in"),)))
        b.load(c, kv, rec, m * d.w, to="in_vpu", wait=(b.sem(c, "out_in"),))
        ticket = in_vpu.issue()
    else:
        ticket = 0
    for i, (sq, creg) in enumerate(zip(segs, cregs, strict=True)):
        b.emit(KvWrite(core=c, fmt=0, tokens=sq.n, width=d.w, pos=sq.pos0, cap=lw.cap,
                       src=rec + sq.off * d.w, dst=creg.base, nbytes=creg.size,
                       wait=in_vpu.upto(ticket) if i == 0 else ()))

