"""The dense SwiGLU MLP, split over the cores by intermediate rows (gate/up) and by
output columns (down). Per layer:

- D: RMSNorm, gate/up slices, SwiGLU -> ``act.hb``
- E: down projection slice and residual add -> the next layer's input
"""

from __future__ import annotations

from isa.instructions import DmaStore, Vec, VecFunc
from isa.vecfuncs import ROW_META_BYTES

from ...config import ModelConfig
from ..builder import Builder, split
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap, align
from ..ops import down_first_rows, norm, proj_residual, residual_bytes, row_meta, unnormed
from ..sram import SRAM_ALIGN, SramPlan


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
        stage_mlp_up(b, lw, layer, q, m, down_next=True)
        stage_mlp_down(b, lw, layer, q, x_next, m)


def stage_mlp_up(b: Builder, lw: Lowering, layer: int, q, m: int, *, src: int | None = None,
                 norm_name: str | None = "mlp_norm", down_next: bool = False) -> None:
    """RMSNorm, gate and up slices, SwiGLU -> act.hb; the input is ``act.xm`` (or ``src``,
    normalised by ``norm_name``: a parallel block's layer input and its one norm; None:
    not normalised, as EXAONE-4.0's post-norm blocks). ``down_next``: :func:`stage_mlp_down`
    follows (the lean schedule starts its weight stream before the exchange's barrier)."""
    if lw.lean:
        stage_mlp_up_lean(b, lw, layer, q, m, src=src, norm_name=norm_name,
                          down_next=down_next)
        return
    h, inter, p, mg, mu, xm, hb = _mlp_up_operands(lw, layer, q, src)
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
        b.emit(Vec(core=c, func=gate_func(lw), rows=m,
                   cols=w, src0=g, src1=u, dst=out,
                   p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                   wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=hb + e * i0, nbytes=e * w, rows=m,
                        dst_stride=e * inter, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


def gate_func(lw: Lowering) -> VecFunc:
    """The gated MLP's vector function: SwiGLU, or GeGLU for ``hidden_act = "gelu_tanh"``
    (the same parameters); int8 or, in the wide pipeline, int32."""
    gelu = lw.model.hidden_act == "gelu_tanh"
    if lw.numerics.wide:
        return VecFunc.GELU_MUL_WIDE if gelu else VecFunc.SILU_MUL_WIDE
    return VecFunc.GELU_MUL if gelu else VecFunc.SILU_MUL


def _mlp_up_operands(lw: Lowering, layer: int, q, src: int | None) -> tuple:
    """What both MLP-up schedules read: hidden and intermediate widths, the layer's tensor
    prefix, the gate and up matrices, the input's base (``act.xm`` or ``src``) and
    ``act.hb``'s."""
    cfg = lw.model
    p = f"layers.{layer}."
    return (cfg.hidden_size, cfg.intermediate_size, p, lw.matrix(p + "gate_proj", q.gate),
            lw.matrix(p + "up_proj", q.up),
            lw.mm["act.xm"].base if src is None else src, lw.mm["act.hb"].base)


def stage_mlp_up_lean(b: Builder, lw: Lowering, layer: int, q, m: int, *, src: int | None,
                      norm_name: str | None, down_next: bool = False) -> None:
    """:func:`stage_mlp_up` of the wide pipeline's lean schedule (``schedule = "lean"``),
    the same integer results in less SRAM per token:

    - RMSNORM_QUANT (``ops.norm``): no int32 norm rows;
    - gate/up in :data:`MLP_UP_CHUNKS` column chunks: the gate outputs of the core's slice
      over the dead MLP input, one chunk's up output at a time (the next chunk's up GEMM
      waits until SwiGLU has read the last one), SwiGLU in place over the gate outputs;
    - the per-token quantization of the SwiGLU rows, which the cores hold in column
      slices: each chunk's row maxima (ROW_AMAX) go to a table in DRAM, the cores meet at
      a barrier, and each quantizes its chunks on the maximum of the table
      (QUANT_ROW_AMAX): int8 rows and their metadata (``m x inter`` int8, then ``m``
      ``(fa, p)`` pairs) to ``act.hb``, which the down projection reads as they are.

    With ``down_next`` each core queues the down projection's first weight tiles before it
    waits for the exchange, so the weight stream does not stop at the barrier."""
    h, inter, p, mg, mu, xm, hb = _mlp_up_operands(lw, layer, q, src)
    s = q.silu
    rb = residual_bytes(lw)
    parts = [(c, ch) for c in lw.target.cores for ch in _up_chunks(lw, c)]
    table = hb + amax_table_offset(lw)  # int32 [len(parts), m]: the row maxima per chunk
    held = {}
    for c in lw.target.cores:
        chunks = _up_chunks(lw, c)
        if not chunks:
            continue
        i0, i1 = chunks[0][0], chunks[-1][1]
        w = i1 - i0
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mg, chunks[0])
        xs = plan.take(rb * m * h, "MLP input")
        b.load(c, xm, xs, rb * m * h, to="in_vpu")
        if norm_name is None:
            xn = unnormed(b, lw, c, plan, xs, m, h, to="vpu_mxu", what="MLP input")
        else:
            xn = norm(b, lw, c, plan, p + norm_name, q.mlp_norm, xs, m, h, to="vpu_mxu")
        meta = row_meta(lw, xn, m, h)
        # the gate outputs over the MLP input, which the norm (VPU) has read before it
        # signalled vpu_mxu, the gate GEMM's first wait
        g = plan.take_over(xs, rb * m * h, 4 * m * w, "gate output") if xn != xs else \
            plan.take(4 * m * w, "gate output")
        wu = max(hi - lo for lo, hi in chunks)
        u = plan.take(4 * m * wu, "up output (one chunk)")
        amax = plan.take(4 * m * len(chunks), "SwiGLU row maxima")
        for j, (lo, hi) in enumerate(chunks):
            cw = hi - lo
            gj = g + 4 * m * (lo - i0)  # chunk j's gate rows: [m, cw] int32
            b.gemm(c, mg, (lo, hi), a=xn, m=m, out=gj, plan=plan,
                   first_wait=(b.sem(c, "vpu_mxu"),) if j == 0 else (), row_meta=meta)
            # the previous chunk's SwiGLU has read u (it signalled vpu_mxu)
            b.gemm(c, mu, (lo, hi), a=xn, m=m, out=u, plan=plan,
                   first_wait=(b.sem(c, "vpu_mxu"),) if j else (),
                   last_signal=(b.sem(c, "mxu_vpu"),), row_meta=meta)
            b.emit(Vec(core=c, func=gate_func(lw), rows=m, cols=cw, src0=gj, src1=u,
                       dst=gj, p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                       wait=(b.sem(c, "mxu_vpu"),),
                       signal=(b.sem(c, "vpu_mxu"),) if j + 1 < len(chunks) else ()))
            b.emit(Vec(core=c, func=VecFunc.ROW_AMAX, rows=m, cols=cw, src0=gj,
                       dst=amax + 4 * m * j,
                       signal=(b.sem(c, "vpu_out"),) if j + 1 == len(chunks) else ()))
        k0 = parts.index((c, chunks[0]))
        b.emit(DmaStore(core=c, src=amax, dst=table + 4 * m * k0, nbytes=4 * m * len(chunks),
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
        held[c] = (plan, chunks, g, u)
    first = True
    md = lw.matrix(p + "down_proj", q.down)
    for c, (plan, chunks, g, u) in held.items():
        i0 = chunks[0][0]
        if down_next and (rows := down_first_rows(lw, c)) is not None:
            b.prefetch(c, md, rows)
        tab = plan.take(4 * m * len(parts), "row maxima table")
        b.load(c, table, tab, 4 * m * len(parts), to="in_vpu")
        room = 4 * m * max(hi - lo for lo, hi in chunks)  # the up output's bytes
        off = 0
        for j, (lo, hi) in enumerate(chunks):
            cw = hi - lo
            # each chunk's int8 rows and metadata in its own part of the up output, which
            # SwiGLU read before (the stores of the chunks overlap the next ones' work)
            nq = m * cw + ROW_META_BYTES * m
            qb = plan.take_over(u + off, room - off, nq, "SwiGLU output (int8)")
            off = align(off + nq, SRAM_ALIGN) if qb == u + off else room
            b.emit(Vec(core=c, func=VecFunc.QUANT_ROW_AMAX, rows=m, cols=cw,
                       src0=g + 4 * m * (lo - i0), src1=tab, dst=qb, p1=len(parts),
                       wait=(b.sem(c, "in_vpu"),) if j == 0 else (),
                       signal=(b.sem(c, "vpu_out"),)))
            b.emit(DmaStore(core=c, src=qb, dst=hb + lo, nbytes=cw, rows=m, dst_stride=inter,
                            wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
            if first:  # every chunk's metadata is the same: one copy after the rows
                b.emit(DmaStore(core=c, src=qb + m * cw, dst=hb + m * inter,
                                nbytes=ROW_META_BYTES * m, signal=b.barrier()))
                first = False


#: Column chunks of a core's gate/up slice in the lean schedule: one chunk's int32 up
#: output is held at a time (an assumption of the compiler: 2 halves the up buffer and
#: adds one GEMM restart per chunk).
MLP_UP_CHUNKS = 2


def _up_chunks(lw: Lowering, c: int) -> list[tuple[int, int]]:
    """Core ``c``'s gate/up rows in :data:`MLP_UP_CHUNKS` chunks of whole 16s (none
    empty; no chunks if the core has no rows)."""
    i0, i1 = lw.rows(lw.model.intermediate_size, c)
    return [(i0 + lo, i0 + hi) for lo, hi in split(i1 - i0, MLP_UP_CHUNKS, 16) if hi > lo]


def amax_table_offset(lw: Lowering) -> int:
    """Offset in ``act.hb`` of the lean schedule's row-maxima table: after the int8 rows
    and their metadata of a whole token tile (``act.hb`` holds int32 rows, 4x that)."""
    return align(lw.m_tile * (lw.model.intermediate_size + ROW_META_BYTES), 64)


def stage_mlp_down(b: Builder, lw: Lowering, layer: int, q, x_next: int, m: int) -> None:
    """down projection slice + residual add -> the next layer's input."""
    proj_residual(b, lw, lw.matrix(f"layers.{layer}.down_proj", q.down), q.add2, m=m,
                   src=lw.mm["act.hb"].base, k=lw.model.intermediate_size,
                   resid=lw.mm["act.xm"].base, dst=x_next, what=("SwiGLU output", "down_proj"),
                   int32_input=True)

