"""The dense SwiGLU MLP, split over the cores by intermediate rows (gate/up) and by
output columns (down). Per layer:

- D: RMSNorm, gate/up slices, SwiGLU -> ``act.hb``
- E: down projection slice and residual add -> the next layer's input
"""

from __future__ import annotations

from isa.instructions import DmaStore, Vec, VecFunc

from ...config import ModelConfig
from ..builder import Builder
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap
from ..ops import norm, proj_residual, residual_bytes, row_meta, unnormed
from ..sram import SramPlan


class DenseMlp:
    """:class:`~.base.MlpBlock` of a dense layer (its buffers are the shared ``act.hb``)."""

    kind = "dense"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        return None

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        stage_mlp_up(b, lw, layer, q, m)
        stage_mlp_down(b, lw, layer, q, x_next, m)


def stage_mlp_up(b: Builder, lw: Lowering, layer: int, q, m: int, *, src: int | None = None,
                 norm_name: str | None = "mlp_norm") -> None:
    """RMSNorm, gate and up slices, SwiGLU -> act.hb; the input is ``act.xm`` (or ``src``,
    normalised by ``norm_name``: a parallel block's layer input and its one norm; None:
    not normalised, as EXAONE-4.0's post-norm blocks)."""
    cfg = lw.model
    h = cfg.hidden_size
    inter = cfg.intermediate_size
    p = f"layers.{layer}."
    mg = lw.matrix(p + "gate_proj", q.gate)
    mu = lw.matrix(p + "up_proj", q.up)
    xm = lw.mm["act.xm"].base if src is None else src
    hb = lw.mm["act.hb"].base
    wide = lw.numerics.wide
    for c in lw.target.cores:
        i0, i1 = lw.rows(inter, c)
        if i1 <= i0:
            continue
        w = i1 - i0
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mg, (i0, i1))
        rb = residual_bytes(lw)
        xs = plan.take(rb * m * h, "MLP input")
        b.load(c, xm, xs, rb * m * h, to="in_vpu")
        if norm_name is None:
            xn = unnormed(b, lw, c, plan, xs, m, h, to="vpu_mxu", what="MLP input")
        else:
            xn = norm(b, lw, c, plan, p + norm_name, q.mlp_norm, xs, m, h, to="vpu_mxu")
        meta = row_meta(lw, xn, m, h)
        e = 4 if wide else 1  # the wide pipeline's gate/up/SwiGLU outputs are int32
        g = plan.take(e * m * w, "gate output")
        u = plan.take(e * m * w, "up output")
        b.gemm(c, mg, (i0, i1), a=xn, m=m, out=g, plan=plan, first_wait=(b.sem(c, "vpu_mxu"),),
               row_meta=meta)
        b.gemm(c, mu, (i0, i1), a=xn, m=m, out=u, plan=plan,
               last_signal=(b.sem(c, "mxu_vpu"),), row_meta=meta)
        out = plan.take(e * m * w, "SwiGLU output")
        s = q.silu
        b.emit(Vec(core=c, func=VecFunc.SILU_MUL_WIDE if wide else VecFunc.SILU_MUL, rows=m,
                   cols=w, src0=g, src1=u, dst=out,
                   p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                   wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=hb + e * i0, nbytes=e * w, rows=m,
                        dst_stride=e * inter, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))



def stage_mlp_down(b: Builder, lw: Lowering, layer: int, q, x_next: int, m: int) -> None:
    """down projection slice + residual add -> the next layer's input."""
    proj_residual(b, lw, lw.matrix(f"layers.{layer}.down_proj", q.down), q.add2, m=m,
                   src=lw.mm["act.hb"].base, k=lw.model.intermediate_size,
                   resid=lw.mm["act.xm"].base, dst=x_next, what=("SwiGLU output", "down_proj"),
                   int32_input=True)

