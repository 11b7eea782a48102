"""EXAONE-4.0's layer: QK RMSNorm and norms after attention and after the MLP
("QK-Reorder-Norm"; ``modeling_exaone4.py`` in ``transformers``):

    x_m    = x   + post_attn_norm(o_proj(attn(qk_norm(q(x)), qk_norm(k(x)), v(x))))
    x_next = x_m + post_mlp_norm(down(silu(gate(x_m)) * up(x_m)))

No norm precedes the projections. This file holds the attention block and the two-stage
post-norm both blocks use; the MLP block is :mod:`.postnorm_mlp`. The attention is
:class:`.sliding.SlidingGqaAttention` (EXAONE-4.0's larger models mix sliding and global
layers) with the GQA hooks for the input norm (none: a pass-through on the VPU), the head
norms (an RMSNorm over each q and k head of ``head_dim`` values before RoPE, gains
``q_norm``/``k_norm``) and the O stage.
A post-norm needs whole rows of the projection's output, while the projection is split
over the cores by output column, so each post-norm is two stages: the projection slices
to ``act.po`` (int8), then each core normalises a share of the tile's token rows and adds
the residual.
"""

from __future__ import annotations

from isa.instructions import NO_ADDR, DmaStore, Vec, VecFunc
from isa.vecfuncs import ROW_META_BYTES

from ..builder import Builder, Matrix, split
from ..lowering import Lowering
from ..memmap import MemoryMap
from ..ops import residual_bytes, unnormed
from ..sram import SramPlan
from .sliding import SlidingGqaAttention

#: The activation region of a projection's output before its post-norm.
POST_REGION = "act.po"
#: The same in the wide pipeline: int32 projection outputs (``models.compiler.dram``).
POST_WIDE_REGION = "act.po32"


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
        return unnormed(b, lw, c, plan, xs, m, self.cfg.hidden_size, to="vpu_mxu",
                        what="attention input")

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
            dst=lw.mm["act.xm"].base, what=("attention output", "o_proj"), per_token=False)


def proj_post_norm_residual(b: Builder, lw: Lowering, mat: Matrix, norm_name: str, nq, add,
                            *, m: int, src: int, k: int, resid: int, dst: int,
                            what: tuple[str, str], per_token: bool) -> None:
    """``dst = resid + norm(mat @ src)``: each core's output columns of ``mat`` to
    ``act.po``; then each core's share of the ``m`` token rows: the norm of whole rows and
    the residual add. ``per_token``: the wide pipeline's input is int32 (the SwiGLU
    output, quantized per token by each core), else int8 (:func:`_post_norm_wide`)."""
    if lw.numerics.wide:
        _post_norm_wide(b, lw, mat, norm_name, nq, add, m=m, src=src, k=k, resid=resid,
                        dst=dst, what=what, per_token=per_token)
        return
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


def _post_norm_wide(b: Builder, lw: Lowering, mat: Matrix, norm_name: str, nq, add, *,
                    m: int, src: int, k: int, resid: int, dst: int, what: tuple[str, str],
                    per_token: bool) -> None:
    """:func:`proj_post_norm_residual` of the wide pipeline: each core's output columns as
    GemmRow int32 outputs (a static int8 input, or the int32 SwiGLU output quantized per
    token by QUANT_ROW) to ``act.po32``; then, by token rows, RMSNORM_WIDE of the int32
    rows straight onto the output residual's scale (its gain's encoding is chosen so:
    ``models.compiler.calibrate_wide.wide_post_norm_params``) and ADD_WIDE with the
    rescaled wide residual."""
    h = lw.model.hidden_size
    rb = residual_bytes(lw)
    bits = lw.numerics.residual_bits
    po = lw.mm[POST_WIDE_REGION].base
    for c in lw.target.cores:  # the projection, by output column
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
            b.emit(Vec(core=c, func=VecFunc.QUANT_ROW, rows=m, cols=k, src0=raw, dst=a,
                       wait=(b.sem(c, "in_vpu"),), signal=(b.sem(c, "vpu_mxu"),)))
            first = (b.sem(c, "vpu_mxu"),)
        else:
            a = plan.take(m * k, what[0])
            b.load(c, src, a, m * k, to="in_mxu")
            first = (b.sem(c, "in_mxu"),)
        pb = plan.take(4 * m * w, f"{what[1]} output (int32)")
        b.gemm(c, mat, (r0, r1), a=a, m=m, out=pb, plan=plan, first_wait=first,
               last_signal=(b.sem(c, "mxu_out"),), row_meta=meta)
        b.emit(DmaStore(core=c, src=pb, dst=po + 4 * r0, nbytes=4 * w, rows=m,
                        dst_stride=4 * h, wait=(b.sem(c, "mxu_out"),), signal=b.barrier()))
    shares = split(m, len(lw.target.cores))
    for c, (t0, t1) in zip(lw.target.cores, shares, strict=True):  # the norm, by token row
        n = t1 - t0
        if n <= 0:
            continue
        plan = SramPlan(lw.target, c)
        xs = plan.take(4 * n * h, f"{what[1]} rows (int32)")
        b.load(c, po + 4 * t0 * h, xs, 4 * n * h, to="in_vpu")
        gamma = plan.take(2 * h, f"{norm_name} gain")
        b.load(c, lw.mm[f"p.{norm_name}"].base, gamma, 2 * h, to="in_vpu")
        rs = plan.take(rb * n * h, "residual rows")
        b.load(c, resid + rb * t0 * h, rs, rb * n * h, to="in_vpu")
        xn = plan.take(4 * n * h, f"{norm_name} output (int32)")
        b.emit(Vec(core=c, func=VecFunc.RMSNORM_WIDE, rows=n, cols=h, src0=xs, src1=gamma,
                   dst=xn, p0=nq.eps_q, p1=nq.shift, p2=32, wait=(b.sem(c, "in_vpu"),) * 2))
        out = plan.take(rb * n * h, "residual output")
        b.emit(Vec(core=c, func=VecFunc.ADD_WIDE, rows=n, cols=h, src0=rs, src1=xn, dst=out,
                   p0=add.ma, p1=add.shift, p2=bits, wait=(b.sem(c, "in_vpu"),),
                   signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=dst + rb * t0 * h, nbytes=rb * n * h,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
