"""Functional MoE (blocks/moe.py): the float pass of a MoE layer during calibration and
the integer parameters of its router, routed experts and shared experts (the int8 scheme:
static per-tensor activation steps, as the dense MLP's).

One program serves every expert of a layer (the routing is data), so the experts share
what the program carries: one step per activation (the largest over the experts, each
measured on the calibration tokens routed to it) and one GEMM shift (the largest the
experts' multipliers all allow); each expert's per-row multipliers sit in its own
parameter region, which the routed loads fetch with its weights. The down projections
leave as int32 on one step (:data:`ROUTED_INT32_BITS`) so that TOPK_GATE's Q24 gate
weights scale them before the sum is rounded to int8 once (GATE_ACC, then REQUANT).
DeepSeek-V2's ``routed_scaling_factor`` (its un-renormalised gates) is folded into the
down projections' multipliers: the device's gate is the softmax weight itself.
"""

from __future__ import annotations

import math

import numpy as np

from isa.kernels.fixed import quantize_multiplier

from ...config import ModelConfig
from ...reference import gate_activation, route_logits, silu
from ..errors import CompileError
from ..numerics import GemmQ, LayerQ, MoeQ
from ..qparams import INT8_MAX, LOGIT_Q, add_params, gemm_params, silu_params
from .moe import topk_flags

#: Bits of the calibrated maximum (x MARGIN) of the routed experts' int32 outputs and of
#: Qwen2-MoE's gated shared output, as MLA's int32 latent (``mla_calib.LATENT_INT32_BITS``).
ROUTED_INT32_BITS = 22


def gate_scale(cfg: ModelConfig) -> float:
    """The factor of the float routing weights that TOPK_GATE's weights lack:
    DeepSeek-V2's ``routed_scaling_factor`` where it does not renormalise, else 1."""
    if cfg.family == "deepseek_v2" and not topk_flags(cfg):
        return float(cfg.routed_scaling_factor)
    return 1.0


def moe_problem(cfg: ModelConfig) -> str | None:
    """Why the functional MoE block cannot run this model, or None."""
    if cfg.topk_method != "greedy":
        return (f"topk_method = {cfg.topk_method!r} (group-limited routing) is not built "
                "for functional runs: TOPK_GATE chooses greedily; use sim.fidelity = 'timing'")
    return None


def mlp_float(cfg: ModelConfig, layer: int, xn: np.ndarray, rec, lin) -> np.ndarray:
    """The float MLP of layer ``layer`` over its normed input ``xn``: the MoE MLP on a MoE
    layer (:func:`moe_float`), else the dense SwiGLU (GeGLU: ``hidden_act``); ``rec`` and
    ``lin`` as there."""
    if cfg.layer_is_moe(layer):
        return moe_float(cfg, layer, xn, rec, lin)
    i, p = layer, f"layers.{layer}."
    gt = rec(f"{i}.gate", lin(xn, p + "gate_proj"))
    up = rec(f"{i}.up", lin(xn, p + "up_proj"))
    hh = rec(f"{i}.h", (gate_activation(cfg)(gt) * up).astype(np.float32))
    return rec(f"{i}.down", lin(hh, p + "down_proj"))


def moe_float(cfg: ModelConfig, layer: int, xn: np.ndarray, rec, lin) -> np.ndarray:
    """The float MoE MLP of layer ``layer`` over its normed input ``xn`` (n, hidden), with
    the weights ``lin(x, name)`` multiplies by, recording every activation the device
    holds with ``rec(key, x)``; returns the MLP's output (the residual's addend)."""
    i = layer
    p = f"layers.{i}."
    ids, wts = route_logits(cfg, rec(f"{i}.router", lin(xn, p + "router")))
    gs = gate_scale(cfg)
    routed = np.zeros_like(xn)
    for e in np.unique(ids):
        rows, slot = np.nonzero(ids == e)
        pe = f"{p}experts.{int(e)}."
        g = rec(f"{i}.egate", lin(xn[rows], pe + "gate_proj"))
        u = rec(f"{i}.eup", lin(xn[rows], pe + "up_proj"))
        hh = rec(f"{i}.eh", (silu(g) * u).astype(np.float32))
        y = rec(f"{i}.edown", lin(hh, pe + "down_proj") * np.float32(gs))
        routed[rows] += y * (wts[rows, slot] / np.float32(gs))[:, None]
    out = rec(f"{i}.routed", routed)
    if cfg.shared_expert_width:
        g = rec(f"{i}.sgate", lin(xn, p + "shared.gate_proj"))
        u = rec(f"{i}.sup", lin(xn, p + "shared.up_proj"))
        hh = rec(f"{i}.sh", (silu(g) * u).astype(np.float32))
        sd = rec(f"{i}.sdown", lin(hh, p + "shared.down_proj"))
        if cfg.shared_expert_gate:
            logit = rec(f"{i}.slogit", lin(xn, p + "shared_gate"))
            sd = rec(f"{i}.sgated", sd / (np.float32(1) + np.exp(-logit)))
        out = out + sd
    return out.astype(np.float32)


def int32_step(s_int8: float) -> float:
    """The int32 step whose :data:`ROUTED_INT32_BITS` bits span what the static int8 step
    ``s_int8`` spans in 7."""
    return s_int8 * INT8_MAX / 2.0**ROUTED_INT32_BITS


