"""Multi-head latent attention (MLA, DeepSeek-V2 style), for timing-only simulation: the
instruction stream, the bytes it moves and the arithmetic it does are those of the model;
its integer parameters are placeholders (functional MLA numerics are out of scope).

MLA attention runs in the *absorbed* form, so the cache holds one record per token and
layer, ``[normalised latent (kv_lora_rank) | RoPE key (qk_rope_head_dim)]``, in the single
region ``kv.s<slot>.l<layer>.c`` (format: the compiled KV layout's K format; the QuantMLA
formats quantize the last ``rope_width`` values of a record apart). ``W = kv_lora_rank +
qk_rope_head_dim`` is the record width and the attention head width. Per layer:

- A (every core): attention RMSNorm; the query path (``q_proj``, or ``q_a_proj`` ->
  ``q_a_norm`` -> ``q_b_proj``; with a query latent the ``q_a_proj`` rows are split over
  the cores in a stage A0 before A), split by heads over the cores, balancing weight
  bytes with the cache owner's work; per head, the absorption ``q_lat = q_nope @ W_UK``
  (the head's ``k_b_proj`` block, a GEMM of ``qk_nope_head_dim`` -> ``kv_lora_rank``: its
  bytes streamed as a ``kv_lora_rank x qk_nope_head_dim`` operand, as a compiler that
  stores ``k_b_proj`` transposed for the absorbed form would) and RoPE on the query's rope
  part; the score queries ``[q_lat | q_rope]`` go to ``act.qs``. The cache owner (one core
  per layer, rotating with the layer) also projects ``kv_a_proj`` (W outputs),
  RMS-normalises the latent, rotates the rope key and appends the record with one
  ``KvWrite``. For more than one token the two parts are joined into token records
  through ``act.kv`` (the vector unit has no strided output).
- B: ``Attn`` over the cache with ``kv_heads = 1`` and ``head_dim = W``: the latent is both
  key and value, so the cache is streamed once; the instruction's two DRAM streams split
  the stored cache's ``fmt.bytes(ctx, W)`` bytes in halves (K: the first, V: the rest),
  so together they read the cache exactly once (``v_nbytes = 0`` is not an option: the
  validator rejects zero-byte accesses). (The PV product is counted over W values
  per head, W - kv_lora_rank more than the latent.) Then per head the value
  up-projection ``v_b_proj`` (``kv_lora_rank`` -> ``v_head_dim``) of the output's latent
  part, into ``act.ao``. A decode step (one token) runs the whole stage on the cache owner,
  so the cache crosses DRAM once per layer; a prefill tile (arithmetic-bound) splits the
  heads over the cores, each streaming the cache.
- C: ``o_proj`` slices and the residual add (as GQA's stage C, with ``num_heads *
  v_head_dim`` inputs).

A tile of several sequences (a batched step) attends in two parts with a barrier between
(:func:`_stage_mla_attend_batch`).

Timing-only shortcuts (each moves the right bytes and does the right arithmetic, but would
not compute MLA/MoE values functionally): the absorption reads ``k_b_proj``'s bytes as its
transpose; ``Attn``'s V stream is the second half of the cache bytes, not a V cache; the
router's scores are computed and stored but the experts come from :func:`routed_experts`,
and the routing weights are not applied (plain ADDs); the PV product also runs over the
rope part of each record.
"""

from __future__ import annotations

from dataclasses import dataclass

from isa import kvformats
from isa.errors import KvsimError
from isa.instructions import Attn, DmaStore, Engine, KvWrite, Nop, Vec, VecFunc
from isa.kvformats import KVPair

from ...config import ModelConfig
from ..builder import Builder, Credits, Matrix, split
from ..kvspec import KvCacheSpec
from ..lowering import Lowering, TileSeq, kv_region
from ..memmap import MemoryMap
from ..ops import end_stage, norm, proj_residual
from ..sram import SramPlan


