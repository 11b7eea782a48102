"""The mixture-of-experts MLP (routed experts and shared experts: DeepSeek-V2, Qwen2-MoE,
Mixtral): one routing-invariant schedule for timing-only and functional runs.

**Slots.** A tile of ``m`` tokens has ``m * k`` slots (``k = num_experts_per_tok``), slot
``s = t * k + j`` being token ``t``'s ``j``-th choice; slot ``s`` runs on core
``cores[s % len(cores)]`` whatever the router chose. A MoE layer runs

- D' (every core with a slot or a share of the shared experts): MLP RMSNorm; on each core
  with slots the router GEMM (int8 logits) and TOPK_GATE (``k`` pairs ``(expert id, Q24
  gate weight)`` per token: the routing table, in that core's SRAM); on the first core,
  for Qwen2-MoE, the shared expert's gate logit (a one-column GEMM) and its SIGMOID (Q24,
  to ``act.router``); a slice of the shared experts' gate/up rows and SwiGLU to
  ``act.hb``; then, slot after slot, the slot's expert by routed loads (``dma.load.ix``
  of its gate/up/down multipliers and weight tiles: :mod:`.moe_slots`, the experts at
  one DRAM stride, :func:`.moe_slots.expert_stride`), m = 1 GEMMs gate and up, SwiGLU, down
  into int32 (GemmRow), and GATE_ACC: the token's row of the core's int32 routed sum
  ``+= rs(y * gate, 24)``. The core's routed sum is requantized to int8 (REQUANT) and
  stored to ``act.moe``.
- E' (every core, an output-column slice): the shared experts' down projection slice
  (Qwen2-MoE: into int32, times the stored sigmoid gate by GATE_ACC, requantized), plus
  the residual, plus every contributing core's routed sum (ADDs) -> the next layer's
  input.

**Timing does not depend on the routing.** The instructions, their sizes and their
order are fixed by ``m``, ``k`` and the cores; a routed load is timed as the load of
expert 0 (same bytes, rows and strides). So a timing-only run (no data) takes exactly
the cycles of a functional one, and two inputs that route differently take the same
cycles.

**What it costs.** Every slot reads its expert's whole gate/up/down weights: a decode
step reads ``k`` experts, as the real router would make it; a prefill tile of ``m``
tokens reads ``m * k`` expert matrices even where tokens share an expert (the union of
their experts would be fewer: for DeepSeek-V2-Lite, 64 experts, 6 per token, a tile of
16 tokens reads 96 experts' weights where at most 64 exist). An assumption of this
schedule, chosen because it keeps timing independent of the data; a schedule that runs
every expert over the whole tile (dense gates, zero for the unchosen) costs
``n_routed_experts`` reads and wins from ``m * k > n_routed_experts`` tokens on; it is
not built. Each core with slots also reads the router matrix (``n_routed_experts x
hidden``) itself instead of receiving the routing table: no exchange, at about 1.5 % of
a DeepSeek-V2-Lite decode step's expert bytes.

SRAM use is fixed by ``m`` (buffers for the worst case, reused slot after slot; the
engines' program order makes the reuse safe), so the token tile fitted at one position
fits at every position.
"""

from __future__ import annotations

from isa.instructions import DmaStore, Vec, VecFunc
from isa.kernels.moe import RENORM
from isa.vecfuncs import GATE_ACCUMULATE, TOPK_ENTRY_BYTES

from ...config import ModelConfig
from ..builder import CORE_MODES, Builder
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap
from ..numerics import MoeQ
from ..ops import end_stage, norm
from ..sram import SramPlan
from .moe_slots import ExpertTable, expert_stride, gemm_ix

#: Fractional bits of a TOPK_GATE gate weight and of SIGMOID's output (isa.kernels.moe).
GATE_Q = 24


class MoeMlp:
    """:class:`~.base.MlpBlock` of a MoE layer."""

    kind = "moe"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        cfg = self.cfg
        assert cfg.n_routed_experts is not None and cfg.num_experts_per_tok is not None
        if cfg.shared_expert_gate:  # Qwen2-MoE: the shared expert's Q24 gate per token
            mm.add("act.router", 4 * m_tile, "activations")
        mm.add("act.moe", contributors(cfg, m_tile, max(CORE_MODES.values()))
               * m_tile * cfg.hidden_size, "activations")

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        mq = q.moe if q.moe is not None else MoeQ()
        _stage_experts(b, lw, layer, q, mq, m)
        _stage_combine(b, lw, layer, mq, x_next, m)


