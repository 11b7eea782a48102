"""Grouped-query attention (GQA; MHA and MQA are its special cases), one block per model.

Work is split over the cores of the core mode by KV head (a KV head and its query heads on
one core, the core that also projects and appends that KV head). Per layer:

- A: RMSNorm, Q/K/V projections, RoPE, KV-cache append (by the core owning the KV head)
- B: attention of each core's query heads over the cache (the attention unit streams K/V
  from DRAM in their stored format); outputs to ``act.ao``
- C: O projection slice and residual add -> ``act.xm``

Each KV head's cache is ``num_kv_heads`` sub-caches of ``max_bytes(cap, head_dim)`` in
the regions ``kv.s<slot>.l<layer>.k`` and ``.v``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from isa.instructions import Attn, AttnDq, DmaStore, Engine, KvWrite, Nop, Vec, VecFunc, f32_bits
from isa.kvformats import KVFormat, KVPair

from ...config import ModelConfig
from ...reference import softmax_scale
from ..builder import Builder, Vary, remade
from ..kvspec import KvCacheSpec
from ..lowering import Lowering, TileSeq, kv_region
from ..memmap import MemoryMap
from ..numerics import AttnQ
from ..ops import norm, proj_residual, residual_bytes, row_meta
from ..sram import SramPlan


class GqaAttention:
    """:class:`~.base.AttentionBlock` of a GQA model."""

    kind = "gqa"
    components = ("k", "v")
    #: its memo keys by the tile's shape: it reads positions only in its varying
    #: instructions (:meth:`lower`), so whole calls replay (:mod:`..calltrace`)
    positions_as_args = True

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def kv_problem(self, kv: str) -> str | None:
        return None  # any K and V formats

    @property
    def cache_width(self) -> int:
        return self.cfg.head_dim

    def add_regions(self, mm: MemoryMap, *, pair: KVPair, cap: int, slots: int,
                    m_tile: int) -> None:
        cfg, hd = self.cfg, self.cfg.head_dim
        for s in range(slots):
            for layer in range(cfg.num_layers):
                mm.add(kv_region(s, layer, "k"), cfg.num_kv_heads * pair.k.max_bytes(cap, hd),
                       "kv_cache")
                mm.add(kv_region(s, layer, "v"), cfg.num_kv_heads * pair.v.max_bytes(cap, hd),
                       "kv_cache")

    def kv_specs(self, mm: MemoryMap, *, pair: KVPair, cap: int,
                 slots: int) -> list[KvCacheSpec]:
        cfg, hd = self.cfg, self.cfg.head_dim
        return [KvCacheSpec(name, s, layer, comp, mm[name], fmt, hd, cfg.num_kv_heads,
                            fmt.max_bytes(cap, hd))
                for s in range(slots) for layer in range(cfg.num_layers)
                for comp, fmt in (("k", pair.k), ("v", pair.v))
                for name in (kv_region(s, layer, comp),)]

    def lower(self, b: Builder, lw: Lowering, layer: int, x: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        # stages A and B read the tile's positions in a few instructions only (RoPE table
        # loads, cache appends, attention spans): replayed, with those made for ``segs``
        shape = tuple((sq.slot, sq.n, sq.off) for sq in segs)
        lw.memo.lower(b, ("attn", layer, x, m, shape),
                      lambda: _stage_attention(b, lw, layer, q, x, m, segs), args=segs)
        # stage C reads no position: decode steps and prefill tiles of a size share it
        lw.memo.lower(b, ("o", layer, x, m), lambda: self.stage_o(b, lw, layer, q, x, m))

    # --- per-layer hooks (a sliding-window variant overrides them: .sliding) -------------
    def layer_formats(self, lw: Lowering, layer: int) -> tuple[KVFormat, KVFormat, int, int]:
        """Layer ``layer``'s K and V formats and their indices in the program's table."""
        return lw.k_fmt, lw.v_fmt, 0, 1

    def key_span(self, lw: Lowering, layer: int, pos0: int, n: int) -> tuple[int, int]:
        """``(first, keys)``: the cache positions ``first .. first+keys-1`` that ``n``
        queries at ``pos0 ..`` attend to (all of the cache here)."""
        return 0, pos0 + n

    def rotates(self, layer: int) -> bool:
        """Whether layer ``layer`` applies RoPE to its queries and keys."""
        return True

    def extra_formats(self, lw: Lowering) -> tuple[KVFormat, ...]:
        """Formats the program's table lists after the K and V formats (none here)."""
        return ()

    def input_norm(self, b: Builder, lw: Lowering, c: int, plan: SramPlan, layer: int, q,
                   xs: int, m: int) -> int:
        """Normalise the layer input ``xs`` (loaded, on in_vpu) for the projections; the
        VPU signals vpu_mxu. Returns the normalised buffer."""
        return norm(b, lw, c, plan, f"layers.{layer}.attn_norm", q.attn_norm, xs, m,
                    lw.model.hidden_size, to="vpu_mxu")

    def head_norm_gains(self, b: Builder, lw: Lowering, c: int, plan: SramPlan,
                        layer: int) -> dict[str, int] | None:
        """Load the q and k head-norm gains (QK norm) and return their buffers, or None."""
        return None

    def stage_o(self, b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
        """O projection and residual add -> ``act.xm``."""
        _stage_o(b, lw, layer, q, x, m)



def head_units(lw: Lowering) -> dict[int, list[tuple[int, int, int]]]:
    """core -> [(kv_head, first q head, end q head)].

    Whole KV-head groups go to one core (the core that also projects and appends that
    KV head), so each KV head's cache is streamed from DRAM once per layer. With fewer
    KV heads than cores, some cores have no attention work; one core's DMA can still
    saturate DRAM, so decode attention stays bandwidth-bound rather than idle-bound.
    """
    cfg = lw.model
    group = cfg.num_heads // cfg.num_kv_heads
    out: dict[int, list[tuple[int, int, int]]] = {c: [] for c in lw.target.cores}
    for j in range(cfg.num_kv_heads):
        out[kv_owner(lw, j)].append((j, j * group, (j + 1) * group))
    return out


def kv_owner(lw: Lowering, j: int) -> int:
    """The core that projects, appends and attends over KV head ``j``."""
    return lw.target.cores[j % len(lw.target.cores)]


def _stage_attention(b: Builder, lw: Lowering, layer: int, q, x: int, m: int,
                     segs: tuple[TileSeq, ...]) -> None:
    """Stages A and B of a token tile; ``segs``: its pieces of sequences, each with its
    own cache slot and positions."""
    cfg = lw.model
    h, hd = cfg.hidden_size, cfg.head_dim
    p = f"layers.{layer}."
    units = head_units(lw)
    att = lw.blocks.attention  # per-layer formats, key spans and RoPE (GqaAttention hooks)
    kf, vf, ki, vi = att.layer_formats(lw, layer)
    rotates = att.rotates(layer)
    rot = hd
    cos = lw.mm["rope.cos"].base
    sin = lw.mm["rope.sin"].base
    k_sub = kf.max_bytes(lw.cap, hd)
    v_sub = vf.max_bytes(lw.cap, hd)
    kregs = [lw.mm[lw.kv_region(sq.slot, layer, "k")] for sq in segs]
    vregs = [lw.mm[lw.kv_region(sq.slot, layer, "v")] for sq in segs]
    mq = lw.matrix(p + "q_proj", q.q)
    mk = lw.matrix(p + "k_proj", q.k)
    mv = lw.matrix(p + "v_proj", q.v)
    held: dict[int, list[tuple[int, int, int, int, SramPlan]]] = {}
    # --- stage A: norm, projections, RoPE, cache append --------------------------------
    for c in lw.target.cores:
        owned = [j for j in range(cfg.num_kv_heads) if kv_owner(lw, j) == c]
        if not units[c] and not owned:
            continue
        plan = SramPlan(lw.target, c)
        if units[c]:
            j0, ha0, hb0 = units[c][0]
            b.prefetch(c, mq, (ha0 * hd, hb0 * hd))
        else:
            b.prefetch(c, mk, (owned[0] * hd, (owned[0] + 1) * hd))
        rb = residual_bytes(lw)
        xs = plan.take(rb * m * h, "layer input")
        b.load(c, x, xs, rb * m * h, to="in_vpu")
        xn = att.input_norm(b, lw, c, plan, layer, q, xs, m)
        meta = row_meta(lw, xn, m, h)
        tab = plan.take(2 * m * rot, "RoPE tables")
        for i, sq in enumerate(segs):  # per sequence: [cos | sin] of its positions
            t = tab + 2 * sq.off * rot
            b.load(c, cos + sq.rope0 * rot, t, sq.n * rot, to="in_vpu",
                   vary=_TableRows(i, cos, rot))
            b.load(c, sin + sq.rope0 * rot, t + sq.n * rot, sq.n * rot, to="in_vpu",
                   vary=_TableRows(i, sin, rot))
        gains = att.head_norm_gains(b, lw, c, plan, layer)
        first = (b.sem(c, "vpu_mxu"),)
        vpu_ops: list[tuple[str, int, int, int]] = []  # (kind, buf, width, kv head)
        held[c] = []
        for j, ha, hb in units[c]:
            qb = plan.take(m * (hb - ha) * hd, f"q heads {ha}..{hb - 1}")
            b.gemm(c, mq, (ha * hd, hb * hd), a=xn, m=m, out=qb, plan=plan, first_wait=first,
                   last_signal=(b.sem(c, "mxu_vpu"),), row_meta=meta)
            first = ()
            vpu_ops.append(("rope", qb, (hb - ha) * hd, j))
            held[c].append((j, ha, hb, qb, plan))
        for j in owned:
            kb = plan.take(m * hd, f"k head {j}")
            b.gemm(c, mk, (j * hd, (j + 1) * hd), a=xn, m=m, out=kb, plan=plan,
                   first_wait=first, last_signal=(b.sem(c, "mxu_vpu"),), row_meta=meta)
            first = ()
            vpu_ops.append(("k", kb, hd, j))
            vb = plan.take(m * hd, f"v head {j}")
            b.gemm(c, mv, (j * hd, (j + 1) * hd), a=xn, m=m, out=vb, plan=plan,
                   last_signal=(b.sem(c, "mxu_vpu"),), row_meta=meta)
            vpu_ops.append(("v", vb, hd, j))
        tables_taken = False
        for kind, buf, width, j in vpu_ops:
            wait = (b.sem(c, "mxu_vpu"),)
            if gains is not None and kind in ("rope", "k"):  # QK norm: each head, first
                if not tables_taken:  # the tables' and the gains' loads, in their order
                    wait += (b.sem(c, "in_vpu"),) * (2 * len(segs) + len(gains))
                    tables_taken = True
                nq = q.q_norm if kind == "rope" else q.k_norm
                b.emit(Vec(core=c, func=VecFunc.RMSNORM, rows=m * width // hd, cols=hd,
                           src0=buf, src1=gains["q" if kind == "rope" else "k"], dst=buf,
                           p0=nq.eps_q, p1=nq.shift, wait=wait))
                wait = ()
            if kind == "rope" and not rotates:  # no RoPE: the q heads are ready as they are
                b.emit(Nop(core=c, on=Engine.VPU, wait=wait))
                continue
            if kind in ("rope", "k") and rotates:
                if not tables_taken:
                    wait += (b.sem(c, "in_vpu"),) * (2 * len(segs))
                    tables_taken = True
                for sq in segs:
                    row = buf + sq.off * width
                    b.emit(Vec(core=c, func=VecFunc.ROPE, rows=sq.n, cols=width, src0=row,
                               src1=tab + 2 * sq.off * rot, dst=row, p0=hd, p1=rot,
                               wait=wait))
                    wait = ()
            if kind in ("k", "v"):
                fmt, regs, sub = (ki, kregs, k_sub) if kind == "k" else (vi, vregs, v_sub)
                for i, (sq, reg) in enumerate(zip(segs, regs, strict=True)):
                    b.emit(KvWrite(core=c, fmt=fmt, tokens=sq.n, width=hd, pos=sq.pos0,
                                   cap=lw.cap, src=buf + sq.off * hd, dst=reg.base + j * sub,
                                   nbytes=sub, wait=wait), _AppendAt(i))
                    wait = ()
        if not tables_taken:  # the tables were loaded for nothing: consume their credits
            b.emit(Nop(core=c, on=Engine.VPU, wait=(b.sem(c, "in_vpu"),) * (2 * len(segs))))
        b.emit(Nop(core=c, on=Engine.VPU, signal=(b.sem(c, "vpu_out"),)))
        b.emit(Nop(core=c, on=Engine.DMA_OUT, wait=(b.sem(c, "vpu_out"),),
                   signal=b.barrier()))
    # --- stage B: attention over the cache ---------------------------------------------
    ao = lw.mm["act.ao"].base
    qh = cfg.num_heads * hd

    def span(sq: TileSeq) -> dict[str, int]:
        """The fields of an attention instruction that follow the sequence's positions."""
        first, ctx = att.key_span(lw, layer, sq.pos0, sq.n)
        return {"ctx": ctx, "pos": sq.pos0 - first, "k_nbytes": kf.read_bytes(first, ctx, hd),
                "v_nbytes": vf.read_bytes(first, ctx, hd)}

    for c in lw.target.cores:
        if not held.get(c):
            continue
        b.emit(Nop(core=c, on=Engine.DMA_IN, wait=b.take_bar(c),
                   signal=(b.sem(c, "in_mxu"),)))
        wait = (b.sem(c, "in_mxu"),)
        outs = []
        for j, ha, hb, qb, plan in held[c]:
            ob = plan.take(m * (hb - ha) * hd, f"attention output heads {ha}..{hb - 1}")
            outs.append((ob, ha, hb))
            w = (hb - ha) * hd
            for i, (sq, kreg, vreg) in enumerate(zip(segs, kregs, vregs, strict=True)):
                b.emit(attention_instruction(
                    lw, layer, q.attn, core=c, q_len=sq.n, heads=hb - ha, kv_heads=1,
                    head_dim=hd, cap=lw.cap, k_fmt=ki, v_fmt=vi,
                    q=qb + sq.off * w, k=kreg.base + j * k_sub, v=vreg.base + j * v_sub,
                    out=ob + sq.off * w, wait=wait,
                    signal=(b.sem(c, "mxu_out"),) if i == len(segs) - 1 else (),
                    **span(sq)), _span_at(i, span))
                wait = ()
        for idx, (ob, ha, hb) in enumerate(outs):
            last = idx == len(outs) - 1
            b.emit(DmaStore(core=c, src=ob, dst=ao + ha * hd, nbytes=(hb - ha) * hd,
                            rows=m, dst_stride=qh, wait=(b.sem(c, "mxu_out"),),
                            signal=b.barrier() if last else ()))


@dataclass(frozen=True)
class _TableRows:
    """How a load of sequence ``i``'s rows of a per-position table (RoPE cos or sin)
    follows the positions (a :data:`~..builder.Vary`; equal ones make equal loads of one
    load, so a whole call's replay makes them once: :mod:`..calltrace`)."""

    i: int
    table: int
    row_bytes: int

    def __call__(self, ins, segs):
        return remade(ins, src=self.table + segs[self.i].rope0 * self.row_bytes)


@dataclass(frozen=True)
class _AppendAt:
    """How a cache append of sequence ``i``'s tokens follows its positions (a
    :data:`~..builder.Vary`)."""

    i: int

    def __call__(self, ins, segs):
        return remade(ins, pos=segs[self.i].pos0)


def _span_at(i: int, span: Callable[[TileSeq], dict[str, int]]) -> Vary:
    """An attention of sequence ``i``'s queries over its keys (``span``: those fields)."""
    return lambda ins, segs: remade(ins, **span(segs[i]))


def attention_instruction(lw: Lowering, layer: int, aq: AttnQ, **fields) -> Attn:
    """The attention of one KV head over the cache, by the read path (``bits.kv_read``):
    ``integer`` -> :class:`Attn` with the layer's fixed-point factors; ``dequant`` ->
    :class:`AttnDq` with the static scales of q, k, v and the attention output (1.0 in a
    timing-only compile, whose numerics are placeholders) and the model's softmax scale."""
    if lw.kv_read != "dequant":
        return Attn(**fields, score_mult=aq.score_mult, score_shift=aq.score_shift,
                    out_mult=aq.out_mult, out_shift=aq.out_shift)
    scales = lw.numerics.scales

    def scale(name: str) -> float:
        return float(scales.get(f"{layer}.{name}", 1.0))

    return AttnDq(**fields, q_scale_f32=f32_bits(scale("q")), k_scale_f32=f32_bits(scale("k")),
                  v_scale_f32=f32_bits(scale("v")),
                  softmax_scale_f32=f32_bits(softmax_scale(lw.model)),
                  out_scale_f32=f32_bits(1.0 / scale("ao")))


def _stage_o(b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """O projection slice + residual add -> act.xm."""
    cfg = lw.model
    proj_residual(b, lw, lw.matrix(f"layers.{layer}.o_proj", q.o), q.add1, m=m,
                   src=lw.mm["act.ao"].base, k=cfg.num_heads * cfg.head_dim,
                   resid=x, dst=lw.mm["act.xm"].base, what=("attention output", "o_proj"))
