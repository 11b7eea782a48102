"""Lowering a transformer forward pass to ISA programs.

One program runs ``n`` tokens of one cache slot starting at cache position ``cache_size``
(prefill: ``n`` > 1; a decode step: ``n`` = 1) and ends with the host reading the last
token's logits. The host writes the ``n`` input embeddings (float32) first; the tokens go
through the layers in *token tiles* of at most ``m_tile`` tokens whose activations fit in
SRAM.

Work is split over the cores of the core mode by output rows; attention, the Q/K/V
projections and the cache append by KV head (a KV head and its query heads on one core).
Each layer is a sequence of *stages*; a stage's outputs go to DRAM and the next stage's
loads wait until every core's outputs are there (a barrier through flags):

- A: RMSNorm, Q/K/V projections, RoPE, KV-cache append (by the core owning the KV head)
- B: attention of each core's query heads over the cache (the attention unit streams K/V
  from DRAM in their stored format); outputs to DRAM
- C: O projection slice and residual add; to DRAM
- D: RMSNorm, gate/up slices, SwiGLU; to DRAM
- E: down projection slice and residual add; to DRAM (the next layer's input)

Weights stream from DRAM through two SRAM tile buffers per core (double buffering: tile
``t+1`` loads while tile ``t`` multiplies). Flags are per-core counting semaphores, each
between one producer engine and one consumer engine with every signal matched by one
wait in order, so a handful of flags serve the whole program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from isa import kvformats
from isa.errors import ConfigError, DeviceError
from isa.instructions import (
    NO_ADDR,
    Attn,
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Instruction,
    KvWrite,
    Nop,
    Program,
    Vec,
    VecFunc,
)
from isa.kernels.fixed import quantize_multiplier

from ..config import ModelConfig
from .memmap import MemoryMap, align
from .numerics import GemmQ, Numerics

SRAM_ALIGN = 64

#: Per-core semaphores (producer engine -> consumer engine).
_SEMS = (
    "ld0", "ld1",  # DMA_IN -> MXU: weight tile in buffer 0/1
    "free0", "free1",  # MXU -> DMA_IN: buffer 0/1 free again
    "in_mxu",  # DMA_IN -> MXU
    "in_vpu",  # DMA_IN -> VPU
    "mxu_vpu",  # MXU -> VPU
    "vpu_mxu",  # VPU -> MXU
    "mxu_out",  # MXU -> DMA_OUT
    "vpu_out",  # VPU -> DMA_OUT
    "bar",  # any core's DMA_OUT, or the host link -> this core's DMA_IN
)
#: Every core's DMA_OUT -> the D2H engine: the logits slice is stored.
LOGITS_DONE = 1


class SramOverflow(DeviceError):
    """A weight tile or a stage buffer does not fit in a core's SRAM."""


@dataclass(frozen=True)
class TileSeq:
    """The tokens of one sequence inside a token tile (batched lowering): ``n`` tokens at
    rows ``off .. off+n-1`` of the tile, at cache positions ``pos0 .. pos0+n-1`` of cache
    slot ``slot``; ``route``: the MoE routing key of its first token (the next tokens
    count up from it; None: the tokens' positions, as one sequence's call routes them)."""

    slot: int
    pos0: int
    n: int
    off: int = 0
    route: int | None = None


@dataclass(frozen=True)
class Target:
    """What the lowering needs to know of the hardware and the core mode."""

    cores: tuple[int, ...]
    sram_bytes: int
    tile_bytes: int