def contributors(cfg: ModelConfig, m: int, cores: int) -> int:
    """Cores that hold slots of a tile of ``m`` tokens (each writes one routed sum)."""
    assert cfg.num_experts_per_tok is not None
    return min(cores, m * cfg.num_experts_per_tok)


def slots_of(lw: Lowering, m: int, c: int) -> list[tuple[int, int]]:
    """Core ``c``'s slots ``(token, choice)`` of a tile of ``m`` tokens."""
    k = lw.model.num_experts_per_tok
    assert k is not None
    cores = lw.target.cores
    return [(s // k, s % k) for s in range(m * k) if cores[s % len(cores)] == c]


def topk_flags(cfg: ModelConfig) -> int:
    """TOPK_GATE's flags for the model's router (reference.route_logits): renormalised
    over the chosen experts by Mixtral, Qwen2-MoE with ``norm_topk_prob``, and DeepSeek-V2
    with ``norm_topk_prob`` and more than one expert per token."""
    k = cfg.num_experts_per_tok or 0
    renorm = cfg.norm_topk_prob and (cfg.family != "deepseek_v2" or k > 1)
    return RENORM if renorm else 0


def expert_table(lw: Lowering, layer: int) -> ExpertTable:
    assert lw.model.n_routed_experts is not None
    return ExpertTable(lw.model.n_routed_experts, expert_stride(lw.mm, lw.model, layer))


def _expert_matrices(lw: Lowering, layer: int, mq: MoeQ):
    """Expert 0's gate, up and down matrices (the routed loads add ``id * stride``); the
    down projection leaves as int32 on the routed sum's step (GemmRow)."""
    from dataclasses import replace

    pe = f"layers.{layer}.experts.0."
    gate = lw.matrix(pe + "gate_proj", mq.gate)
    up = lw.matrix(pe + "up_proj", mq.up)
    down = replace(lw.matrix(pe + "down_proj", mq.down), gemm_row=True, out_bits=32)
    return gate, up, down


def _stage_experts(b: Builder, lw: Lowering, layer: int, q, mq: MoeQ, m: int) -> None:
    """D': norm, router + TOPK_GATE, shared gate/up slices, the core's slots -> act.moe."""
    cfg = lw.model
    assert cfg.n_routed_experts is not None and cfg.moe_intermediate_size is not None
    h, ne = cfg.hidden_size, cfg.n_routed_experts
    k = cfg.num_experts_per_tok
    assert k is not None
    ws = cfg.shared_expert_width
    p = f"layers.{layer}."
    cores = lw.target.cores
    gated = cfg.shared_expert_gate
    table = expert_table(lw, layer)
    mr = lw.matrix(p + "router", mq.router)
    mg, mu, md = _expert_matrices(lw, layer, mq)
    xm = lw.mm["act.xm"].base
    hb = lw.mm["act.hb"].base
    for c in cores:
        s0, s1 = lw.rows(ws, c) if ws else (0, 0)
        mine = slots_of(lw, m, c)
        gate_core = gated and c == cores[0]
        if s1 <= s0 and not mine:
            continue
        plan = SramPlan(lw.target, c)
        if mine:
            b.prefetch(c, mr, (0, ne))
        else:
            b.prefetch(c, lw.matrix(p + "shared.gate_proj", mq.shared_gate), (s0, s1))
        xs = plan.take(m * h, "MLP input")
        b.load(c, xm, xs, m * h, to="in_vpu")
        xn = norm(b, lw, c, plan, p + "mlp_norm", q.mlp_norm, xs, m, h, to="vpu_mxu")
        first = (b.sem(c, "vpu_mxu"),)
        rtab = -1
        if mine:  # the router and its table, on this core
            rt = plan.take(m * ne, "router logits")
            b.gemm(c, mr, (0, ne), a=xn, m=m, out=rt, plan=plan, first_wait=first,
                   last_signal=() if gate_core else (b.sem(c, "mxu_vpu"),))
            first = ()
            if gate_core:  # Qwen2-MoE's shared-expert gate logit, one per token
                sg = plan.take(m, "shared expert gate logits")
                b.gemm(c, lw.matrix(p + "shared_gate", mq.shared_logit), (0, 1), a=xn, m=m,
                       out=sg, plan=plan, last_signal=(b.sem(c, "mxu_vpu"),))
                sq = plan.take(4 * m, "shared expert gates (Q24)")
                b.emit(Vec(core=c, func=VecFunc.SIGMOID, rows=m, cols=1, src0=sg, dst=sq,
                           p0=mq.sigmoid_mult, p1=mq.sigmoid_shift,
                           wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
                b.emit(DmaStore(core=c, src=sq, dst=lw.mm["act.router"].base, nbytes=4 * m,
                                wait=(b.sem(c, "vpu_out"),)))
            rtab = plan.take(TOPK_ENTRY_BYTES * m * k, "routing table")
            b.emit(Vec(core=c, func=VecFunc.TOPK_GATE, rows=m, cols=ne, src0=rt, dst=rtab,
                       p0=mq.topk_mult, p1=mq.topk_shift, p2=k, p3=mq.topk_flags,
                       wait=() if gate_core else (b.sem(c, "mxu_vpu"),),
                       signal=(b.sem(c, "vpu_in"),)))
        if s1 > s0:
            w = s1 - s0
            g = plan.take(m * w, "shared gate output")
            u = plan.take(m * w, "shared up output")
            b.gemm(c, lw.matrix(p + "shared.gate_proj", mq.shared_gate), (s0, s1), a=xn, m=m,
                   out=g, plan=plan, first_wait=first)
            first = ()
            b.gemm(c, lw.matrix(p + "shared.up_proj", mq.shared_up), (s0, s1), a=xn, m=m,
                   out=u, plan=plan, last_signal=(b.sem(c, "mxu_vpu"),))
            s = mq.shared_silu
            b.emit(Vec(core=c, func=VecFunc.SILU_MUL, rows=m, cols=w, src0=g, src1=u, dst=g,
                       p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                       wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_out"),)))
            b.emit(DmaStore(core=c, src=g, dst=hb + s0, nbytes=w, rows=m, dst_stride=ws,
                            wait=(b.sem(c, "vpu_out"),)))
        if mine:
            _slots(b, lw, c, plan, mine, mq, m, xn, rtab, table, (mg, mu, md),
                   cores.index(c))
        end_stage(b, c)


def _slots(b: Builder, lw: Lowering, c: int, plan: SramPlan, mine: list[tuple[int, int]],
           mq: MoeQ, m: int, xn: int, rtab: int, table: ExpertTable, mats, ci: int) -> None:
    """Core ``c``'s slots, in order, into its int32 routed sum; then the sum -> act.moe
    (``ci``: the core's index, below :func:`contributors`)."""
    cfg = lw.model
    h = cfg.hidden_size
    k = cfg.num_experts_per_tok
    assert k is not None
    mg, mu, md = mats
    inter = mg.n
    acc = plan.take(4 * m * h, "routed sum (int32)")
    # 0 * a + 0 * b over the sum's bytes: zero it (the rows no slot of this core touches)
    b.emit(Vec(core=c, func=VecFunc.ADD, rows=m, cols=4 * h, src0=acc, src1=acc, dst=acc,
               p0=0, p1=0, p2=0))
    bufs = [plan.take(4 * n, f"expert {what} multipliers")
            for what, n in (("gate", inter), ("up", inter), ("down", h))]
    g = plan.take(inter, "expert gate output")
    u = plan.take(inter, "expert up output")
    y = plan.take(4 * h, "expert output (int32)")
    s = mq.silu
    for i, (t, j) in enumerate(mine):
        entry = rtab + TOPK_ENTRY_BYTES * (t * k + j)  # (expert id, Q24 gate)
        a = xn + t * h
        gemm_ix(b, c, mg, index=entry, table=table, a=a, out=g, plan=plan, mult=bufs[0],
                index_wait=(b.sem(c, "vpu_in"),) if i == 0 else ())
        gemm_ix(b, c, mu, index=entry, table=table, a=a, out=u, plan=plan, mult=bufs[1],
                last_signal=(b.sem(c, "mxu_vpu"),))
        b.emit(Vec(core=c, func=VecFunc.SILU_MUL, rows=1, cols=inter, src0=g, src1=u, dst=g,
                   p0=s.in_mult, p1=s.in_shift, p2=s.out_mult, p3=s.out_shift,
                   wait=(b.sem(c, "mxu_vpu"),), signal=(b.sem(c, "vpu_mxu"),)))
        gemm_ix(b, c, md, index=entry, table=table, a=g, out=y, plan=plan, mult=bufs[2],
                first_wait=(b.sem(c, "vpu_mxu"),), last_signal=(b.sem(c, "mxu_vpu"),))
        b.emit(Vec(core=c, func=VecFunc.GATE_ACC, rows=1, cols=h, src0=y, src1=entry + 4,
                   dst=acc + 4 * t * h, p0=GATE_Q, p2=GATE_ACCUMULATE,
                   wait=(b.sem(c, "mxu_vpu"),)))
    part = plan.take(m * h, "routed sum")
    b.emit(Vec(core=c, func=VecFunc.REQUANT, rows=m, cols=h, src0=acc, dst=part,
               p0=mq.routed_mult, p1=mq.routed_shift, signal=(b.sem(c, "vpu_out"),)))
    b.emit(DmaStore(core=c, src=part, dst=lw.mm["act.moe"].base + ci * lw.m_tile * h,
                    nbytes=m * h, wait=(b.sem(c, "vpu_out"),)))


def _stage_combine(b: Builder, lw: Lowering, layer: int, mq: MoeQ, x_next: int,
                   m: int) -> None:
    """E': shared down-projection slice (gated) + residual + the routed sums -> the next
    layer's input."""
    from dataclasses import replace

    cfg = lw.model
    h = cfg.hidden_size
    ws = cfg.shared_expert_width
    p = f"layers.{layer}."
    n_contrib = contributors(cfg, m, len(lw.target.cores))
    xm = lw.mm["act.xm"].base
    hb = lw.mm["act.hb"].base
    moe = lw.mm["act.moe"].base
    for c in lw.target.cores:
        r0, r1 = lw.rows(h, c)
        if r1 <= r0:
            continue
        w = r1 - r0
        plan = SramPlan(lw.target, c)
        operands: list[tuple[int, tuple[int, ...]]] = []
        if ws:
            md = lw.matrix(p + "shared.down_proj", mq.shared_down)
            if cfg.shared_expert_gate:
                md = replace(md, gemm_row=True, out_bits=32)
            b.prefetch(c, md, (r0, r1))
            a = plan.take(m * ws, "shared SwiGLU output")
            b.load(c, hb, a, m * ws, to="in_mxu")
            shared = plan.take((4 if cfg.shared_expert_gate else 1) * m * w,
                               "shared down output")
            b.gemm(c, md, (r0, r1), a=a, m=m, out=shared, plan=plan,
                   first_wait=(b.sem(c, "in_mxu"),), last_signal=(b.sem(c, "mxu_vpu"),))
            if cfg.shared_expert_gate:  # sigmoid(gate . x) * shared(x), per token
                sq = plan.take(4 * m, "shared expert gates (Q24)")
                b.load(c, lw.mm["act.router"].base, sq, 4 * m, to="in_vpu")
                b.emit(Vec(core=c, func=VecFunc.GATE_ACC, rows=m, cols=w, src0=shared,
                           src1=sq, dst=shared, p0=GATE_Q, p1=4,
                           wait=(b.sem(c, "mxu_vpu"), b.sem(c, "in_vpu"))))
                gated = plan.take(m * w, "gated shared output")
                b.emit(Vec(core=c, func=VecFunc.REQUANT, rows=m, cols=w, src0=shared,
                           dst=gated, p0=mq.gated_mult, p1=mq.gated_shift))
                operands.append((gated, ()))
            else:
                operands.append((shared, (b.sem(c, "mxu_vpu"),)))
        xs = plan.take(m * w, "residual slice")
        b.load(c, xm + r0, xs, w, rows=m, src_stride=h, to="in_vpu")
        for ci in range(n_contrib):
            buf = plan.take(m * w, "routed sum slice")
            b.load(c, moe + ci * lw.m_tile * h + r0, buf, w, rows=m, src_stride=h,
                   to="in_vpu")
            operands.append((buf, (b.sem(c, "in_vpu"),)))
        out = plan.take(m * w, "MoE output")
        src, wait = xs, (b.sem(c, "in_vpu"),)
        for i, (other, other_wait) in enumerate(operands):
            add = mq.add_first if i == 0 else mq.add_next
            b.emit(Vec(core=c, func=VecFunc.ADD, rows=m, cols=w, src0=src, src1=other,
                       dst=out, p0=add.ma, p1=add.mb, p2=add.shift, wait=wait + other_wait,
                       signal=(b.sem(c, "vpu_out"),) if i == len(operands) - 1 else ()))
            src, wait = out, ()
        b.emit(DmaStore(core=c, src=out, dst=x_next + r0, nbytes=w, rows=m, dst_stride=h,
                        wait=(b.sem(c, "vpu_out"),), signal=b.barrier()))
