"""The shared numerics emit-helpers every block uses: RMSNorm, GEMM + requantization +
residual add, the end of a stage. A change of the integer pipeline (a wider residual
stream, per-token dynamic scales, group-wise weights) is local to this module and the
blocks' own stages."""

from __future__ import annotations

from isa.instructions import NO_ADDR, DmaStore, Engine, Nop, Vec, VecFunc
from isa.vecfuncs import ROW_META_BYTES

from .builder import Builder, split
from .lowering import Lowering
from .sram import SramPlan


def residual_bytes(lw: Lowering) -> int:
    """Bytes per value of the residual stream (1 for the int8 scheme, 2 or 4 wide)."""
    return lw.numerics.residual_bytes


def row_meta(lw: Lowering, buf: int, m: int, width: int) -> int:
    """The per-row factors after a per-token int8 tensor of ``m x width`` at ``buf`` (the
    wide pipeline's QUANT_ROW layout), or NO_ADDR for the int8 scheme's static tensors."""
    return buf + m * width if lw.numerics.wide else NO_ADDR


def norm(b: Builder, lw: Lowering, c: int, plan: SramPlan, norm: str, nq, x: int, m: int,
         width: int, *, to: str) -> int:
    """Load the gain of ``norm`` and RMS-normalise ``x`` (already loaded, signalled on
    in_vpu) into a new buffer (LayerNorm for ``norm_kind = "layer"``); the VPU signals
    ``to``. Wide pipeline: RMSNORM_WIDE (LAYERNORM_WIDE) of the int16/int32 rows into
    int32, then QUANT_ROW into int8 with per-row factors (:func:`row_meta`)."""
    gamma = plan.take(2 * width, f"{norm} gain")
    b.load(c, lw.mm[f"p.{norm}"].base, gamma, 2 * width, to="in_vpu")
    if lw.numerics.wide:
        layer = lw.model.norm_kind == "layer"  # LayerNorm models (Cohere): LAYERNORM_WIDE
        if lw.lean and not layer:  # fused: the int32 rows stay in the vector unit
            out = plan.take(m * width + ROW_META_BYTES * m, f"{norm} output")
            b.emit(Vec(core=c, func=VecFunc.RMSNORM_QUANT, rows=m, cols=width, src0=x,
                       src1=gamma, dst=out, p0=nq.eps_q, p1=nq.shift,
                       p2=lw.numerics.residual_bits, wait=(b.sem(c, "in_vpu"),) * 2,
                       signal=(b.sem(c, to),)))
            return out
        wide = plan.take(4 * m * width, f"{norm} int32 output")
        b.emit(Vec(core=c, func=VecFunc.LAYERNORM_WIDE if layer else VecFunc.RMSNORM_WIDE,
                   rows=m, cols=width, src0=x, src1=gamma,
                   dst=wide, p0=nq.eps_q, p1=nq.shift, p2=lw.numerics.residual_bits,
                   p3=int(layer and lw.numerics.rotated), wait=(b.sem(c, "in_vpu"),) * 2))
        out = plan.take(m * width + ROW_META_BYTES * m, f"{norm} output")
        b.emit(Vec(core=c, func=VecFunc.QUANT_ROW, rows=m, cols=width, src0=wide, dst=out,
                   signal=(b.sem(c, to),)))
        return out
    out = plan.take(m * width, f"{norm} output")
    func = VecFunc.LAYERNORM if lw.model.norm_kind == "layer" else VecFunc.RMSNORM
    b.emit(Vec(core=c, func=func, rows=m, cols=width, src0=x, src1=gamma, dst=out,
               p0=nq.eps_q, p1=nq.shift, wait=(b.sem(c, "in_vpu"),) * 2,
               signal=(b.sem(c, to),)))
    return out


def unnormed(b: Builder, lw: Lowering, c: int, plan: SramPlan, x: int, m: int, width: int,
             *, to: str, what: str) -> int:
    """The input of projections that read the residual stream without a norm (EXAONE-4.0's
    post-norm blocks), ``x`` loaded and signalled on in_vpu; the VPU signals ``to``. The
    int8 scheme: ``x`` as it is (a VPU no-op). Wide pipeline: QUANT_ROW_WIDE of the
    int16/int32 rows into int8 with per-row factors (:func:`row_meta`)."""
    if lw.numerics.wide:
        out = plan.take(m * width + ROW_META_BYTES * m, f"{what} (per-token int8)")
        b.emit(Vec(core=c, func=VecFunc.QUANT_ROW_WIDE, rows=m, cols=width, src0=x, dst=out,
                   p2=lw.numerics.residual_bits, wait=(b.sem(c, "in_vpu"),),
                   signal=(b.sem(c, to),)))
        return out
    b.emit(Nop(core=c, on=Engine.VPU, wait=(b.sem(c, "in_vpu"),), signal=(b.sem(c, to),)))
    return x