def _shared_shift(s_in: float, qws: list, s_out: float) -> tuple[GemmQ, list[GemmQ]]:
    """GEMM parameters of the experts' matrices ``qws`` (one per expert) with one shift:
    the largest every expert's int32 multipliers allow (``calibrate.gemm_params``)."""
    limit = 2**31 - 1
    ratios = [s_in * qw.scales.astype(np.float64) / s_out for qw in qws]
    top = max(float(r.max()) for r in ratios)
    shift = min(62, max(0, math.floor(math.log2(limit / top))))
    per = [GemmQ(shift=shift, mult=np.clip(np.rint(r * 2.0**shift), 0, limit).astype(np.int32))
           for r in ratios]
    return GemmQ(shift=shift), per


def moe_params(cfg: ModelConfig, layer: int, s: dict[str, float], weight, L: LayerQ) -> None:
    """Set ``L.moe`` (and, for the file, ``L.gate/up/down`` to expert 0's) from the
    activation steps ``s`` and the quantized weights ``weight(name)``."""
    if (why := moe_problem(cfg)) is not None:
        raise CompileError(f"model {cfg.name or cfg.family!r}: {why}")
    assert cfg.n_routed_experts is not None
    i = layer
    p = f"layers.{i}."
    s_in = s[f"{i}.xn2"]
    mq = MoeQ(topk_flags=topk_flags(cfg))
    mq.router = gemm_params(s_in, weight(p + "router"), s[f"{i}.router"], None)
    mq.topk_mult, mq.topk_shift = quantize_multiplier(s[f"{i}.router"] * 2**LOGIT_Q)
    names = [f"{p}experts.{e}." for e in range(cfg.n_routed_experts)]
    mq.gate, gates = _shared_shift(s_in, [weight(n + "gate_proj") for n in names],
                                   s[f"{i}.egate"])
    mq.up, ups = _shared_shift(s_in, [weight(n + "up_proj") for n in names], s[f"{i}.eup"])
    mq.silu = silu_params(s[f"{i}.egate"], s[f"{i}.eup"], s[f"{i}.eh"])
    s_d32 = s[f"{i}.edown32"] = int32_step(s[f"{i}.edown"])
    mq.down, downs = _shared_shift(s[f"{i}.eh"], [weight(n + "down_proj") for n in names],
                                   s_d32 / gate_scale(cfg))
    mq.experts = list(zip(gates, ups, downs, strict=True))
    mq.routed_mult, mq.routed_shift = quantize_multiplier(s_d32 / s[f"{i}.routed"])
    first = s[f"{i}.routed"]
    if cfg.shared_expert_width:
        mq.shared_gate = gemm_params(s_in, weight(p + "shared.gate_proj"), s[f"{i}.sgate"],
                                     None)
        mq.shared_up = gemm_params(s_in, weight(p + "shared.up_proj"), s[f"{i}.sup"], None)
        mq.shared_silu = silu_params(s[f"{i}.sgate"], s[f"{i}.sup"], s[f"{i}.sh"])
        if cfg.shared_expert_gate:
            s32 = s[f"{i}.sdown32"] = int32_step(s[f"{i}.sdown"])
            mq.shared_down = gemm_params(s[f"{i}.sh"], weight(p + "shared.down_proj"), s32,
                                         None)
            mq.shared_logit = gemm_params(s_in, weight(p + "shared_gate"), s[f"{i}.slogit"],
                                          None)
            mq.sigmoid_mult, mq.sigmoid_shift = quantize_multiplier(
                s[f"{i}.slogit"] * 2**LOGIT_Q)
            mq.gated_mult, mq.gated_shift = quantize_multiplier(s32 / s[f"{i}.sgated"])
            first = s[f"{i}.sgated"]
        else:
            mq.shared_down = gemm_params(s[f"{i}.sh"], weight(p + "shared.down_proj"),
                                         s[f"{i}.sdown"], None)
            first = s[f"{i}.sdown"]
    s_out = s[f"x{i + 1}"]
    mq.add_first = add_params(s[f"{i}.xm"], first, s_out)
    mq.add_next = add_params(s_out, s[f"{i}.routed"], s_out)
    L.moe = mq


def moe_gemms(cfg: ModelConfig, layer: int, L: LayerQ) -> list[tuple[str, GemmQ]]:
    """The matrices of MoE layer ``layer`` with a weight and a parameter region of their
    own and the parameters launch writes there."""
    mq = L.moe
    if mq is None:
        raise ValueError(f"layer {layer}: no MoE parameters (a timing-only compile)")
    p = f"layers.{layer}."
    out = [(p + "router", mq.router)]
    for e, (g, u, d) in enumerate(mq.experts):
        out += [(f"{p}experts.{e}.gate_proj", g), (f"{p}experts.{e}.up_proj", u),
                (f"{p}experts.{e}.down_proj", d)]
    if cfg.shared_expert_width:
        out += [(p + "shared.gate_proj", mq.shared_gate), (p + "shared.up_proj", mq.shared_up),
                (p + "shared.down_proj", mq.shared_down)]
    if cfg.shared_expert_gate:
        out.append((p + "shared_gate", mq.shared_logit))
    return out

