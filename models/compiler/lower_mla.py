"""Lowering a DeepSeek-V2-style forward pass (MLA attention, MoE MLP) to ISA programs,
for timing-only simulation.

The programs have the shape of :func:`models.compiler.lower.lower_forward`'s (host input,
token tiles of at most ``m_tile`` tokens through the layers, per-core semaphores,
double-buffered weight tiles, a barrier between stages, the LM head of the last token)
and reuse its builder, SRAM plans, input stage, dense MLP stages and LM head. Their
integer parameters are placeholders (:meth:`Numerics.placeholder`): the instruction
stream, the bytes it moves and the arithmetic it does are those of the model, the values
it computes are not (functional MLA/MoE numerics are out of scope).

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

MLP: layers below ``first_k_dense_replace`` use the dense stages D and E of the GQA
lowering. A MoE layer runs

- D' (every core): MLP RMSNorm; the router GEMM (``n_routed_experts`` scores) and a
  softmax on the last core; a slice of the shared experts' gate/up rows and SwiGLU to
  ``act.hb``; the routed experts. The experts are chosen deterministically for timing
  (:func:`routed_experts`: a hash of the layer and the token's cache position picks
  ``num_experts_per_tok`` distinct experts), so a decode step reads only its token's
  experts' weights and a tile of tokens the union of its tokens' experts. Active experts
  go round-robin to the cores (most tokens first); each is a whole SwiGLU (gate, up, down)
  over the tokens routed to it (GEMM ``m`` = its token count): their rows are gathered
  from the normed input with vector copies, and the outputs scatter-added into the core's
  partial sum, which goes to ``act.moe``.
- E' (every core, an output-column slice): the shared experts' down projection slice,
  plus the residual, plus every core's routed partial sum (vector ADDs) -> the next
  layer's input.

SRAM use does not depend on the routing (buffers are sized for the worst case and reused
expert after expert, the engines' program order making the reuse safe), so the token
tile fitted at one position fits at every position; :func:`probe_layers` lets the tile
fit lower one layer of each kind instead of the whole model.

Timing-only shortcuts (each moves the right bytes and does the right arithmetic, but would
not compute MLA/MoE values functionally): the absorption reads ``k_b_proj``'s bytes as its
transpose; ``Attn``'s V stream is the second half of the cache bytes, not a V cache; the
router's scores are computed and stored but the experts come from :func:`routed_experts`,
and the routing weights are not applied (plain ADDs); the PV product also runs over the
rope part of each record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from isa import kvformats
from isa.errors import ConfigError, KvsimError
from isa.instructions import (
    Attn,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    KvWrite,
    Nop,
    Program,
    Vec,
    VecFunc,
)

from ..config import ModelConfig
from .lower import (
    _SEMS,
    LOGITS_DONE,
    Builder,
    Lowering,
    Matrix,
    SramPlan,
    TileSeq,
    _head_rows,
    _norm,
    _proj_residual,
    _rows,
    _stage_head,
    _stage_input,
    _stage_mlp_down,
    _stage_mlp_up,
    split,
)

#: Seed of the timing-only expert choice (:func:`routed_experts`).
ROUTING_SEED = 0
#: Semaphores the MLA lowering adds to each core's set (ids after lower.py's).
_MLA_SEMS = ("out_in",)  # DMA_OUT -> DMA_IN of the same core: a store the core reloads
_SEMS_PER_CORE = 16  # lower.Builder numbers each core's semaphores in blocks of 16
_MASK64 = (1 << 64) - 1


# --- routing (timing only) ----------------------------------------------------------------

def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def routed_experts(cfg: ModelConfig, layer: int, pos: int, *,
                   seed: int = ROUTING_SEED) -> tuple[int, ...]:
    """The ``num_experts_per_tok`` distinct routed experts (ascending) that the token at
    cache position ``pos`` uses in MoE layer ``layer``, for timing-only programs: a hash
    of ``(seed, layer, pos)``, spread uniformly over the experts like a balanced router."""
    if not cfg.layer_is_moe(layer):
        raise ConfigError(f"layer {layer} of {cfg.name!r} has no routed experts")
    assert cfg.n_routed_experts is not None and cfg.num_experts_per_tok is not None
    key = _mix64(_mix64(_mix64(seed) ^ layer) ^ pos)
    chosen: list[int] = []
    i = 0
    while len(chosen) < cfg.num_experts_per_tok:
        e = _mix64(key + i) % cfg.n_routed_experts
        if e not in chosen:
            chosen.append(e)
        i += 1
    return tuple(sorted(chosen))


def expert_tokens(cfg: ModelConfig, layer: int, pos0: int, m: int, *,
                  seed: int = ROUTING_SEED,
                  keys: Sequence[int] | None = None) -> dict[int, list[int]]:
    """Active expert -> the tokens (indices ``0..m-1`` of the tile at ``pos0``) routed to
    it, experts ascending. ``keys`` replaces the positions ``pos0 + t`` as the tokens'
    routing keys (a batched tile of several sequences: :func:`tile_keys`)."""
    if keys is None:
        keys = range(pos0, pos0 + m)
    out: dict[int, list[int]] = {}
    for t, key in enumerate(keys):
        for e in routed_experts(cfg, layer, key, seed=seed):
            out.setdefault(e, []).append(t)
    return dict(sorted(out.items()))


def tile_keys(segs: Sequence[TileSeq]) -> tuple[int, ...]:
    """Routing keys of a batched tile's tokens: each piece's own (:attr:`TileSeq.route`,
    counting up over its tokens), so that sequences at the same position route apart; a
    piece without one routes by position, as :func:`lower_forward_mla` routes a call."""
    return tuple((sq.pos0 if sq.route is None else sq.route) + t
                 for sq in segs for t in range(sq.n))


def _runs(tokens: list[int]) -> list[tuple[int, int, int]]:
    """Runs of consecutive token indices: ``(first token, length, offset in the list)``."""
    runs: list[tuple[int, int, int]] = []
    for off, t in enumerate(tokens):
        if runs and runs[-1][0] + runs[-1][1] == t:
            t0, n, o = runs[-1]
            runs[-1] = (t0, n + 1, o)
        else:
            runs.append((t, 1, off))
    return runs


# --- builder extensions ------------------------------------------------------------------

@dataclass
class MlaBuilder(Builder):
    """:class:`Builder` with the MLA lowering's extra per-core semaphores and GEMMs whose
    output rows land in a wider row-major buffer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(_SEMS) + len(_MLA_SEMS) > _SEMS_PER_CORE:
            raise AssertionError("too many semaphores per core")
        for c in self.target.cores:  # after the core's own block of lower.py semaphores
            base = self.sem(c, _SEMS[0])
            for j, name in enumerate(_MLA_SEMS, start=len(_SEMS)):
                self._ids[(c, name)] = base + j

    def gemm_into(self, c: int, mat: Matrix, rows: tuple[int, int], *, a: int, m: int,
                  out: int, row_stride: int, plan: SramPlan,
                  first_wait: tuple[int, ...] = (), last_signal: tuple[int, ...] = ()) -> None:
        """:meth:`Builder.gemm` writing output row ``i`` at ``out + i * row_stride`` (its
        tiles pack rows of the GEMM's own width)."""
        start = len(self.ins)
        self.gemm(c, mat, rows, a=a, m=m, out=out, plan=plan, first_wait=first_wait,
                  last_signal=last_signal)
        if m > 1:
            for i in range(start, len(self.ins)):
                ins = self.ins[i]
                if isinstance(ins, Gemm):
                    self.ins[i] = ins.replace(out_stride=row_stride)


