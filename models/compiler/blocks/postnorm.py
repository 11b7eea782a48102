"""EXAONE-4.0's layer: QK RMSNorm and norms after attention and after the MLP
("QK-Reorder-Norm"; ``modeling_exaone4.py`` in ``transformers``):

    x_m    = x   + post_attn_norm(o_proj(attn(qk_norm(q(x)), qk_norm(k(x)), v(x))))
    x_next = x_m + post_mlp_norm(down(silu(gate(x_m)) * up(x_m)))

No norm precedes the projections. The attention is :class:`.sliding.SlidingGqaAttention`
(EXAONE-4.0's larger models mix sliding and global layers) with the GQA hooks for the
input norm (none: a pass-through on the VPU), the head norms (an RMSNorm over each q and
k head of ``head_dim`` values before RoPE, gains ``q_norm``/``k_norm``) and the O stage.
A post-norm needs whole rows of the projection's output, while the projection is split
over the cores by output column, so each post-norm is two stages: the projection slices
to ``act.po`` (int8), then each core normalises a share of the tile's token rows and adds
the residual.
"""

from __future__ import annotations

from isa.instructions import DmaStore, Engine, Nop, Vec, VecFunc

from ...config import ModelConfig
from ..builder import Builder, Matrix, split
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap
from ..sram import SramPlan
from .dense import stage_mlp_up
from .sliding import SlidingGqaAttention

#: The activation region of a projection's output before its post-norm.
POST_REGION = "act.po"


class PostNormAttention(SlidingGqaAttention):
    """:class:`~.base.AttentionBlock` of EXAONE-4.0 (QK norm, post-attention norm)."""

    kind = "postnorm-gqa"

    def add_regions(self, mm: MemoryMap, *, pair, cap: int, slots: int, m_tile: int) -> None:
        super().add_regions(mm, pair=pair, cap=cap, slots=slots, m_tile=m_tile)
        mm.add(POST_REGION, m_tile * self.cfg.hidden_size, "activations")

    def input_norm(self, b: Builder, lw: Lowering, c: int, plan: SramPlan, layer: int, q,
                   xs: int, m: int) -> int:
        if self.cfg.norm_position == "pre":
            return super().input_norm(b, lw, c, plan, layer, q, xs, m)
        b.emit(Nop(core=c, on=Engine.VPU, wait=(b.sem(c, "in_vpu"),),
                   signal=(b.sem(c, "vpu_mxu"),)))
        return xs

    def head_norm_gains(self, b: Builder, lw: Lowering, c: int, plan: SramPlan,
                        layer: int) -> dict[str, int] | None:
        if not self.cfg.qk_norm:
            return None
        hd = self.cfg.head_dim
        gains = {}
        for part in ("q", "k"):
            gains[part] = plan.take(2 * hd, f"{part}_norm gain")
            b.load(c, lw.mm[f"p.layers.{layer}.{part}_norm"].base, gains[part], 2 * hd,
                   to="in_vpu")
        return gains

    def stage_o(self, b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
        if self.cfg.norm_position == "pre":
            return super().stage_o(b, lw, layer, q, x, m)
        cfg = lw.model
        p = f"layers.{layer}."
        proj_post_norm_residual(
            b, lw, lw.matrix(p + "o_proj", q.o), p + "post_attn_norm", q.post_attn_norm,
            q.add1, m=m, src=lw.mm["act.ao"].base, k=cfg.num_heads * cfg.head_dim, resid=x,
            dst=lw.mm["act.xm"].base, what=("attention output", "o_proj"))


class PostNormDenseMlp:
    """:class:`~.base.MlpBlock` of EXAONE-4.0: SwiGLU on ``act.xm`` unnormalised, then the
    post-MLP norm and the residual add."""

    kind = "postnorm-dense"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        return None  # act.po belongs to the attention block

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        p = f"layers.{layer}."
        stage_mlp_up(b, lw, layer, q, m, norm_name=None)
        proj_post_norm_residual(
            b, lw, lw.matrix(p + "down_proj", q.down), p + "post_mlp_norm", q.post_mlp_norm,
            q.add2, m=m, src=lw.mm["act.hb"].base, k=lw.model.intermediate_size,
            resid=lw.mm["act.xm"].base, dst=x_next, what=("SwiGLU output", "down_proj"))


def proj_post_norm_residual(b: Builder, lw: Lowering, mat: Matrix, norm_name: str, nq, add,
                            *, m: int, src: int, k: int, resid: int, dst: int,
                            what: tuple[str, str]) -> None:
    """``dst = resid + norm(mat @ src)``: each core's output columns of ``mat`` to
    ``act.po``; then each core's share of the ``m`` token rows: the norm of whole rows and
    the residual add."""
    h = lw.model.hidden_size
    po = lw.mm[POST_REGION].base
    for c in lw.target.cores:  # the projection, by output column
        r0, r1 = lw.rows(h, c)
        if r1 <= r0:
            continue
        w = r1 - r0
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mat, (r0, r1))
        a = plan.take(m * k, what[0])
        b.load(c, src, a, m * k, to="in_mxu")
        pb = plan.take(m * w, f"{what[1]} output")
        b.gemm(c, mat, (r0, r1), a=a, m=m, out=pb, plan=plan,
               first_wait=(b.sem(c, "in_mxu"),), last_signal=(b.sem(c, "mxu_out"),))
        b.emit(DmaStore(core=c, src=pb, dst=po + r0, nbytes=w, rows=m, dst_stride=h,
                        wait=(b.sem(c, "mxu_out"),), signal=b.barrier()))
    shares = split(m, len(lw.target.cores))
    for c, (t0, t1) in zip(lw.target.cores, shares, strict=True):  # the norm, by token row
        n = t1 - t0
        if n <= 0:
            continue
        plan = SramPlan(lw.target, c)
        xs = plan.take(n * h, f"{what[1]} rows")
        b.load(c, po + t0 * h, xs, n * h, to="in_vpu")
        gamma = plan.take(2 * h, f"{norm_name} gain")
        b.load(c, lw.mm[f"p.{norm_name}"].base, gamma, 2 * h, to="in_vpu")
        rs = plan.take(n * h, "residual rows")
        b.load(c, resid + t0 * h, rs, n * h, to="in_vpu")
        xn = plan.take(n * h, f"{norm_name} output")
        b.emit(Vec(core=c, func=VecFunc.RMSNORM, rows=n, cols=h, src0=xs, src1=gamma, dst=xn,
                   p0=nq.eps_q, p1=nq.shift, wait=(b.sem(c, "in_vpu"),) * 2))
        out = plan.take(n * h, "residual output")
        b.emit(Vec(core=c, func=VecFunc.ADD, rows=n, cols=h, src0=rs, src1=xn, dst=out,
                   p0=add.ma, p1=add.mb, p2=add.shift, wait=(b.sem(c, "in_vpu"),),
                   signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=dst + t0 * h, nbytes=n * h,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
