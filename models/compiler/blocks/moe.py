"""The mixture-of-experts MLP (routed experts and shared experts: DeepSeek-V2, Qwen2-MoE,
Mixtral), for timing-only simulation.

MLP: layers below ``first_k_dense_replace`` use the dense stages D and E of the GQA
lowering. A MoE layer runs

- D' (every core): MLP RMSNorm; the router GEMM (``n_routed_experts`` scores) and a
  softmax on the last core (with Qwen2-MoE's ``shared_expert_gate``, also the gate's one-
  column GEMM, its logits stored after the scores in ``act.router``); a slice of the
  shared experts' gate/up rows and SwiGLU to ``act.hb``; the routed experts. The experts
  are chosen deterministically for timing (:func:`routed_experts`: a hash of the layer and
  the token's cache position picks ``num_experts_per_tok`` distinct experts), so a decode
  step reads only its token's experts' weights and a tile of tokens the union of its
  tokens' experts. Active experts go round-robin to the cores (most tokens first); each is
  a whole SwiGLU (gate, up, down) over the tokens routed to it (GEMM ``m`` = its token
  count): their rows are gathered from the normed input with vector copies, and the
  outputs scatter-added into the core's partial sum, which goes to ``act.moe``.
- E' (every core, an output-column slice): the shared experts' down projection slice,
  plus the residual, plus every core's routed partial sum (vector ADDs) -> the next
  layer's input.

SRAM use does not depend on the routing (buffers are sized for the worst case and reused
expert after expert, the engines' program order making the reuse safe), so the token
tile fitted at one position fits at every position; :func:`..registry.probe_layers` lets the
tile fit lower one layer of each kind instead of the whole model.

Timing-only shortcuts: the router's scores are computed and stored but the experts come
from :func:`routed_experts`, and neither the routing weights nor the shared expert's gate
are applied (plain ADDs).
"""

from __future__ import annotations

from collections.abc import Sequence

from isa.errors import ConfigError
from isa.instructions import DmaStore, Engine, Nop, Vec, VecFunc

from ...config import ModelConfig
from ..builder import CORE_MODES, Builder
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap
from ..ops import end_stage, norm
from ..sram import SramPlan

#: Seed of the timing-only expert choice (:func:`routed_experts`).
ROUTING_SEED = 0
_MASK64 = (1 << 64) - 1


class MoeMlp:
    """:class:`~.base.MlpBlock` of a MoE layer."""

    kind = "moe"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        cfg = self.cfg
        assert cfg.n_routed_experts is not None and cfg.moe_intermediate_size is not None
        # router scores, then (Qwen2-MoE) the shared expert's gate logit of each token
        mm.add("act.router", m_tile * (cfg.n_routed_experts + cfg.shared_expert_gate),
               "activations")
        # one routed partial sum per core that runs experts (at most one per core)
        contributors = min(max(CORE_MODES.values()), cfg.n_routed_experts)
        mm.add("act.moe", contributors * m_tile * cfg.hidden_size, "activations")

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        s0 = segs[0]
        keys = None if len(segs) == 1 and s0.route is None else tile_keys(segs)
        _stage_moe_experts(b, lw, layer, q, m, s0.pos0, keys)
        _stage_moe_combine(b, lw, layer, q, x_next, m, s0.pos0, keys)


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
    piece without one routes by position, as :func:`..driver.lower_call` routes a call."""
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


def _shared_width(cfg: ModelConfig) -> int:
    return cfg.shared_expert_width


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


def _stage_moe_experts(b: Builder, lw: Lowering, layer: int, q, m: int, pos0: int,
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
        s0, s1 = lw.rows(ws, c) if ws else (0, 0)
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
        xn = norm(b, lw, c, plan, p + "mlp_norm", q.mlp_norm, xs, m, h, to="vpu_mxu")
        first = (b.sem(c, "vpu_mxu"),)
        if c == router_core:
            rt = plan.take(m * ne, "router scores")
            gated = cfg.shared_expert_gate
            b.gemm(c, mr, (0, ne), a=xn, m=m, out=rt, plan=plan, first_wait=first,
                   last_signal=() if gated else (b.sem(c, "mxu_vpu"),))
            first = ()
            if gated:  # Qwen2-MoE's shared-expert gate logit, one per token
                sg = plan.take(m, "shared expert gate logits")
                b.gemm(c, lw.matrix(p + "shared_gate", q.gate), (0, 1), a=xn, m=m, out=sg,
                       plan=plan, last_signal=(b.sem(c, "mxu_vpu"),))
            b.emit(Vec(core=c, func=VecFunc.SOFTMAX, rows=m, cols=ne, src0=rt, dst=rt,
                       p0=1, wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
            b.emit(DmaStore(core=c, src=rt, dst=lw.mm["act.router"].base, nbytes=m * ne,
                            wait=(b.sem(c, "vpu_out"),)))
            if gated:
                b.emit(DmaStore(core=c, src=sg, dst=lw.mm["act.router"].base + lw.m_tile * ne,
                                nbytes=m))
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
        end_stage(b, c)


def _stage_moe_combine(b: Builder, lw: Lowering, layer: int, q, x_next: int, m: int,
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
        r0, r1 = lw.rows(h, c)
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