class MlaAttention:
    """:class:`~.base.AttentionBlock` of an MLA model."""

    kind = "mla"
    components = ("c",)

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def kv_problem(self, kv: str) -> str | None:
        return mla_kv_problem(self.cfg, kv)

    @property
    def cache_width(self) -> int:
        return mla_record_width(self.cfg)

    def add_regions(self, mm: MemoryMap, *, pair: KVPair, cap: int, slots: int,
                    m_tile: int) -> None:
        # per-head multipliers of the absorption GEMMs, one [latent | rope key] cache per
        # slot and layer, score queries, attention outputs
        cfg = self.cfg
        assert cfg.kv_lora_rank is not None
        w = mla_record_width(cfg)
        for layer in range(cfg.num_layers):
            mm.add(absorbed_params_region(layer), 8 * cfg.num_heads * cfg.kv_lora_rank,
                   "weights")
        for s in range(slots):
            for layer in range(cfg.num_layers):
                mm.add(kv_region(s, layer, "c"), pair.k.max_bytes(cap, w), "kv_cache")
        mm.add("act.qs", m_tile * cfg.num_heads * w, "activations")
        mm.add("act.lat", m_tile * cfg.num_heads * w, "activations")
        mm.add("act.kv", m_tile * w, "activations")
        if cfg.q_lora_rank:
            mm.add("act.qa", m_tile * cfg.q_lora_rank, "activations")

    def kv_specs(self, mm: MemoryMap, *, pair: KVPair, cap: int,
                 slots: int) -> list[KvCacheSpec]:
        w, fmt = mla_record_width(self.cfg), pair.k
        return [KvCacheSpec(name, s, layer, "c", mm[name], fmt, w, 1, fmt.max_bytes(cap, w))
                for s in range(slots) for layer in range(self.cfg.num_layers)
                for name in (kv_region(s, layer, "c"),)]

    def lower(self, b: Builder, lw: Lowering, layer: int, x: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        if self.cfg.q_lora_rank:
            _stage_q_latent(b, lw, layer, q, x, m)
        _stage_mla_prep(b, lw, layer, q, x, m, segs)
        if len(segs) == 1:
            _stage_mla_attend(b, lw, layer, q, m, segs[0].pos0, segs[0].slot)
        else:
            _stage_mla_attend_batch(b, lw, layer, q, m, segs)
        _stage_mla_o(b, lw, layer, q, x, m)


@dataclass(frozen=True)
class _Dims:
    h: int  # hidden size
    heads: int
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim
    kvr: int  # kv_lora_rank
    v: int  # v_head_dim
    qr: int  # q_lora_rank, 0 = no query latent

    @property
    def qhd(self) -> int:  # query head width (q_proj rows per head)
        return self.nope + self.rope

    @property
    def w(self) -> int:  # cache record and attention head width
        return self.kvr + self.rope

    @classmethod
    def of(cls, cfg: ModelConfig) -> _Dims:
        assert cfg.kv_lora_rank is not None and cfg.qk_rope_head_dim is not None
        assert cfg.qk_nope_head_dim is not None and cfg.v_head_dim is not None
        return cls(cfg.hidden_size, cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                   cfg.kv_lora_rank, cfg.v_head_dim, cfg.q_lora_rank or 0)


def mla_record_width(cfg: ModelConfig) -> int:
    """Values per token of an MLA cache record: ``kv_lora_rank + qk_rope_head_dim``."""
    return _Dims.of(cfg).w


def mla_kv_problem(cfg: ModelConfig, kv: str) -> str | None:
    """Why KV layout ``kv`` cannot hold ``cfg``'s MLA cache, or None: the cache is one
    record per token, so K and V must be one format, and a format that quantizes a RoPE
    part must cut it where the model's RoPE key is."""
    try:
        pair = kvformats.pair(kv)
    except KvsimError as err:
        return str(err)
    if pair.k != pair.v:
        return (f"{kv!r} has different K and V formats; an MLA model keeps one "
                f"[latent | rope key] cache per layer, so it needs one format")
    rope = pair.k.rope_width
    if rope and rope != cfg.qk_rope_head_dim:
        return (f"{kv!r} quantizes the last {rope} values of a record as the RoPE key; "
                f"model {cfg.name!r} has qk_rope_head_dim {cfg.qk_rope_head_dim}")
    return None


def cache_owner(lw: Lowering, layer: int) -> int:
    """The core that appends layer ``layer``'s cache and attends over it in a decode step
    (rotating with the layer)."""
    cores = lw.target.cores
    return cores[layer % len(cores)]


def _q_matrix(lw: Lowering, layer: int, q) -> Matrix:
    name = "q_b_proj" if lw.model.q_lora_rank else "q_proj"
    return lw.matrix(f"layers.{layer}.{name}", q.q)


def _absorbed(lw: Lowering, layer: int, q, head: int) -> Matrix:
    """Head ``head``'s block of ``k_b_proj`` as the absorption GEMM's operand: n =
    kv_lora_rank outputs of k = qk_nope_head_dim inputs (the same bytes), with its own
    multipliers (``p.layers.<i>.k_b_proj.absorbed``)."""
    d = _Dims.of(lw.model)
    kb = lw.matrix(f"layers.{layer}.k_b_proj", q.k)
    p = lw.mm[absorbed_params_region(layer)].base
    return Matrix(f"{kb.name}[head {head}]", d.kvr, d.nope, kb.bits,
                  kb.w_addr + head * d.nope * kb.row_bytes, p + 8 * d.kvr * head, False,
                  True, kb.shift)


def absorbed_params_region(layer: int) -> str:
    return f"p.layers.{layer}.k_b_proj.absorbed"


def _head_split(lw: Lowering, layer: int, q) -> dict[int, list[int]]:
    """core -> query heads of stage A: each head to the core with the fewest weight bytes
    so far, the cache owner starting with its ``kv_a_proj`` bytes."""
    d = _Dims.of(lw.model)
    mq = _q_matrix(lw, layer, q)
    kb = lw.matrix(f"layers.{layer}.k_b_proj", q.k)
    kv = lw.matrix(f"layers.{layer}.kv_a_proj", q.k)
    per_head = d.qhd * mq.row_bytes + d.nope * kb.row_bytes
    cores = lw.target.cores
    load = {c: 0 for c in cores}
    load[cache_owner(lw, layer)] += kv.n * kv.row_bytes
    out: dict[int, list[int]] = {c: [] for c in cores}
    for hd in range(d.heads):
        c = min(cores, key=lambda c: (load[c], cores.index(c)))
        out[c].append(hd)
        load[c] += per_head
    return out


def _attn_groups(lw: Lowering, layer: int, m: int) -> list[tuple[int, int, int]]:
    """(core, first head, end head) of stage B: the cache owner alone for one token, the
    heads split over the cores for more."""
    heads = lw.model.num_heads
    if m == 1:
        return [(cache_owner(lw, layer), 0, heads)]
    cores = lw.target.cores[: min(len(lw.target.cores), heads)]
    return [(c, a, e) for c, (a, e) in zip(cores, split(heads, len(cores)), strict=True)
            if e > a]




def _stage_q_latent(b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """A0 (models with a query latent): RMSNorm and ``q_a_proj`` row slices -> act.qa."""
    d = _Dims.of(lw.model)
    p = f"layers.{layer}."
    mqa = lw.matrix(p + "q_a_proj", q.q)
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


def _stage_mla_prep(b: Builder, lw: Lowering, layer: int, q, x: int, m: int,
                    segs: tuple[TileSeq, ...]) -> None:
    """A: query path, absorption and RoPE per head -> act.qs; the cache owner appends the
    layer's [latent | rope key] records. ``segs``: the tile's pieces of sequences, each
    with its own cache slot and positions."""
    cfg = lw.model
    d = _Dims.of(cfg)
    p = f"layers.{layer}."
    owner = cache_owner(lw, layer)
    split_heads = _head_split(lw, layer, q)
    mq = _q_matrix(lw, layer, q)
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
            b.prefetch(c, mkv, (0, d.w if m == 1 else d.kvr))
        in_vpu = Credits(b.sem(c, "in_vpu"))
        # inputs: the query latent (if any) first, then the normed layer input
        qin = xn = -1
        if d.qr and heads:
            qa = plan.take(m * d.qr, "q latent")
            b.load(c, lw.mm["act.qa"].base, qa, m * d.qr, to="in_vpu")
            qin = norm(b, lw, c, plan, p + "q_a_norm", q.attn_norm, qa, m, d.qr, to="vpu_mxu")
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
            b.gemm(c, _absorbed(lw, layer, q, hd), (0, d.kvr), a=qn, m=m, out=ql, plan=plan,
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
            _append_latent(b, lw, layer, q, c, plan, in_vpu, kv_wait, xn, tab, tables, m,
                           segs, cregs, mkv)
        rest = in_vpu.rest()
        if rest:  # loads nobody consumed (cannot happen today): take their credits
            b.emit(Nop(core=c, on=Engine.VPU, wait=rest))
        end_stage(b, c)


def _append_latent(b: Builder, lw: Lowering, layer: int, q, c: int, plan: SramPlan,
                   in_vpu: Credits, kv_wait: tuple[int, ...], xn: int, tab: int,
                   tables: int, m: int, segs: tuple[TileSeq, ...], cregs,
                   mkv: Matrix) -> None:
    """The cache owner's part of stage A: kv_a_proj, latent RMSNorm, RoPE key, KvWrite."""
    d = _Dims.of(lw.model)
    p = f"layers.{layer}."
    gamma = plan.take(2 * d.kvr, "kv_a_norm gain")
    b.load(c, lw.mm[f"p.{p}kv_a_norm"].base, gamma, 2 * d.kvr, to="in_vpu")
    g_ticket = in_vpu.issue()
    norm = q.attn_norm
    rec = plan.take(m * d.w, "cache records")
    if m == 1:
        b.gemm(c, mkv, (0, d.w), a=xn, m=1, out=rec, plan=plan, first_wait=kv_wait,
               last_signal=(b.sem(c, "mxu_vpu"),))
        lat = ln = rec
        rp = rec + d.kvr
    else:
        lat = plan.take(m * d.kvr, "latent")
        rp = plan.take(m * d.rope, "rope key")
        ln = plan.take(m * d.kvr, "normed latent")
        b.gemm(c, mkv, (0, d.kvr), a=xn, m=m, out=lat, plan=plan, first_wait=kv_wait)
        b.gemm(c, mkv, (d.kvr, d.w), a=xn, m=m, out=rp, plan=plan,
               last_signal=(b.sem(c, "mxu_vpu"),))
    b.emit(Vec(core=c, func=VecFunc.RMSNORM, rows=m, cols=d.kvr, src0=lat, src1=gamma, dst=ln,
               p0=norm.eps_q, p1=norm.shift,
               wait=(b.sem(c, "mxu_vpu"),) + in_vpu.upto(g_ticket)))
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


def mla_attention_bytes(fmt, ctx: int, width: int) -> tuple[int, int]:
    """(k_nbytes, v_nbytes) of an MLA ``Attn``: the bytes a read of the whole cache moves
    (header and records, :meth:`KVFormat.read_bytes`), streamed once, split in halves over
    the instruction's two streams."""
    total = fmt.read_bytes(0, ctx, width)
    return total - total // 2, total // 2


def _stage_mla_attend(b: Builder, lw: Lowering, layer: int, q, m: int, pos0: int,
                      slot: int) -> None:
    """B: attention over the latent cache, then v_b_proj per head -> act.ao."""
    d = _Dims.of(lw.model)
    p = f"layers.{layer}."
    qs = lw.mm["act.qs"].base
    ao = lw.mm["act.ao"].base
    lat = lw.mm["act.lat"].base
    creg = lw.mm[lw.kv_region(slot, layer, "c")]
    mvb = lw.matrix(p + "v_b_proj", q.v)
    ctx = pos0 + m
    kn, vn = mla_attention_bytes(lw.k_fmt, ctx, d.w)
    hw = d.heads * d.w
    for c, ha, hb in _attn_groups(lw, layer, m):
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


def _stage_mla_o(b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """C: o_proj slice (num_heads * v_head_dim inputs) + residual add -> act.xm."""
    d = _Dims.of(lw.model)
    proj_residual(b, lw, lw.matrix(f"layers.{layer}.o_proj", q.o), q.add1, m=m,
                   src=lw.mm["act.ao"].base, k=d.heads * d.v, resid=x,
                   dst=lw.mm["act.xm"].base, what=("value heads", "o_proj"))


def _stage_mla_attend_batch(b: Builder, lw: Lowering, layer: int, q, m: int,
                            segs: tuple[TileSeq, ...]) -> None:
    """B for a tile of several sequences, in two parts with a barrier between:

    1. attention: a decoding sequence (one token) attends on one core with every head,
       so its cache is streamed once (the sequences go round the cores from the layer's
       cache owner); a prefill piece splits its heads over the cores as a single
       sequence's prefill tile does. Outputs -> ``act.lat``.
    2. ``v_b_proj`` per head over all ``m`` rows of the tile (its weights streamed once per
       tile, not once per sequence), heads split over the cores -> ``act.ao``.
    """
    d = _Dims.of(lw.model)
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
            for c, ha, hb in _attn_groups(lw, layer, sq.n):
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

