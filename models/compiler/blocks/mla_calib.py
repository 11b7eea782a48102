"""Functional MLA (DeepSeek-V2): the weights in the device's basis and the calibration of
an MLA model's integer parameters.

**The device's basis.** The programs of :mod:`.mla` compute the *absorbed* form: scores
``q_nope . (W_UK c) + q_rope . k_rope = (W_UK^T q_nope) . c + q_rope . k_rope`` over the
cached record ``[c | k_rope]``, so the cache holds ``kv_lora_rank + qk_rope_head_dim``
values per token instead of ``num_heads * (qk_nope_head_dim + v_head_dim)`` (DeepSeek-V2,
section 2.1.2: "W_UK can be absorbed into W_Q, and W_UV can be absorbed into W_O"). The
query side is absorbed at run time (one GEMM per head, ``q_lat = W_UK_h^T q_nope``), not
folded into ``q_proj`` offline: folding would make the query ``num_heads * kv_lora_rank``
wide from a ``hidden``-wide input, a larger matrix than ``q_proj`` plus ``k_b_proj`` for
DeepSeek-V2-Lite (16 x 512 vs 16 x 128 + 16 x 128 x 512 / 2048 per hidden value). The
value side stays a GEMM per head after attention (``v_b_proj`` on the latent output).
So the device stores:

- ``k_b_proj`` per head transposed (``kv_lora_rank`` rows of ``qk_nope_head_dim``), the
  absorption GEMM's operand, quantized per row of that transpose;
- ``q_proj`` (``q_b_proj``) and ``kv_a_proj`` with each RoPE part's rows de-interleaved
  (DeepSeek-V2 stores rotary pairs as ``(2j, 2j+1)``; its HF code de-interleaves them before
  rotating, and the vector unit's ROPE pairs ``j`` with ``j + d/2``): dot products between
  query and key RoPE parts are unchanged, and the other rows are as stored.

**Scales.** Scores mix two products, ``q_lat . c`` and ``q_rope . k_rope``, in one integer
dot product with one ``score_mult``; so the steps must satisfy ``s_qlat * s_c = s_qrope *
s_krope``. Each is first calibrated (``absmax * MARGIN / 127``); the product that is
smaller is then coarsened to the larger (its two RoPE steps by the same factor), so no
value clips. ``q_proj``'s nope and rope rows and ``kv_a_proj``'s latent and rope rows get
their own output steps through the GEMMs' per-row multipliers.

**The latent.** RMSNorm needs one scale across the row, so ``kv_a_proj``'s latent rows
cannot take per-channel steps; a latent with outlier channels (DeepSeek-V2's has them; the
synthetic weights' ``LATENT_OUTLIER_CHANNELS``) rounded to int8 before its norm loses the
small channels. So those rows leave the GEMM as int32 (a GemmRow with a static input, its
multipliers putting every latent column on the step of :func:`latent_int32_step`),
RMSNORM_WIDE normalises them and REQUANT saturates its int32 output to int8: the norm's
int16 gain already maps onto the latent's static int8 step (``norm_params`` of an int8
RMSNorm, whose formula the wide kernel shares). The RoPE rows stay int8 (no norm follows).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ... import exact
from ...config import ModelConfig
from ...reference import apply_rope, rms_norm, rope_cos_sin, softmax, softmax_scale
from ...weights import QuantizedWeight, WeightSource, quantize_weight
from ..errors import CompileError
from ..numerics import LayerQ, MlaQ, NormQ, Numerics
from ..qparams import (
    INT8_MAX,
    INT32_MAX,
    activation_scale,
    add_params,
    attn_params,
    gemm_params,
    norm_params,
    silu_params,
)
from ..wgroup import GroupQuantizedWeight
from .mla_shape import MlaDims
from .moe_calib import mlp_float, moe_params

#: Bits of the int32 latent rows' calibrated maximum (x MARGIN), as the wide pipeline's
#: int32 GEMM outputs (``calibrate_wide.WIDE_Q``); RMSNORM_WIDE pre-shifts them to 15 bits.
LATENT_INT32_BITS = 22
#: MLA matrices the device stores in another basis than the checkpoint (see above).
REBASED = ("q_proj", "q_b_proj", "kv_a_proj", "k_b_proj")


def deinterleaved(n: int) -> np.ndarray:
    """The order ``[0, 2, 4, ..., 1, 3, 5, ...]`` of ``n`` (even) RoPE channels."""
    return np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)])


def device_matrix(cfg: ModelConfig, source: WeightSource, name: str) -> np.ndarray:
    """Matrix ``name`` (float32) as the device stores it (module docstring)."""
    w = np.asarray(source.tensor(name), np.float32)
    kind = name.rsplit(".", 1)[-1]
    if kind not in REBASED:
        return w
    d = MlaDims.of(cfg)
    if kind == "k_b_proj":  # [heads * nope, kvr] -> per head [kvr, nope]
        return np.ascontiguousarray(
            w.reshape(d.heads, d.nope, d.kvr).transpose(0, 2, 1).reshape(d.heads * d.kvr,
                                                                          d.nope))
    if kind == "kv_a_proj":
        rows = np.concatenate([np.arange(d.kvr), d.kvr + deinterleaved(d.rope)])
    else:  # q_proj / q_b_proj: per head [nope | rope]
        head = np.concatenate([np.arange(d.nope), d.nope + deinterleaved(d.rope)])
        rows = (np.arange(d.heads)[:, None] * d.qhd + head[None, :]).reshape(-1)
    return np.ascontiguousarray(w[rows])


def latent_int32_step(s_int8: float) -> float:
    """The int32 step of the latent rows of ``kv_a_proj``'s output whose static int8 step
    would be ``s_int8``: the calibrated maximum x MARGIN maps to ``2**LATENT_INT32_BITS``."""
    return s_int8 * INT8_MAX / 2.0**LATENT_INT32_BITS


def wide_input_norm(nq: NormQ) -> NormQ:
    """An int8-output RMSNorm's parameters for RMSNORM_WIDE from int32 rows: the kernels
    share the formula (``rs(y * g * inv, shift)``); the wide one pre-shifts ``y`` and
    ``eps_q`` alike. ``eps_q`` is clipped to its int32 field, as ``calibrate_wide`` does:
    then ``eps`` counts below ``2**15`` squared int32 steps, under 1e-6 of the mean square
    of a row whose maximum is near ``2**LATENT_INT32_BITS`` (an assumption: no row is
    ``2**10`` times below the calibrated maximum)."""
    return replace(nq, eps_q=min(nq.eps_q, INT32_MAX))


def _pair_norm(x: np.ndarray) -> np.ndarray:
    """Norms of the rotate-half channel pairs of the last axis: the bound of a rotated
    value at any position."""
    half = x.shape[-1] // 2
    return np.sqrt(x[..., :half] ** 2 + x[..., half:] ** 2)


def _rows(s_a: float, n_a: int, s_b: float, n_b: int) -> np.ndarray:
    return np.concatenate([np.full(n_a, s_a), np.full(n_b, s_b)])


def calibrate_mla(cfg: ModelConfig, source: WeightSource, bits_for, tokens: np.ndarray,
                  quantize=None) -> Numerics:
    """Integer parameters of an MLA model (its MoE layers: :mod:`.moe_calib`) for the int8
    scheme, from a float forward pass over ``tokens`` with the weights as the device holds
    them (quantized, then dequantized). ``quantize(name)`` as for :func:`..calibrate.calibrate`."""
    d = MlaDims.of(cfg)
    quantize = quantize or (lambda name: quantize_weight(source.tensor(name), bits_for(name)))
    qw: dict[str, QuantizedWeight] = {}

    def weight(name: str) -> QuantizedWeight:
        if name not in qw:
            q = quantize(name)
            if name.rsplit(".", 1)[-1] in REBASED:
                if isinstance(q, GroupQuantizedWeight):
                    raise CompileError(
                        f"{name}: functional MLA keeps its matrices per channel; group-wise "
                        "4-bit weights (bits.numerics.weight_group) are not built for MLA")
                q = quantize_weight(device_matrix(cfg, source, name), bits_for(name))
            qw[name] = q
        return qw[name]

    def lin(x: np.ndarray, name: str) -> np.ndarray:
        return exact.weight_product(x, weight(name))

    amax: dict[str, float] = {}

    def rec(key: str, x: np.ndarray) -> np.ndarray:
        amax[key] = max(amax.get(key, 0.0), float(np.abs(x).max()))
        return x

    eps = cfg.rms_norm_eps
    n = len(tokens)
    cos, sin = rope_cos_sin(cfg, np.arange(n))
    future = np.arange(n)[None, :] > np.arange(n)[:, None]
    scale = softmax_scale(cfg)
    x = rec("x0", source.tensor("embed")[tokens].astype(np.float32))
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        xn = rec(f"{i}.xn", rms_norm(x, source.tensor(p + "attn_norm"), eps))
        if d.qr:
            qa = rec(f"{i}.qa", lin(xn, p + "q_a_proj"))
            qan = rec(f"{i}.qan", rms_norm(qa, source.tensor(p + "q_a_norm"), eps))
            q = lin(qan, p + "q_b_proj")
        else:
            q = lin(xn, p + "q_proj")
        q = q.reshape(n, d.heads, d.qhd)
        qn = rec(f"{i}.qn", q[..., : d.nope])
        qr = q[..., d.nope:]
        rec(f"{i}.qr", _pair_norm(qr))
        kva = lin(xn, p + "kv_a_proj")
        rec(f"{i}.kva", kva[:, : d.kvr])
        kr = kva[:, d.kvr:]
        rec(f"{i}.kr", _pair_norm(kr))
        lat = rec(f"{i}.lat", rms_norm(kva[:, : d.kvr], source.tensor(p + "kv_a_norm"), eps))
        qr = apply_rope(qr, cos, sin)
        kr = apply_rope(kr, cos, sin)
        wkb = weight(p + "k_b_proj").dequantize().reshape(d.heads, d.kvr, d.nope)
        qlat = rec(f"{i}.qlat", exact.matmul(qn.transpose(1, 0, 2), wkb.transpose(0, 2, 1))
                   .transpose(1, 0, 2).astype(np.float32))
        s = (exact.matmul(qlat.transpose(1, 0, 2), lat.T)
             + exact.matmul(qr.transpose(1, 0, 2), kr.T)).astype(np.float32) * scale
        probs = softmax(np.where(future[None], -np.inf, s), axis=-1)
        olat = rec(f"{i}.olat", exact.matmul(probs, lat).transpose(1, 0, 2).astype(np.float32))
        wvb = weight(p + "v_b_proj").dequantize().reshape(d.heads, d.v, d.kvr)
        ao = rec(f"{i}.ao", exact.matmul(olat.transpose(1, 0, 2), wvb.transpose(0, 2, 1))
                 .transpose(1, 0, 2).reshape(n, -1).astype(np.float32))
        o = rec(f"{i}.o", lin(ao, p + "o_proj"))
        x = rec(f"{i}.xm", (x + o).astype(np.float32))
        xn2 = rec(f"{i}.xn2", rms_norm(x, source.tensor(p + "mlp_norm"), eps))
        mlp = mlp_float(cfg, i, xn2, rec, lin)
        x = rec(f"x{i + 1}", (x + mlp).astype(np.float32))
    rec("fn", rms_norm(x, source.tensor("final_norm"), eps))
    s = {k: activation_scale(v) for k, v in amax.items()}
    return _derive(cfg, source, s, weight)


def _derive(cfg: ModelConfig, source: WeightSource, s: dict[str, float],
            weight) -> Numerics:
    d = MlaDims.of(cfg)
    eps = cfg.rms_norm_eps
    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        # one score step for both products (module docstring)
        r = s[f"{i}.qr"] * s[f"{i}.kr"]
        prod = max(s[f"{i}.qlat"] * s[f"{i}.lat"], r)
        s_qlat = prod / s[f"{i}.lat"]
        grow = math.sqrt(prod / r)
        s_qr, s_kr = s[f"{i}.qr"] * grow, s[f"{i}.kr"] * grow
        s.update({f"{i}.qlat": s_qlat, f"{i}.qr": s_qr, f"{i}.kr": s_kr})
        L = LayerQ(mla=MlaQ())
        assert L.mla is not None
        L.attn_norm = norm_params(source.tensor(p + "attn_norm"), s[f"x{i}"], s[f"{i}.xn"],
                                  eps)
        s_qin = s[f"{i}.xn"]
        if d.qr:
            L.mla.q_a = gemm_params(s[f"{i}.xn"], weight(p + "q_a_proj"), s[f"{i}.qa"], None)
            L.mla.q_a_norm = norm_params(source.tensor(p + "q_a_norm"), s[f"{i}.qa"],
                                         s[f"{i}.qan"], eps)
            s_qin = s[f"{i}.qan"]
        qname = p + ("q_b_proj" if d.qr else "q_proj")
        L.q = gemm_params(s_qin, weight(qname),
                          np.tile(_rows(s[f"{i}.qn"], d.nope, s_qr, d.rope), d.heads), None)
        # the latent rows leave the GEMM as int32 (module docstring, "The latent")
        s_kva = s[f"{i}.kva32"] = latent_int32_step(s[f"{i}.kva"])
        L.k = gemm_params(s[f"{i}.xn"], weight(p + "kv_a_proj"),
                          _rows(s_kva, d.kvr, s_kr, d.rope), None)
        L.mla.kv_a_norm = wide_input_norm(
            norm_params(source.tensor(p + "kv_a_norm"), s_kva, s[f"{i}.lat"], eps))
        L.mla.k_b = gemm_params(s[f"{i}.qn"], weight(p + "k_b_proj"), s_qlat, None)
        L.attn = attn_params(s_qlat, s[f"{i}.lat"], s[f"{i}.lat"], s[f"{i}.olat"],
                             softmax_scale(cfg))
        L.v = gemm_params(s[f"{i}.olat"], weight(p + "v_b_proj"), s[f"{i}.ao"], None)
        L.o = gemm_params(s[f"{i}.ao"], weight(p + "o_proj"), s[f"{i}.o"], None)
        L.add1 = add_params(s[f"x{i}"], s[f"{i}.o"], s[f"{i}.xm"])
        L.mlp_norm = norm_params(source.tensor(p + "mlp_norm"), s[f"{i}.xm"], s[f"{i}.xn2"],
                                 eps)
        if cfg.layer_is_moe(i):
            moe_params(cfg, i, s, weight, L)
            layers.append(L)
            continue
        L.gate = gemm_params(s[f"{i}.xn2"], weight(p + "gate_proj"), s[f"{i}.gate"], None)
        L.up = gemm_params(s[f"{i}.xn2"], weight(p + "up_proj"), s[f"{i}.up"], None)
        L.silu = silu_params(s[f"{i}.gate"], s[f"{i}.up"], s[f"{i}.h"])
        L.down = gemm_params(s[f"{i}.h"], weight(p + "down_proj"), s[f"{i}.down"], None)
        L.add2 = add_params(s[f"{i}.xm"], s[f"{i}.down"], s[f"x{i + 1}"])
        layers.append(L)
    final = norm_params(source.tensor("final_norm"), s[f"x{cfg.num_layers}"], s["fn"], eps)
    head_w = weight(cfg.lm_head_tensor)
    row_scale = (s["fn"] * cfg.logit_scale * head_w.scales.astype(np.float64)).astype(
        np.float32)
    return Numerics(input_scale=s["x0"], layers=layers, final_norm=final,
                    head=gemm_params(s["fn"], head_w, None, None), head_row_scale=row_scale,
                    scales=s, functional=True)