class _Credits:
    """Loads that signal one semaphore, in their DMA order. Counting semaphores cannot tell
    loads apart, so a consumer waits for every credit up to the last load it needs."""

    def __init__(self, sem: int):
        self.sem = sem
        self.issued = 0
        self.taken = 0

    def issue(self) -> int:
        self.issued += 1
        return self.issued

    def skip(self, n: int) -> None:
        """``n`` credits taken by code that waits for them itself (``_norm``)."""
        self.issued += n
        self.taken += n

    def upto(self, ticket: int) -> tuple[int, ...]:
        n = max(0, ticket - self.taken)
        self.taken = max(self.taken, ticket)
        return (self.sem,) * n

    def rest(self) -> tuple[int, ...]:
        return self.upto(self.issued)


# --- shapes and work assignment ---------------------------------------------------------

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


# --- the program --------------------------------------------------------------------------

def probe_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """One layer of each kind (dense MLP, MoE): every layer of a kind needs the same SRAM
    (the work split rotates over the cores with the layer, the routing changes no buffer
    size), so lowering these few layers tells whether a token tile fits."""
    kinds: dict[bool, int] = {}
    for layer in range(cfg.num_layers):
        kinds.setdefault(cfg.layer_is_moe(layer), layer)
    return tuple(sorted(kinds.values()))