def split(n: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """``[0, n)`` in ``parts`` contiguous ranges of whole ``unit``s, as even as possible."""
    units = -(-n // unit)
    out = []
    start = 0
    for p in range(parts):
        k = units // parts + (1 if p < units % parts else 0)
        end = min(n, start + k * unit)
        out.append((start, end))
        start = end
    return out


class SramPlan:
    """Bump allocation of one core's SRAM above its two weight tile buffers."""

    def __init__(self, target: Target, core: int):
        self.base = 2 * target.tile_bytes
        self.limit = target.sram_bytes
        self.top = self.base
        self.core = core

    def take(self, nbytes: int, what: str) -> int:
        addr = align(self.top, SRAM_ALIGN)
        if addr + nbytes > self.limit:
            raise SramOverflow(
                f"core {self.core}: {what} ({nbytes} bytes) does not fit in SRAM: "
                f"{addr - self.base} of {self.limit - self.base} bytes above the weight "
                f"tile buffers are in use"
            )
        self.top = addr + nbytes
        return addr


@dataclass(frozen=True)
class Matrix:
    """A weight matrix in DRAM: ``n`` rows of ``k`` values at ``bits``; its params region
    holds ``bias`` (int32[n]) then ``mult`` (int32[n])."""

    name: str
    n: int
    k: int
    bits: int
    w_addr: int
    p_addr: int
    has_bias: bool
    requant: bool  # int8 output; else int32 (the LM head)
    shift: int

    @property
    def row_bytes(self) -> int:
        return (self.k * self.bits + 7) // 8


@dataclass
class Builder:
    """Accumulates instructions and the per-core flag state."""

    target: Target
    ins: list[Instruction] = field(default_factory=list)
    tiles: dict[int, int] = field(default_factory=dict)  # core -> weight tiles issued
    bar_due: dict[int, int] = field(default_factory=dict)  # core -> bar credits to take
    prefetched: dict[tuple, int] = field(default_factory=dict)  # (core, matrix, rows) -> tiles

    def __post_init__(self) -> None:
        self._ids = {}
        for i, c in enumerate(self.target.cores):
            for j, name in enumerate(_SEMS):
                self._ids[(c, name)] = 16 + 16 * i + j
            self.tiles[c] = 0
            self.bar_due[c] = 0

    def sem(self, core: int, name: str) -> int:
        return self._ids[(core, name)]

    def emit(self, instr: Instruction) -> None:
        self.ins.append(instr)

    def take_bar(self, core: int) -> tuple[int, ...]:
        n = self.bar_due[core]
        self.bar_due[core] = 0
        return (self.sem(core, "bar"),) * n

    def barrier(self) -> tuple[int, ...]:
        """Signals a producer gives so that every core's next load waits for it."""
        for c in self.target.cores:
            self.bar_due[c] += 1
        return tuple(self.sem(c, "bar") for c in self.target.cores)

    def load(self, c: int, src: int, dst: int, nbytes: int, *, to: str, rows: int = 1,
             src_stride: int = 0, wait: tuple[int, ...] = ()) -> None:
        """DMA load that signals ``to`` (``"in_vpu"`` or ``"in_mxu"``); it also takes the
        barrier credits due."""
        self.emit(DmaLoad(core=c, src=src, dst=dst, nbytes=nbytes, rows=rows,
                          src_stride=src_stride, wait=self.take_bar(c) + wait,
                          signal=(self.sem(c, to),)))

    def _tile_load(self, c: int, mat: Matrix, lo: int, hi: int) -> int:
        """Load weight rows ``[lo, hi)`` into the next tile buffer; returns the buffer."""
        t = self.target
        k = self.tiles[c]
        self.tiles[c] += 1
        buf = k % 2
        self.emit(DmaLoad(core=c, src=mat.w_addr + lo * mat.row_bytes,
                          dst=buf * t.tile_bytes, nbytes=(hi - lo) * mat.row_bytes,
                          wait=(self.sem(c, f"free{buf}"),) if k >= 2 else (),
                          signal=(self.sem(c, f"ld{buf}"),)))
        return buf

    def _tiles(self, mat: Matrix, rows: tuple[int, int]) -> list[tuple[int, int]]:
        if mat.row_bytes > self.target.tile_bytes:
            raise SramOverflow(f"{mat.name}: one row of {mat.row_bytes} bytes exceeds the "
                               f"{self.target.tile_bytes}-byte weight tile buffer")
        step = self.target.tile_bytes // mat.row_bytes
        return [(lo, min(rows[1], lo + step)) for lo in range(rows[0], rows[1], step)]

    def prefetch(self, c: int, mat: Matrix, rows: tuple[int, int]) -> None:
        """Start loading the first weight tiles of a stage's first GEMM before the stage's
        activations: they need only free tile buffers, not the previous stage's results,
        so they stream while the other cores finish the previous stage."""
        tiles = self._tiles(mat, rows)[:2]
        for lo, hi in tiles:
            self._tile_load(c, mat, lo, hi)
        self.prefetched[(c, mat.name, rows)] = len(tiles)

    def gemm(self, c: int, mat: Matrix, rows: tuple[int, int], *, a: int, m: int, out: int,
             plan: SramPlan, first_wait: tuple[int, ...] = (),
             last_signal: tuple[int, ...] = ()) -> None:
        """``out[m, :] = a[m, k] @ W[r0:r1].T`` (row-major, ``r1 - r0`` columns) on core
        ``c``, tile by tile through the two weight buffers."""
        r0, r1 = rows
        nrows = r1 - r0
        t = self.target
        bias = scale = NO_ADDR
        wait0 = first_wait
        if mat.has_bias:
            bias = plan.take(4 * nrows, f"{mat.name} bias")
            self.load(c, mat.p_addr + 4 * r0, bias, 4 * nrows, to="in_mxu")
            wait0 += (self.sem(c, "in_mxu"),)
        if mat.requant:
            scale = plan.take(4 * nrows, f"{mat.name} multipliers")
            self.load(c, mat.p_addr + 4 * mat.n + 4 * r0, scale, 4 * nrows, to="in_mxu")
            wait0 += (self.sem(c, "in_mxu"),)
        elt = 1 if mat.requant else 4
        tiles = self._tiles(mat, rows)
        done = self.prefetched.pop((c, mat.name, rows), 0)
        first_buf = (self.tiles[c] - done) % 2
        for i, (lo, hi) in enumerate(tiles):
            buf = (first_buf + i) % 2 if i < done else self._tile_load(c, mat, lo, hi)
            off = lo - r0
            self.emit(Gemm(
                core=c, m=m, k=mat.k, n=hi - lo, w_bits=mat.bits, a=a,
                w=buf * t.tile_bytes, out=out + off * elt,
                bias=NO_ADDR if bias == NO_ADDR else bias + 4 * off,
                scale=NO_ADDR if scale == NO_ADDR else scale + 4 * off,
                shift=mat.shift, out_stride=nrows * elt if m > 1 else 0,
                wait=(self.sem(c, f"ld{buf}"),) + (wait0 if i == 0 else ()),
                signal=(self.sem(c, f"free{buf}"),) + (last_signal if i == len(tiles) - 1
                                                       else ()),
            ))


@dataclass(frozen=True)
class Lowering:
    """Everything needed to lower forward passes of one compiled model."""

    model: ModelConfig
    weight_bits: dict[str, int]  # tensor name -> bits
    k_fmt: kvformats.KVFormat
    v_fmt: kvformats.KVFormat
    cap: int  # cache capacity per slot, tokens
    max_seq: int  # most tokens per call
    m_tile: int  # most tokens per pass through the layers
    mm: MemoryMap
    numerics: Numerics
    target: Target

    # --- names ------------------------------------------------------------------------
    def check_call(self, n: int, cache_size: int) -> None:
        """Refuse a call of ``n`` tokens at cache position ``cache_size`` that this
        lowering cannot hold."""
        if n < 1:
            raise ConfigError(f"a call needs at least one token, got {n}")
        if n > self.max_seq:
            raise ConfigError(f"{n} tokens exceed the compiled max_sequence_length "
                              f"{self.max_seq}")
        if cache_size < 0 or cache_size + n > self.cap:
            raise ConfigError(f"cache_size {cache_size} + {n} tokens exceed the cache "
                              f"capacity {self.cap}")

    @staticmethod
    def kv_region(slot: int, layer: int, comp: str) -> str:
        return f"kv.s{slot}.l{layer}.{comp}"

    def matrix(self, name: str, gq: GemmQ, *, requant: bool = True) -> Matrix:
        spec = self.model.tensor_spec(name)
        n, k = spec.shape
        bias_name = name.replace("_proj", "_bias")
        try:
            has_bias = bias_name != name and bool(self.model.tensor_spec(bias_name))
        except ConfigError:
            has_bias = False
        return Matrix(name, n, k, self.weight_bits[name], self.mm[f"w.{name}"].base,
                      self.mm[f"p.{name}"].base, has_bias, requant, gq.shift)

    @property
    def formats(self) -> tuple[str, ...]:
        return (kvformats.to_text(self.k_fmt), kvformats.to_text(self.v_fmt))

    # --- assignment of work to cores --------------------------------------------------------
    def head_units(self) -> dict[int, list[tuple[int, int, int]]]:
        """core -> [(kv_head, first q head, end q head)].

        Whole KV-head groups go to one core (the core that also projects and appends that
        KV head), so each KV head's cache is streamed from DRAM once per layer. With fewer
        KV heads than cores, some cores have no attention work; one core's DMA can still
        saturate DRAM, so decode attention stays bandwidth-bound rather than idle-bound.
        """
        cfg = self.model
        group = cfg.num_heads // cfg.num_kv_heads
        out: dict[int, list[tuple[int, int, int]]] = {c: [] for c in self.target.cores}
        for j in range(cfg.num_kv_heads):
            out[self.kv_owner(j)].append((j, j * group, (j + 1) * group))
        return out

    def kv_owner(self, j: int) -> int:
        return self.target.cores[j % len(self.target.cores)]


def lower_forward(lw: Lowering, *, n: int, cache_size: int, slot: int = 0,
                  host_in: int = 0, host_out: int = 0, name: str = "") -> Program:
    """The program of one call with ``n`` tokens at cache position ``cache_size``."""
    cfg = lw.model
    if cfg.is_mla:
        raise NotImplementedError("MLA lowering lives in lower_mla")
    lw.check_call(n, cache_size)
    b = Builder(lw.target)
    cores = lw.target.cores
    h = cfg.hidden_size
    nq = lw.numerics
    emb = lw.mm["io.emb"].base
    b.emit(HostWrite(src=host_in, dst=emb, nbytes=4 * n * h, signal=b.barrier()))
    xbuf = [lw.mm["act.x0"].base, lw.mm["act.x1"].base]
    cur = 0
    for t0 in range(0, n, lw.m_tile):
        m = min(lw.m_tile, n - t0)
        pos0 = cache_size + t0
        _stage_input(b, lw, emb + 4 * t0 * h, xbuf[cur], m)
        for layer in range(cfg.num_layers):
            q = nq.layers[layer]
            _stage_attention(b, lw, layer, q, xbuf[cur], m, pos0, slot)
            _stage_o(b, lw, layer, q, xbuf[cur], m)
            _stage_mlp_up(b, lw, layer, q, m)
            _stage_mlp_down(b, lw, layer, q, xbuf[1 - cur], m)
            cur = 1 - cur
    _stage_head(b, lw, xbuf[cur] + (m - 1) * h)
    logits = lw.mm["io.logits"]
    b.emit(HostRead(src=logits.base, dst=host_out, nbytes=4 * cfg.vocab_size,
                    wait=(LOGITS_DONE,) * sum(1 for c in cores if _head_rows(lw, c))))
    return Program(tuple(b.ins), formats=lw.formats,
                   name=name or f"forward n={n} cache_size={cache_size} slot={slot}")


def _stage_input(b: Builder, lw: Lowering, emb: int, x: int, m: int) -> None:
    """float32 embeddings -> int8 residual stream, columns split over the cores."""
    h = lw.model.hidden_size
    mult, shift = quantize_multiplier(1.0 / lw.numerics.input_scale)
    for c, (a, e) in zip(lw.target.cores, split(h, len(lw.target.cores), 16), strict=True):
        if e <= a:
            continue
        w = e - a
        plan = SramPlan(lw.target, c)
        src = plan.take(4 * m * w, "embeddings")
        dst = plan.take(m * w, "input activations")
        b.load(c, emb + 4 * a, src, 4 * w, rows=m, src_stride=4 * h, to="in_vpu")
        b.emit(Vec(core=c, func=VecFunc.FROM_F32, rows=m, cols=w, src0=src, dst=dst, p0=mult,
                   p1=shift,
                   wait=(b.sem(c, "in_vpu"),), signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=dst, dst=x + a, nbytes=w, rows=m, dst_stride=h,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


def _norm(b: Builder, lw: Lowering, c: int, plan: SramPlan, norm: str, nq, x: int, m: int,
          width: int, *, to: str) -> int:
    """Load the gain of ``norm`` and RMS-normalise ``x`` (already loaded, signalled on
    in_vpu) into a new buffer; the VPU signals ``to``."""
    gamma = plan.take(2 * width, f"{norm} gain")
    b.load(c, lw.mm[f"p.{norm}"].base, gamma, 2 * width, to="in_vpu")
    out = plan.take(m * width, f"{norm} output")
    b.emit(Vec(core=c, func=VecFunc.RMSNORM, rows=m, cols=width, src0=x, src1=gamma, dst=out,
               p0=nq.eps_q, p1=nq.shift, wait=(b.sem(c, "in_vpu"),) * 2,
               signal=(b.sem(c, to),)))
    return out


def _stage_attention(b: Builder, lw: Lowering, layer: int, q, x: int, m: int, pos0: int,
                     slot: int, segs: tuple[TileSeq, ...] | None = None) -> None:
    """Stages A and B of a token tile. ``segs`` splits the tile into sequences with their
    own cache slots and positions (batched steps, :mod:`.lower_batch`); by default the
    tile is one sequence of ``m`` tokens at ``pos0`` in ``slot``."""
    segs = segs or (TileSeq(slot, pos0, m),)
    cfg = lw.model
    h, hd = cfg.hidden_size, cfg.head_dim
    p = f"layers.{layer}."
    units = lw.head_units()
    rot = hd
    cos = lw.mm["rope.cos"].base
    sin = lw.mm["rope.sin"].base
    k_sub = lw.k_fmt.max_bytes(lw.cap, hd)
    v_sub = lw.v_fmt.max_bytes(lw.cap, hd)
    kregs = [lw.mm[lw.kv_region(sq.slot, layer, "k")] for sq in segs]
    vregs = [lw.mm[lw.kv_region(sq.slot, layer, "v")] for sq in segs]
    mq = lw.matrix(p + "q_proj", q.q)
    mk = lw.matrix(p + "k_proj", q.k)
    mv = lw.matrix(p + "v_proj", q.v)
    held: dict[int, list[tuple[int, int, int, int, SramPlan]]] = {}
    # --- stage A: norm, projections, RoPE, cache append --------------------------------
    for c in lw.target.cores:
        owned = [j for j in range(cfg.num_kv_heads) if lw.kv_owner(j) == c]
        if not units[c] and not owned:
            continue
        plan = SramPlan(lw.target, c)
        if units[c]:
            j0, ha0, hb0 = units[c][0]
            b.prefetch(c, mq, (ha0 * hd, hb0 * hd))
        else:
            b.prefetch(c, mk, (owned[0] * hd, (owned[0] + 1) * hd))
        xs = plan.take(m * h, "layer input")
        b.load(c, x, xs, m * h, to="in_vpu")
        xn = _norm(b, lw, c, plan, p + "attn_norm", q.attn_norm, xs, m, h, to="vpu_mxu")
        tab = plan.take(2 * m * rot, "RoPE tables")
        for sq in segs:  # per sequence: [cos | sin] of its positions
            t = tab + 2 * sq.off * rot
            b.load(c, cos + sq.pos0 * rot, t, sq.n * rot, to="in_vpu")
            b.load(c, sin + sq.pos0 * rot, t + sq.n * rot, sq.n * rot, to="in_vpu")
        first = (b.sem(c, "vpu_mxu"),)
        vpu_ops: list[tuple[str, int, int, int]] = []  # (kind, buf, width, kv head)
        held[c] = []
        for j, ha, hb in units[c]:
            qb = plan.take(m * (hb - ha) * hd, f"q heads {ha}..{hb - 1}")
            b.gemm(c, mq, (ha * hd, hb * hd), a=xn, m=m, out=qb, plan=plan, first_wait=first,
                   last_signal=(b.sem(c, "mxu_vpu"),))
            first = ()
            vpu_ops.append(("rope", qb, (hb - ha) * hd, j))
            held[c].append((j, ha, hb, qb, plan))
        for j in owned:
            kb = plan.take(m * hd, f"k head {j}")
            b.gemm(c, mk, (j * hd, (j + 1) * hd), a=xn, m=m, out=kb, plan=plan,
                   first_wait=first, last_signal=(b.sem(c, "mxu_vpu"),))
            first = ()
            vpu_ops.append(("k", kb, hd, j))
            vb = plan.take(m * hd, f"v head {j}")
            b.gemm(c, mv, (j * hd, (j + 1) * hd), a=xn, m=m, out=vb, plan=plan,
                   last_signal=(b.sem(c, "mxu_vpu"),))
            vpu_ops.append(("v", vb, hd, j))
        tables_taken = False
        for kind, buf, width, j in vpu_ops:
            wait = (b.sem(c, "mxu_vpu"),)
            if kind in ("rope", "k"):
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
                fmt, regs, sub = (0, kregs, k_sub) if kind == "k" else (1, vregs, v_sub)
                for sq, reg in zip(segs, regs, strict=True):
                    b.emit(KvWrite(core=c, fmt=fmt, tokens=sq.n, width=hd, pos=sq.pos0,
                                   cap=lw.cap, src=buf + sq.off * hd, dst=reg.base + j * sub,
                                   nbytes=sub, wait=wait))
                    wait = ()
        if not tables_taken:  # the tables were loaded for nothing: consume their credits
            b.emit(Nop(core=c, on=Engine.VPU, wait=(b.sem(c, "in_vpu"),) * (2 * len(segs))))
        b.emit(Nop(core=c, on=Engine.VPU, signal=(b.sem(c, "vpu_out"),)))
        b.emit(Nop(core=c, on=Engine.DMA_OUT, wait=(b.sem(c, "vpu_out"),),
                   signal=b.barrier()))
    # --- stage B: attention over the cache ---------------------------------------------
    ao = lw.mm["act.ao"].base
    qh = cfg.num_heads * hd
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
                ctx = sq.pos0 + sq.n
                b.emit(Attn(core=c, q_len=sq.n, ctx=ctx, heads=hb - ha, kv_heads=1,
                            head_dim=hd, pos=sq.pos0, cap=lw.cap, k_fmt=0, v_fmt=1,
                            q=qb + sq.off * w, k=kreg.base + j * k_sub,
                            v=vreg.base + j * v_sub, out=ob + sq.off * w,
                            k_nbytes=lw.k_fmt.read_bytes(0, ctx, hd),
                            v_nbytes=lw.v_fmt.read_bytes(0, ctx, hd),
                            score_mult=q.attn.score_mult, score_shift=q.attn.score_shift,
                            out_mult=q.attn.out_mult, out_shift=q.attn.out_shift,
                            wait=wait,
                            signal=(b.sem(c, "mxu_out"),) if i == len(segs) - 1 else ()))
                wait = ()
        for idx, (ob, ha, hb) in enumerate(outs):
            last = idx == len(outs) - 1
            b.emit(DmaStore(core=c, src=ob, dst=ao + ha * hd, nbytes=(hb - ha) * hd,
                            rows=m, dst_stride=qh, wait=(b.sem(c, "mxu_out"),),
                            signal=b.barrier() if last else ()))


def _rows(lw: Lowering, n: int, c: int, unit: int = 16) -> tuple[int, int]:
    i = lw.target.cores.index(c)
    return split(n, len(lw.target.cores), unit)[i]


def _stage_o(b: Builder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """O projection slice + residual add -> act.xm."""
    cfg = lw.model
    _proj_residual(b, lw, lw.matrix(f"layers.{layer}.o_proj", q.o), q.add1, m=m,
                   src=lw.mm["act.ao"].base, k=cfg.num_heads * cfg.head_dim,
                   resid=x, dst=lw.mm["act.xm"].base, what=("attention output", "o_proj"))


def _proj_residual(b: Builder, lw: Lowering, mat, add, *, m: int, src: int, k: int,
                   resid: int, dst: int, what: tuple[str, str]) -> None:
    """Each core: its slice of ``mat`` @ ``src`` (``m`` rows of ``k``) plus the same slice of
    the residual ``resid`` (``m`` rows of hidden) -> ``dst``. ``what`` names the input and
    the projection for SRAM-overflow messages."""
    h = lw.model.hidden_size
    for c in lw.target.cores:
        r0, r1 = _rows(lw, h, c)
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


def _stage_mlp_up(b: Builder, lw: Lowering, layer: int, q, m: int) -> None:
    """RMSNorm, gate and up slices, SwiGLU -> act.hb."""
    cfg = lw.model
    h = cfg.hidden_size
    inter = cfg.intermediate_size
    p = f"layers.{layer}."
    mg = lw.matrix(p + "gate_proj", q.gate)
    mu = lw.matrix(p + "up_proj", q.up)
    xm = lw.mm["act.xm"].base
    hb = lw.mm["act.hb"].base
    for c in lw.target.cores:
        i0, i1 = _rows(lw, inter, c)
        if i1 <= i0:
            continue
        w = i1 - i0
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mg, (i0, i1))
        xs = plan.take(m * h, "MLP input")
        b.load(c, xm, xs, m * h, to="in_vpu")
        xn = _norm(b, lw, c, plan, p + "mlp_norm", q.mlp_norm, xs, m, h, to="vpu_mxu")
        g = plan.take(m * w, "gate output")
        u = plan.take(m * w, "up output")
        b.gemm(c, mg, (i0, i1), a=xn, m=m, out=g, plan=plan, first_wait=(b.sem(c, "vpu_mxu"),))
        b.gemm(c, mu, (i0, i1), a=xn, m=m, out=u, plan=plan,
               last_signal=(b.sem(c, "mxu_vpu"),))
        out = plan.take(m * w, "SwiGLU output")
        s = q.silu
        b.emit(Vec(core=c, func=VecFunc.SILU_MUL, rows=m, cols=w, src0=g, src1=u, dst=out,
                   p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                   wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
        b.emit(DmaStore(core=c, src=out, dst=hb + i0, nbytes=w, rows=m, dst_stride=inter,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


def _stage_mlp_down(b: Builder, lw: Lowering, layer: int, q, x_next: int, m: int) -> None:
    """down projection slice + residual add -> the next layer's input."""
    _proj_residual(b, lw, lw.matrix(f"layers.{layer}.down_proj", q.down), q.add2, m=m,
                   src=lw.mm["act.hb"].base, k=lw.model.intermediate_size,
                   resid=lw.mm["act.xm"].base, dst=x_next, what=("SwiGLU output", "down_proj"))


def _head_rows(lw: Lowering, c: int) -> tuple[int, int] | None:
    r0, r1 = _rows(lw, lw.model.vocab_size, c)
    return (r0, r1) if r1 > r0 else None


def _stage_head(b: Builder, lw: Lowering, x_last: int) -> None:
    """Final RMSNorm of the last token and the LM head slices (int32 logits) -> io.logits."""
    cfg = lw.model
    h = cfg.hidden_size
    mh = lw.matrix(cfg.lm_head_tensor, lw.numerics.head, requant=False)
    logits = lw.mm["io.logits"].base
    for c in lw.target.cores:
        rows = _head_rows(lw, c)
        if rows is None:
            continue
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mh, rows)
        xs = plan.take(h, "last hidden state")
        b.load(c, x_last, xs, h, to="in_vpu")
        xn = _norm(b, lw, c, plan, "final_norm", lw.numerics.final_norm, xs, 1, h,
                   to="vpu_mxu")
        out = plan.take(4 * (rows[1] - rows[0]), "logits slice")
        b.gemm(c, mh, rows, a=xn, m=1, out=out, plan=plan, first_wait=(b.sem(c, "vpu_mxu"),),
               last_signal=(b.sem(c, "mxu_out"),))
        b.emit(DmaStore(core=c, src=out, dst=logits + 4 * rows[0], nbytes=4 * (rows[1] - rows[0]),
                        wait=(b.sem(c, "mxu_out"),), signal=(LOGITS_DONE,)))