def proj_residual(b: Builder, lw: Lowering, mat, add, *, m: int, src: int, k: int,
                  resid: int, dst: int, what: tuple[str, str],
                  int32_input: bool = False) -> None:
    """Each core: its slice of ``mat`` @ ``src`` (``m`` rows of ``k``) plus the same slice of
    the residual ``resid`` (``m`` rows of hidden) -> ``dst``. ``what`` names the input and
    the projection for SRAM-overflow messages; ``int32_input``: the wide pipeline's input
    is int32 (quantized per token here), else int8."""
    if lw.numerics.wide:
        _proj_residual_wide(b, lw, mat, add, m=m, src=src, k=k, resid=resid, dst=dst,
                            what=what, per_token=int32_input)
        return
    h = lw.model.hidden_size
    for c in lw.target.cores:
        r0, r1 = lw.rows(h, c)
        if r1 <= r0:
            continue
        w = r1 - r0
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mat, (r0, r1))
        a = plan.take(m * k, what[0])
        b.load(c, src, a, m * k, to="in_mxu")
        xs = plan.take(m * w, "residual slice")
        b.load(c, resid + r0, xs, w, rows=m, src_stride=h, to="in_vpu")
        pb = plan.take(m * w, f"{what[1]} output")
        b.gemm(c, mat, (r0, r1), a=a, m=m, out=pb, plan=plan,
               first_wait=(b.sem(c, "in_mxu"),), last_signal=(b.sem(c, "mxu_vpu"),))
        out = plan.take(m * w, "residual output")
        b.emit(Vec(core=c, func=VecFunc.ADD, rows=m, cols=w, src0=xs, src1=pb, dst=out,
                   p0=add.ma, p1=add.mb, p2=add.shift,
                   wait=(b.sem(c, "in_vpu"), b.sem(c, "mxu_vpu")),
                   signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=dst + r0, nbytes=w, rows=m, dst_stride=h,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


def _proj_residual_wide(b: Builder, lw: Lowering, mat, add, *, m: int, src: int, k: int,
                        resid: int, dst: int, what: tuple[str, str], per_token: bool) -> None:
    """:func:`proj_residual` of the wide pipeline: an int8 input (the attention output,
    static) or an int32 one (the SwiGLU output, quantized per token here by QUANT_ROW, as
    only this core sees whole rows), GemmRow into int32 on the output residual's scale,
    ADD_WIDE with the residual slice (the fused epilogue, K1)."""
    if per_token and lw.lean:
        _proj_residual_lean(b, lw, mat, add, m=m, src=src, k=k, resid=resid, dst=dst,
                            what=what)
        return
    h = lw.model.hidden_size
    rb = residual_bytes(lw)
    bits = lw.numerics.residual_bits
    for c in lw.target.cores:
        r0, r1 = lw.rows(h, c)
        if r1 <= r0:
            continue
        w = r1 - r0
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mat, (r0, r1))
        meta = NO_ADDR
        if per_token:
            raw = plan.take(4 * m * k, f"{what[0]} (int32)")
            b.load(c, src, raw, 4 * m * k, to="in_vpu")
            a = plan.take(m * k + ROW_META_BYTES * m, what[0])
            meta = a + m * k
            # DMA_IN is one in-order queue: the first in_vpu credit is this load's
            b.emit(Vec(core=c, func=VecFunc.QUANT_ROW, rows=m, cols=k, src0=raw, dst=a,
                       wait=(b.sem(c, "in_vpu"),), signal=(b.sem(c, "vpu_mxu"),)))
            first = (b.sem(c, "vpu_mxu"),)
        else:
            a = plan.take(m * k, what[0])
            b.load(c, src, a, m * k, to="in_mxu")
            first = (b.sem(c, "in_mxu"),)
        xs = plan.take(rb * m * w, "residual slice")
        b.load(c, resid + rb * r0, xs, rb * w, rows=m, src_stride=rb * h, to="in_vpu")
        pb = plan.take(4 * m * w, f"{what[1]} output (int32)")
        b.gemm(c, mat, (r0, r1), a=a, m=m, out=pb, plan=plan, first_wait=first,
               last_signal=(b.sem(c, "mxu_vpu"),), row_meta=meta)
        out = plan.take(rb * m * w, "residual output")
        b.emit(Vec(core=c, func=VecFunc.ADD_WIDE, rows=m, cols=w, src0=xs, src1=pb, dst=out,
                   p0=add.ma, p1=add.shift, p2=bits,
                   wait=(b.sem(c, "in_vpu"), b.sem(c, "mxu_vpu")),
                   signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=dst + rb * r0, nbytes=rb * w, rows=m,
                        dst_stride=rb * h, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


#: Column chunks of a core's slice of the down projection's output in the lean schedule:
#: the int32 GEMM output of one chunk is held at a time (an assumption of the compiler: 4
#: keeps a 19-token tile of Llama-3.2-1B's down stage in 224 KiB; each chunk restarts the
#: GEMM and adds an ADD_WIDE and a store).
DOWN_CHUNKS = 4


def down_chunks(lw: Lowering, c: int) -> list[tuple[int, int]]:
    """Core ``c``'s output columns of a lean projection in :data:`DOWN_CHUNKS` chunks of
    whole 16s (none empty; none if the core has no columns)."""
    r0, r1 = lw.rows(lw.model.hidden_size, c)
    return [(r0 + lo, r0 + hi) for lo, hi in split(r1 - r0, DOWN_CHUNKS, 16) if hi > lo]


def down_first_rows(lw: Lowering, c: int) -> tuple[int, int] | None:
    """The rows of the first GEMM of core ``c``'s lean down projection (its prefetch)."""
    chunks = down_chunks(lw, c)
    return chunks[0] if chunks else None


def _proj_residual_lean(b: Builder, lw: Lowering, mat, add, *, m: int, src: int, k: int,
                        resid: int, dst: int, what: tuple[str, str]) -> None:
    """:func:`_proj_residual_wide` of an input already quantized per token (the lean
    schedule's SwiGLU rows: ``m x k`` int8 then ``m`` ``(fa, p)`` pairs at ``src``, one
    load), its output in :data:`DOWN_CHUNKS` column chunks: GemmRow of a chunk into one
    shared int32 buffer (a chunk's GEMM waits until the previous chunk's ADD_WIDE has
    read it), ADD_WIDE in place over the chunk's residual slice, stored."""
    h = lw.model.hidden_size
    rb = residual_bytes(lw)
    bits = lw.numerics.residual_bits
    for c in lw.target.cores:
        r0, r1 = lw.rows(h, c)
        if r1 <= r0:
            continue
        chunks = down_chunks(lw, c)
        plan = SramPlan(lw.target, c)
        if (c, mat.name, chunks[0]) not in b.prefetched:  # else queued by the MLP's stage
            b.prefetch(c, mat, chunks[0])
        a = plan.take(m * k + ROW_META_BYTES * m, what[0])
        b.load(c, src, a, m * k + ROW_META_BYTES * m, to="in_mxu")
        xs = []
        for lo, hi in chunks:
            x = plan.take(rb * m * (hi - lo), "residual slice")
            b.load(c, resid + rb * lo, x, rb * (hi - lo), rows=m, src_stride=rb * h,
                   to="in_vpu")
            xs.append(x)
        pb = plan.take(4 * m * max(hi - lo for lo, hi in chunks), f"{what[1]} output (int32)")
        for j, (lo, hi) in enumerate(chunks):
            cw = hi - lo
            last = j + 1 == len(chunks)
            b.gemm(c, mat, (lo, hi), a=a, m=m, out=pb, plan=plan,
                   first_wait=(b.sem(c, "in_mxu" if j == 0 else "vpu_mxu"),),
                   last_signal=(b.sem(c, "mxu_vpu"),), row_meta=a + m * k)
            b.emit(Vec(core=c, func=VecFunc.ADD_WIDE, rows=m, cols=cw, src0=xs[j], src1=pb,
                       dst=xs[j], p0=add.ma, p1=add.shift, p2=bits,
                       wait=(b.sem(c, "in_vpu"), b.sem(c, "mxu_vpu")),
                       signal=(b.sem(c, "vpu_out"),) + (() if last else (b.sem(c, "vpu_mxu"),))))
            b.emit(DmaStore(core=c, src=xs[j], dst=dst + rb * lo, nbytes=rb * cw, rows=m,
                            dst_stride=rb * h, wait=(b.sem(c, "vpu_out"),),
                            signal=b.barrier()))


def end_stage(b: Builder, c: int) -> None:
    """The core's vector unit is done, then its stores: signal the stage barrier."""
    b.emit(Nop(core=c, on=Engine.VPU, signal=(b.sem(c, "vpu_out"),)))
    b.emit(Nop(core=c, on=Engine.DMA_OUT, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
