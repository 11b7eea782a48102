"""The model's input and output head: the float32 embeddings from the host into the int8
residual stream, and the final RMSNorm and LM head (int32 logits).

One call's head reads the last token's hidden state directly (:func:`stage_head`); a
batched step gathers the sampling tokens' hidden states into ``act.last`` after each tile
(:func:`gather_rows`) and runs the head over them in head tiles (:func:`stage_head_rows`).
"""

from __future__ import annotations

from isa.instructions import NO_ADDR, DmaCopy, DmaStore, Engine, Nop, Vec, VecFunc
from isa.kernels.fixed import quantize_multiplier
from isa.vecfuncs import ROW_META_BYTES

from ..builder import Builder, gemm_kind, split
from ..lowering import Lowering
from ..ops import norm, residual_bytes, row_meta
from ..sram import SramPlan

#: Regions a batched step needs beside the compiled model's.
LAST_REGION = "act.last"
LOGITS_REGION = "io.logits.batch"


def stage_input(b: Builder, lw: Lowering, emb: int, x: int, m: int) -> None:
    """float32 embeddings -> int8 residual stream, columns split over the cores."""
    h = lw.model.hidden_size
    mult, shift = quantize_multiplier(1.0 / lw.numerics.input_scale)
    rb = residual_bytes(lw)
    wide = lw.numerics.wide
    for c, (a, e) in zip(lw.target.cores, split(h, len(lw.target.cores), 16), strict=True):
        if e <= a:
            continue
        w = e - a
        plan = SramPlan(lw.target, c)
        src = plan.take(4 * m * w, "embeddings")
        dst = plan.take(rb * m * w, "input activations")
        b.load(c, emb + 4 * a, src, 4 * w, rows=m, src_stride=4 * h, to="in_vpu")
        b.emit(Vec(core=c, func=VecFunc.FROM_F32_WIDE if wide else VecFunc.FROM_F32, rows=m,
                   cols=w, src0=src, dst=dst, p0=mult, p1=shift,
                   p2=lw.numerics.residual_bits if wide else 0,
                   wait=(b.sem(c, "in_vpu"),), signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=dst, dst=x + rb * a, nbytes=rb * w, rows=m,
                        dst_stride=rb * h, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


def head_rows_of(lw: Lowering, c: int) -> tuple[int, int] | None:
    r0, r1 = lw.rows(lw.model.vocab_size, c)
    return (r0, r1) if r1 > r0 else None


def stage_head(b: Builder, lw: Lowering, x_last: int) -> None:
    """Final RMSNorm of the last token and the LM head slices (int32 logits) -> io.logits.
    The wide pipeline's lean schedule streams each weight tile's logits out as it is done
    (:func:`stage_head_rows` of one row): its head also holds one int32 multiplier per
    vocabulary row, and a whole logits slice beside them would keep a decode step from
    the larger weight tiles."""
    cfg = lw.model
    h = cfg.hidden_size
    mh = lw.matrix(cfg.lm_head_tensor, lw.numerics.head, requant=False)  # wide: GemmRow
    logits = lw.mm["io.logits"].base
    if lw.lean:
        stage_head_rows(b, lw, x_last, 1, logits)
        return
    for c in lw.target.cores:
        rows = head_rows_of(lw, c)
        if rows is None:
            continue
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mh, rows)
        rb = residual_bytes(lw)
        xs = plan.take(rb * h, "last hidden state")
        b.load(c, x_last, xs, rb * h, to="in_vpu")
        xn = norm(b, lw, c, plan, "final_norm", lw.numerics.final_norm, xs, 1, h,
                   to="vpu_mxu")
        out = plan.take(4 * (rows[1] - rows[0]), "logits slice")
        b.gemm(c, mh, rows, a=xn, m=1, out=out, plan=plan, first_wait=(b.sem(c, "vpu_mxu"),),
               last_signal=(b.sem(c, "mxu_out"),), row_meta=row_meta(lw, xn, 1, h))
        b.emit(DmaStore(core=c, src=out, dst=logits + 4 * rows[0], nbytes=4 * (rows[1] - rows[0]),
                        wait=(b.sem(c, "mxu_out"),), signal=(b.shared("logits"),)))


def head_rows(lw: Lowering) -> int:
    """Rows per head tile: the most whose input, normed rows and two logits buffers fit a
    core's SRAM beside the weight tile buffers."""
    cfg = lw.model
    h = cfg.hidden_size
    mh = lw.matrix(cfg.lm_head_tensor, lw.numerics.head, requant=False)  # wide: GemmRow
    step = lw.target.tile_bytes // mh.row_bytes
    free = lw.target.sram_bytes - 2 * lw.target.tile_bytes - 2 * h - 4 * 64
    per_row = 2 * h + 2 * 4 * step
    if lw.numerics.wide:  # wide input, int32 norm output, int8 + row factors
        free -= 4 * lw.model.vocab_size // len(lw.target.cores) + 4 * 64
        per_row = (residual_bytes(lw) + 4 + 1) * h + ROW_META_BYTES + 2 * 4 * step
    return max(1, free // per_row)


def gather_rows(b: Builder, lw: Lowering, x: int, rows: list[tuple[int, int]]) -> None:
    """Copy tile rows ``(out index, row)`` of ``x`` (the tile's final hidden states) to
    ``act.last``, after every core's stores of the tile; every core's next load waits for
    the copies (the next tile overwrites ``x``)."""
    h = lw.model.hidden_size * residual_bytes(lw)  # bytes per row
    last = lw.mm[LAST_REGION].base
    # the cores whose stores wrote x: its column slices (stage E, or the input stage)
    hid = lw.model.hidden_size
    writers = [c for c in lw.target.cores if lw.rows(hid, c)[1] > lw.rows(hid, c)[0]]
    for c in writers:
        b.emit(Nop(core=c, on=Engine.DMA_OUT, signal=(b.shared("rows_stored"),)))
    runs: list[list[int]] = []  # [out index, row, count]
    for j, r in rows:
        if runs and runs[-1][0] + runs[-1][2] == j and runs[-1][1] + runs[-1][2] == r:
            runs[-1][2] += 1
        else:
            runs.append([j, r, 1])
    for i, (j, r, n) in enumerate(runs):
        b.emit(DmaCopy(src=x + r * h, dst=last + j * h, nbytes=n * h,
                       wait=(b.shared("rows_stored"),) * len(writers) if i == 0 else (),
                       signal=b.barrier() if i == len(runs) - 1 else ()))


def stage_head_rows(b: Builder, lw: Lowering, x: int, r: int, out: int) -> int:
    """Final RMSNorm of ``r`` gathered rows at ``x`` and the LM head (int32 logits) ->
    ``out`` (``r`` rows of ``vocab``), each weight tile's logits stored as it is done;
    returns how many stores signal the shared flag ``logits``."""
    cfg = lw.model
    h, vocab = cfg.hidden_size, cfg.vocab_size
    mh = lw.matrix(cfg.lm_head_tensor, lw.numerics.head, requant=False)  # wide: GemmRow
    t = lw.target
    done_stores = 0
    for c in t.cores:
        r0, r1 = lw.rows(vocab, c)
        if r1 <= r0:
            continue
        plan = SramPlan(t, c)
        b.prefetch(c, mh, (r0, r1))
        rb = residual_bytes(lw)
        xs = plan.take(rb * r * h, "last hidden states")
        b.load(c, x, xs, rb * r * h, to="in_vpu")
        xn = norm(b, lw, c, plan, "final_norm", lw.numerics.final_norm, xs, r, h,
                   to="vpu_mxu")
        scale = NO_ADDR
        if mh.gemm_row:  # the wide pipeline's head has per-vocab-row multipliers
            scale = plan.take(4 * (r1 - r0), "LM head multipliers")
            b.load(c, mh.p_addr + 4 * mh.n + 4 * r0, scale, 4 * (r1 - r0), to="in_mxu")
        tiles = b.weight_tiles(mh, (r0, r1))
        step = t.tile_bytes // mh.row_bytes
        obuf = [plan.take(4 * r * step, "logits tile"), plan.take(4 * r * step, "logits tile")]
        done = b.prefetched.pop((c, mh.name, (r0, r1)), 0)
        first_buf = (b.tiles[c] - done) % 2
        for i, (lo, hi) in enumerate(tiles):
            buf = (first_buf + i) % 2 if i < done else b.tile_load(c, mh, lo, hi)
            wait = (b.sem(c, f"ld{buf}"),)
            if i == 0:
                wait += (b.sem(c, "vpu_mxu"),)
                if scale != NO_ADDR:
                    wait += (b.sem(c, "in_mxu"),)
            if i >= 2:
                wait += (b.sem(c, "out_mxu"),)
            common = dict(core=c, m=r, k=mh.k, n=hi - lo, w_bits=mh.bits, a=xn,
                          w=buf * t.tile_bytes, out=obuf[i % 2], bias=NO_ADDR,
                          shift=mh.shift, out_stride=4 * (hi - lo) if r > 1 else 0, wait=wait,
                          signal=(b.sem(c, f"free{buf}"), b.sem(c, "mxu_out")))
            kind, extra = gemm_kind(mh)
            if mh.gemm_row:
                b.emit(kind(**common, **extra, scale=scale + 4 * (lo - r0),
                            row_meta=row_meta(lw, xn, r, h), row_shift=mh.row_shift,
                            out_bits=32))
            else:
                b.emit(kind(**common, **extra, scale=NO_ADDR))
            last = i == len(tiles) - 1
            b.emit(DmaStore(core=c, src=obuf[i % 2], dst=out + 4 * lo, nbytes=4 * (hi - lo),
                            rows=r, dst_stride=4 * vocab, wait=(b.sem(c, "mxu_out"),),
                            signal=(b.sem(c, "out_mxu"),)
                            + ((b.shared("logits"),) if last else ())))
        # the last two stores' credits: taken here, so the next head tile starts afresh
        b.emit(Nop(core=c, on=Engine.MXU, wait=(b.sem(c, "out_mxu"),) * min(2, len(tiles))))
        done_stores += 1
    return done_stores