def lower_forward_mla(lw: Lowering, *, n: int, cache_size: int, slot: int = 0,
                      host_in: int = 0, host_out: int = 0, name: str = "",
                      layers: tuple[int, ...] | None = None) -> Program:
    """The program of one call of an MLA model with ``n`` tokens at cache position
    ``cache_size`` (timing only: placeholder integer parameters). ``layers`` lowers only
    those layers (an SRAM probe, :func:`probe_layers`; not a forward pass)."""
    cfg = lw.model
    if not cfg.is_mla:
        raise ConfigError(f"model {cfg.name!r} is not an MLA model; use lower_forward")
    lw.check_call(n, cache_size)
    b = MlaBuilder(lw.target)
    h = cfg.hidden_size
    emb = lw.mm["io.emb"].base
    b.emit(HostWrite(src=host_in, dst=emb, nbytes=4 * n * h, signal=b.barrier()))
    xbuf = [lw.mm["act.x0"].base, lw.mm["act.x1"].base]
    cur = 0
    m = 1
    for t0 in range(0, n, lw.m_tile):
        m = min(lw.m_tile, n - t0)
        pos0 = cache_size + t0
        _stage_input(b, lw, emb + 4 * t0 * h, xbuf[cur], m)
        for layer in range(cfg.num_layers) if layers is None else layers:
            q = lw.numerics.layers[layer]
            if cfg.q_lora_rank:
                _stage_q_latent(b, lw, layer, q, xbuf[cur], m)
            _stage_mla_prep(b, lw, layer, q, xbuf[cur], m, pos0, slot)
            _stage_mla_attend(b, lw, layer, q, m, pos0, slot)
            _stage_mla_o(b, lw, layer, q, xbuf[cur], m)
            if cfg.layer_is_moe(layer):
                _stage_moe_experts(b, lw, layer, q, m, pos0)
                _stage_moe_combine(b, lw, layer, q, xbuf[1 - cur], m, pos0)
            else:
                _stage_mlp_up(b, lw, layer, q, m)
                _stage_mlp_down(b, lw, layer, q, xbuf[1 - cur], m)
            cur = 1 - cur
    _stage_head(b, lw, xbuf[cur] + (m - 1) * h)
    logits = lw.mm["io.logits"]
    b.emit(HostRead(src=logits.base, dst=host_out, nbytes=4 * cfg.vocab_size,
                    wait=(LOGITS_DONE,) * sum(1 for c in lw.target.cores
                                              if _head_rows(lw, c))))
    return Program(tuple(b.ins), formats=lw.formats,
                   name=name or f"forward n={n} cache_size={cache_size} slot={slot}")


def _end_stage(b: MlaBuilder, c: int) -> None:
    """The core's vector unit is done, then its stores: signal the stage barrier."""
    b.emit(Nop(core=c, on=Engine.VPU, signal=(b.sem(c, "vpu_out"),)))
    b.emit(Nop(core=c, on=Engine.DMA_OUT, wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))


