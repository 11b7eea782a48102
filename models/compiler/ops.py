"""The shared numerics emit-helpers every block uses: RMSNorm, GEMM + requantization +
residual add, the end of a stage. A change of the integer pipeline (a wider residual
stream, per-token dynamic scales, group-wise weights) is local to this module and the
blocks' own stages."""

from __future__ import annotations

from isa.instructions import DmaStore, Engine, Nop, Vec, VecFunc

from .builder import Builder
from .lowering import Lowering
from .sram import SramPlan


def norm(b: Builder, lw: Lowering, c: int, plan: SramPlan, norm: str, nq, x: int, m: int,
         width: int, *, to: str) -> int:
    """Load the gain of ``norm`` and RMS-normalise ``x`` (already loaded, signalled on
    in_vpu) into a new buffer (LayerNorm for ``norm_kind = "layer"``); the VPU signals
    ``to``."""
    gamma = plan.take(2 * width, f"{norm} gain")
    b.load(c, lw.mm[f"p.{norm}"].base, gamma, 2 * width, to="in_vpu")
    out = plan.take(m * width, f"{norm} output")
    func = VecFunc.LAYERNORM if lw.model.norm_kind == "layer" else VecFunc.RMSNORM
    b.emit(Vec(core=c, func=func, rows=m, cols=width, src0=x, src1=gamma, dst=out,
               p0=nq.eps_q, p1=nq.shift, wait=(b.sem(c, "in_vpu"),) * 2,
               signal=(b.sem(c, to),)))
    return out


def proj_residual(b: Builder, lw: Lowering, mat, add, *, m: int, src: int, k: int,
                  resid: int, dst: int, what: tuple[str, str]) -> None:
    """Each core: its slice of ``mat`` @ ``src`` (``m`` rows of ``k``) plus the same slice of
    the residual ``resid`` (``m`` rows of hidden) -> ``dst``. ``what`` names the input and
    the projection for SRAM-overflow messages."""
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


def end_stage(b: Builder, c: int) -> None:
    """The core's vector unit is done, then its stores: signal the stage barrier."""
    b.emit(Nop(core=c, on=Engine.VPU, signal=(b.sem(c, "vpu_out"),)))
    b.emit(Nop(core=c, on=Engine.DMA_OUT, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