def _stage_q_latent(b: MlaBuilder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """A0 (models with a query latent): RMSNorm and ``q_a_proj`` row slices -> act.qa."""
    d = _Dims.of(lw.model)
    p = f"layers.{layer}."
    mqa = lw.matrix(p + "q_a_proj", q.q)
    qa = lw.mm["act.qa"].base
    for c in lw.target.cores:
        r0, r1 = _rows(lw, d.qr, c)
        if r1 <= r0:
            continue
        plan = SramPlan(lw.target, c)
        b.prefetch(c, mqa, (r0, r1))
        xs = plan.take(m * d.h, "layer input")
        b.load(c, x, xs, m * d.h, to="in_vpu")
        xn = _norm(b, lw, c, plan, p + "attn_norm", q.attn_norm, xs, m, d.h, to="vpu_mxu")
        out = plan.take(m * (r1 - r0), "q_a_proj output")
        b.gemm(c, mqa, (r0, r1), a=xn, m=m, out=out, plan=plan,
               first_wait=(b.sem(c, "vpu_mxu"),), last_signal=(b.sem(c, "mxu_out"),))
        b.emit(DmaStore(core=c, src=out, dst=qa + r0, nbytes=r1 - r0, rows=m, dst_stride=d.qr,
                        wait=(b.sem(c, "mxu_out"),), signal=b.barrier()))


def _stage_mla_prep(b: MlaBuilder, lw: Lowering, layer: int, q, x: int, m: int, pos0: int,
                    slot: int, segs: tuple[TileSeq, ...] | None = None) -> None:
    """A: query path, absorption and RoPE per head -> act.qs; the cache owner appends the
    layer's [latent | rope key] records. ``segs`` splits the tile into sequences with
    their own cache slots and positions (batched steps); by default one sequence."""
    segs = segs or (TileSeq(slot, pos0, m),)
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
        in_vpu = _Credits(b.sem(c, "in_vpu"))
        # inputs: the query latent (if any) first, then the normed layer input
        qin = xn = -1
        if d.qr and heads:
            qa = plan.take(m * d.qr, "q latent")
            b.load(c, lw.mm["act.qa"].base, qa, m * d.qr, to="in_vpu")
            qin = _norm(b, lw, c, plan, p + "q_a_norm", q.attn_norm, qa, m, d.qr, to="vpu_mxu")
            in_vpu.skip(2)
        if own or not d.qr:
            xs = plan.take(m * d.h, "layer input")
            b.load(c, x, xs, m * d.h, to="in_vpu")
            xn = _norm(b, lw, c, plan, p + "attn_norm", q.attn_norm, xs, m, d.h, to="vpu_mxu")
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
        _end_stage(b, c)


def _append_latent(b: MlaBuilder, lw: Lowering, layer: int, q, c: int, plan: SramPlan,
                   in_vpu: _Credits, kv_wait: tuple[int, ...], xn: int, tab: int,
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


def _stage_mla_attend(b: MlaBuilder, lw: Lowering, layer: int, q, m: int, pos0: int,
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


def _stage_mla_o(b: MlaBuilder, lw: Lowering, layer: int, q, x: int, m: int) -> None:
    """C: o_proj slice (num_heads * v_head_dim inputs) + residual add -> act.xm."""
    d = _Dims.of(lw.model)
    _proj_residual(b, lw, lw.matrix(f"layers.{layer}.o_proj", q.o), q.add1, m=m,
                   src=lw.mm["act.ao"].base, k=d.heads * d.v, resid=x,
                   dst=lw.mm["act.xm"].base, what=("value heads", "o_proj"))


def _shared_width(cfg: ModelConfig) -> int:
    assert cfg.moe_intermediate_size is not None
    return (cfg.n_shared_experts or 0) * cfg.moe_intermediate_size


def _expert_cores(lw: Lowering, layer: int, pos0: int, m: int,
                  keys: Sequence[int] | None = None) -> dict[int, list[tuple[int, list[int]]]]:
    """core -> [(expert, its tokens)]: active experts round-robin over the cores, most
    tokens first."""
    routing = expert_tokens(lw.model, layer, pos0, m, keys=keys)
    order = sorted(routing.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    cores = lw.target.cores
    out: dict[int, list[tuple[int, list[int]]]] = {c: [] for c in cores}
    for i, (e, toks) in enumerate(order):
        out[cores[i % len(cores)]].append((e, toks))
    return out


def _max_active(lw: Lowering, m: int) -> int:
    cfg = lw.model
    assert cfg.n_routed_experts is not None and cfg.num_experts_per_tok is not None
    return min(cfg.n_routed_experts, m * cfg.num_experts_per_tok)


def _stage_moe_experts(b: MlaBuilder, lw: Lowering, layer: int, q, m: int, pos0: int,
                       keys: Sequence[int] | None = None) -> None:
    """D': MLP RMSNorm; router + softmax (last core) -> act.router; shared gate/up slices
    and SwiGLU -> act.hb; the core's routed experts, summed per token -> act.moe. ``keys``:
    the tokens' routing keys (default: their positions ``pos0 + t``)."""
    cfg = lw.model
    assert cfg.n_routed_experts is not None and cfg.moe_intermediate_size is not None
    h, inter, ne = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    ws = _shared_width(cfg)
    p = f"layers.{layer}."
    cores = lw.target.cores
    router_core = cores[-1]
    experts = _expert_cores(lw, layer, pos0, m, keys)
    contributors = [c for c in cores if experts[c]]
    per_core_bound = -(-_max_active(lw, m) // len(cores))
    xm = lw.mm["act.xm"].base
    hb = lw.mm["act.hb"].base
    moe = lw.mm["act.moe"].base
    s = q.silu
    for c in cores:
        s0, s1 = _rows(lw, ws, c) if ws else (0, 0)
        mine = experts[c]
        if s1 <= s0 and not mine and c != router_core:
            continue
        plan = SramPlan(lw.target, c)
        mr = lw.matrix(p + "router", q.gate)
        if c == router_core:  # the stage's first GEMM
            b.prefetch(c, mr, (0, ne))
        elif s1 > s0:
            b.prefetch(c, lw.matrix(p + "shared.gate_proj", q.gate), (s0, s1))
        else:
            b.prefetch(c, lw.matrix(f"{p}experts.{mine[0][0]}.gate_proj", q.gate), (0, inter))
        xs = plan.take(m * h, "MLP input")
        b.load(c, xm, xs, m * h, to="in_vpu")
        xn = _norm(b, lw, c, plan, p + "mlp_norm", q.mlp_norm, xs, m, h, to="vpu_mxu")
        first = (b.sem(c, "vpu_mxu"),)
        if c == router_core:
            rt = plan.take(m * ne, "router scores")
            b.gemm(c, mr, (0, ne), a=xn, m=m, out=rt, plan=plan, first_wait=first,
                   last_signal=(b.sem(c, "mxu_vpu"),))
            first = ()
            b.emit(Vec(core=c, func=VecFunc.SOFTMAX, rows=m, cols=ne, src0=rt, dst=rt,
                       p0=1, wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
            b.emit(DmaStore(core=c, src=rt, dst=lw.mm["act.router"].base, nbytes=m * ne,
                            wait=(b.sem(c, "vpu_out"),)))
        if s1 > s0:
            w = s1 - s0
            g = plan.take(m * w, "shared gate output")
            u = plan.take(m * w, "shared up output")
            b.gemm(c, lw.matrix(p + "shared.gate_proj", q.gate), (s0, s1), a=xn, m=m, out=g,
                   plan=plan, first_wait=first)
            first = ()
            b.gemm(c, lw.matrix(p + "shared.up_proj", q.up), (s0, s1), a=xn, m=m, out=u,
                   plan=plan, last_signal=(b.sem(c, "mxu_vpu"),))
            b.emit(Vec(core=c, func=VecFunc.SILU_MUL, rows=m, cols=w, src0=g, src1=u, dst=g,
                       p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                       wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
            b.emit(DmaStore(core=c, src=g, dst=hb + s0, nbytes=w, rows=m, dst_stride=ws,
                            wait=(b.sem(c, "vpu_out"),)))
        # routed experts: buffers for the worst case (m tokens), reused expert by expert
        part = plan.take(m * h, "routed partial sum")
        gathered = plan.take(m * h, "routed expert input")
        g = plan.take(m * inter, "expert gate output")
        u = plan.take(m * inter, "expert up output")
        y = plan.take(m * h, "expert output")
        if mine:
            add = q.add2
            b.emit(Vec(core=c, func=VecFunc.ADD, rows=m, cols=h, src0=part, src1=part,
                       dst=part, p0=0, p1=0, p2=0))  # 0*a + 0*b: zero the partial sum
        for e, toks in mine:
            pe = f"{p}experts.{e}."
            me = len(toks)
            runs = _runs(toks)
            a = xn
            wait = first
            if me < m:
                for i, (t0, n, off) in enumerate(runs):
                    b.emit(Vec(core=c, func=VecFunc.COPY, rows=n, cols=h, src0=xn + t0 * h,
                               dst=gathered + off * h,
                               signal=(b.sem(c, "vpu_mxu"),) if i == len(runs) - 1 else ()))
                a = gathered
                wait += (b.sem(c, "vpu_mxu"),)
            first = ()
            b.gemm(c, lw.matrix(pe + "gate_proj", q.gate), (0, inter), a=a, m=me, out=g,
                   plan=plan, first_wait=wait)
            b.gemm(c, lw.matrix(pe + "up_proj", q.up), (0, inter), a=a, m=me, out=u,
                   plan=plan, last_signal=(b.sem(c, "mxu_vpu"),))
            b.emit(Vec(core=c, func=VecFunc.SILU_MUL, rows=me, cols=inter, src0=g, src1=u,
                       dst=g, p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                       wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_mxu"),)))
            b.gemm(c, lw.matrix(pe + "down_proj", q.down), (0, h), a=g, m=me, out=y,
                   plan=plan, first_wait=(b.sem(c, "vpu_mxu"),),
                   last_signal=(b.sem(c, "mxu_vpu"),))
            for i, (t0, n, off) in enumerate(runs):
                b.emit(Vec(core=c, func=VecFunc.ADD, rows=n, cols=h, src0=part + t0 * h,
                           src1=y + off * h, dst=part + t0 * h, p0=add.ma, p1=add.mb,
                           p2=add.shift, wait=(b.sem(c, "mxu_vpu"),) if i == 0 else ()))
        # multipliers of the experts this core may get at other positions
        spare = per_core_bound - len(mine)
        if spare > 0:
            plan.take(spare * 4 * (2 * inter + h), "multipliers of more experts")
        if mine:
            b.emit(Nop(core=c, on=Engine.VPU, signal=(b.sem(c, "vpu_out"),)))
            b.emit(DmaStore(core=c, src=part, dst=moe + contributors.index(c) * lw.m_tile * h,
                            nbytes=m * h, wait=(b.sem(c, "vpu_out"),)))
        _end_stage(b, c)


def _stage_moe_combine(b: MlaBuilder, lw: Lowering, layer: int, q, x_next: int, m: int,
                       pos0: int, keys: Sequence[int] | None = None) -> None:
    """E': shared down-projection slice + residual + the routed partial sums -> the next
    layer's input."""
    cfg = lw.model
    h = cfg.hidden_size
    ws = _shared_width(cfg)
    p = f"layers.{layer}."
    experts = _expert_cores(lw, layer, pos0, m, keys)
    contributors = [c for c in lw.target.cores if experts[c]]
    bound = min(len(lw.target.cores), _max_active(lw, m))
    xm = lw.mm["act.xm"].base
    hb = lw.mm["act.hb"].base
    moe = lw.mm["act.moe"].base
    add = q.add2
    for c in lw.target.cores:
        r0, r1 = _rows(lw, h, c)
        if r1 <= r0:
            continue
        w = r1 - r0
        plan = SramPlan(lw.target, c)
        shared = -1
        if ws:
            md = lw.matrix(p + "shared.down_proj", q.down)
            b.prefetch(c, md, (r0, r1))
            a = plan.take(m * ws, "shared SwiGLU output")
            b.load(c, hb, a, m * ws, to="in_mxu")
            shared = plan.take(m * w, "shared down output")
            b.gemm(c, md, (r0, r1), a=a, m=m, out=shared, plan=plan,
                   first_wait=(b.sem(c, "in_mxu"),), last_signal=(b.sem(c, "mxu_vpu"),))
        xs = plan.take(m * w, "residual slice")
        b.load(c, xm + r0, xs, w, rows=m, src_stride=h, to="in_vpu")
        parts = []
        for ci in range(bound):
            buf = plan.take(m * w, "routed partial sum slice")
            if ci < len(contributors):
                b.load(c, moe + ci * lw.m_tile * h + r0, buf, w, rows=m, src_stride=h,
                       to="in_vpu")
                parts.append(buf)
        acc = plan.take(m * w, "MoE output")
        operands = ([(shared, (b.sem(c, "mxu_vpu"),))] if ws else []) + [
            (buf, (b.sem(c, "in_vpu"),)) for buf in parts]
        src, wait = xs, (b.sem(c, "in_vpu"),)
        for i, (other, other_wait) in enumerate(operands):
            b.emit(Vec(core=c, func=VecFunc.ADD, rows=m, cols=w, src0=src, src1=other,
                       dst=acc, p0=add.ma, p1=add.mb, p2=add.shift, wait=wait + other_wait,
                       signal=(b.sem(c, "vpu_out"),) if i == len(operands) - 1 else ()))
            src, wait = acc, ()
        b.emit(DmaStore(core=c, src=acc, dst=x_next + r0, nbytes=w, rows=m, dst_stride=h,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
