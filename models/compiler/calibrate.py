"""Static activation scales and the integer parameters derived from them.

A float forward pass of the model (weights quantized then dequantized, as the device will
see them) over calibration tokens records the largest magnitude of every activation
tensor the device stores as int8; its scale is ``absmax * MARGIN / 127``. The integer
multipliers, shifts and gains of :mod:`numerics` follow from these scales, the weights'
per-row scales and the kernels' formulas (``isa/kernels``): :mod:`.qparams`.

The pass is float32, as the float model is, but its matrix products are
:mod:`models.exact`'s: the scales decide integers, so they must not depend on the BLAS
kernel of the machine that compiles.
"""

from __future__ import annotations

import numpy as np

from .. import exact
from ..config import ModelConfig
from ..reference import (
    apply_rope,
    embed_rows,
    layer_norm,
    rms_norm,
    rope_cos_sin,
    softmax,
    softmax_scale,
)
from ..weights import QuantizedWeight, WeightSource, quantize_weight
from .blocks.mla_calib import calibrate_mla
from .blocks.moe_calib import mlp_float, moe_params
from .numerics import LayerQ, Numerics
from .qparams import (
    activation_scale,
    add_params,
    attn_params,
    gemm_params,
    norm_params,
    silu_params,
)

#: Calibration tokens (a deterministic pseudo-random sequence).
CALIBRATION_TOKENS = 48


def _pair_norm(x: np.ndarray) -> np.ndarray:
    """Norms of the rotate-half channel pairs of the last axis (and the values past them)."""
    half = x.shape[-1] // 2
    return np.sqrt(x[..., :half] ** 2 + x[..., half : 2 * half] ** 2)


def calibration_tokens(cfg: ModelConfig, seed: int, n: int = CALIBRATION_TOKENS) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA11B]))
    return rng.integers(0, cfg.vocab_size, size=n)


def calibrate(cfg: ModelConfig, source: WeightSource, bits_for, *, seed: int = 0,
              tokens: np.ndarray | None = None, quantize=None) -> Numerics:
    """Integer parameters of a dense model (``bits_for(name) -> bits``; MLA models:
    :func:`.blocks.mla_calib.calibrate_mla`) for the int8
    scheme, from ``tokens`` (default: :func:`calibration_tokens`); ``quantize(name)`` gives a
    matrix's quantized form, by default symmetric per channel at its bits."""
    if tokens is None:
        tokens = calibration_tokens(cfg, seed)
    if cfg.is_mla:  # its own float pass and parameters
        return calibrate_mla(cfg, source, bits_for, tokens, quantize)
    amax, qw, _ = activation_absmax(cfg, source, bits_for, tokens, quantize=quantize)
    s = {k: activation_scale(v) for k, v in amax.items()}
    return derive(cfg, source, bits_for, s, qw, quantize=quantize)


def activation_absmax(cfg: ModelConfig, source: WeightSource, bits_for, tokens: np.ndarray,
                      *, quantize=None, norm=None,
                      ) -> tuple[dict[str, float], dict[str, QuantizedWeight], np.ndarray]:
    """The largest magnitude of every activation tensor of a float forward pass over
    ``tokens`` (weights quantized by ``quantize(name)``, by default symmetric per channel at
    their bits, then dequantized), the quantized weights of the last layer, and the final
    norm's output (float32 ``[tokens, hidden]``). ``norm``: the norm function instead of
    the model's own (a LayerNorm in a rotated residual's space)."""
    quantize = quantize or (lambda name: quantize_weight(source.tensor(name), bits_for(name)))
    if cfg.is_mla:
        raise NotImplementedError(
            f"model {cfg.name or cfg.family!r}: this float pass is grouped-query "
            "attention's; MLA models calibrate through calibrate() (the int8 scheme)")
    n = len(tokens)
    normf = norm or (layer_norm if cfg.norm_kind == "layer" else rms_norm)
    amax: dict[str, float] = {}
    qw: dict[str, QuantizedWeight] = {}

    def rec(key: str, x: np.ndarray) -> np.ndarray:
        amax[key] = max(amax.get(key, 0.0), float(np.abs(x).max()))
        return x

    def lin(x: np.ndarray, name: str, bias: str | None = None) -> np.ndarray:
        if name not in qw:
            qw[name] = quantize(name)
        y = exact.weight_product(x, qw[name])
        if bias is not None:
            y = y + source.tensor(bias)
        return y.astype(np.float32)

    x = rec("x0", embed_rows(cfg, source.tensor("embed"), tokens))
    cos, sin = rope_cos_sin(cfg, np.arange(n))
    hd, H, KV = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    scale = softmax_scale(cfg)
    future = np.arange(n)[None, :] > np.arange(n)[:, None]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        # EXAONE-4.0: no norm before the projections, one after; Gemma: both (sandwich)
        pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
        xn = rec(f"{i}.xn", normf(x, source.tensor(p + "attn_norm"), cfg.rms_norm_eps)
                 if pre else x)
        bq = (p + "q_bias", p + "k_bias", p + "v_bias") if cfg.qkv_bias else (None,) * 3
        q = lin(xn, p + "q_proj", bq[0]).reshape(n, H, hd)
        k = lin(xn, p + "k_proj", bq[1]).reshape(n, KV, hd)
        v = rec(f"{i}.v", lin(xn, p + "v_proj", bq[2])).reshape(n, KV, hd)
        # RoPE rotates channel pairs (j, j + hd/2): at any position a rotated value is at
        # most its pair's norm, so that norm (not the values at the calibration
        # positions) bounds the int8 range of q and k wherever they are used.
        if cfg.qk_norm:  # the projections' outputs, then each head's RMSNorm
            rec(f"{i}.qraw", q)
            rec(f"{i}.kraw", k)
            q = rms_norm(q, source.tensor(p + "q_norm"), cfg.rms_norm_eps)
            k = rms_norm(k, source.tensor(p + "k_norm"), cfg.rms_norm_eps)
        rec(f"{i}.q", _pair_norm(q))
        rec(f"{i}.k", _pair_norm(k))
        if cfg.layer_has_rope(i):
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        masked = future
        if cfg.layer_window(i) is not None:  # a sliding layer sees its last window
            masked = future | (np.arange(n)[None, :] <= np.arange(n)[:, None]
                               - cfg.layer_window(i))
        g = H // KV
        kk = np.repeat(k, g, axis=1)
        vv = np.repeat(v, g, axis=1)
        s = exact.matmul(q.transpose(1, 0, 2), kk.transpose(1, 2, 0)).astype(np.float32) * scale
        s = np.where(masked[None], -np.inf, s)
        ao = exact.matmul(softmax(s, axis=-1), vv.transpose(1, 0, 2)).transpose(1, 0, 2)
        ao = ao.reshape(n, H * hd)
        ao = rec(f"{i}.ao", ao.astype(np.float32))
        o = rec(f"{i}.o", lin(ao, p + "o_proj", p + "o_bias" if cfg.o_bias else None))
        if post:
            o = rec(f"{i}.on", rms_norm(o, source.tensor(p + "post_attn_norm"),
                                        cfg.rms_norm_eps))
        x = rec(f"{i}.xm", (x + o).astype(np.float32))
        if not pre:
            xn2 = rec(f"{i}.xn2", x)
        elif cfg.parallel_block:  # the MLP reads the attention's norm of the layer input
            xn2 = rec(f"{i}.xn2", xn)
        else:
            xn2 = rec(f"{i}.xn2", normf(x, source.tensor(p + "mlp_norm"), cfg.rms_norm_eps))
        d = mlp_float(cfg, i, xn2, rec, lin)  # dense or MoE
        if post:
            d = rec(f"{i}.dn", rms_norm(d, source.tensor(p + "post_mlp_norm"),
                                        cfg.rms_norm_eps))
        x = rec(f"x{i + 1}", (x + d).astype(np.float32))
    fn = rec("fn", normf(x, source.tensor("final_norm"), cfg.rms_norm_eps))
    return amax, qw, fn


def derive(cfg: ModelConfig, source: WeightSource, bits_for, s: dict[str, float],
           qw: dict[str, QuantizedWeight] | None = None, *, quantize=None) -> Numerics:
    """Integer parameters from the activation scales ``s``."""
    qw = dict(qw or {})
    quantize = quantize or (lambda name: quantize_weight(source.tensor(name), bits_for(name)))

    def w(name: str) -> QuantizedWeight:
        if name not in qw:
            qw[name] = quantize(name)
        return qw[name]

    def bias(name: str, present: bool) -> np.ndarray | None:
        return source.tensor(name) if present else None

    eps = cfg.rms_norm_eps
    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        L = LayerQ()
        pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
        if pre:
            L.attn_norm = norm_params(source.tensor(p + "attn_norm"), s[f"x{i}"],
                                      s[f"{i}.xn"], eps)
        sq, sk = (f"{i}.qraw", f"{i}.kraw") if cfg.qk_norm else (f"{i}.q", f"{i}.k")
        L.q = gemm_params(s[f"{i}.xn"], w(p + "q_proj"), s[sq],
                          bias(p + "q_bias", cfg.qkv_bias))
        L.k = gemm_params(s[f"{i}.xn"], w(p + "k_proj"), s[sk],
                          bias(p + "k_bias", cfg.qkv_bias))
        if cfg.qk_norm:
            L.q_norm = norm_params(source.tensor(p + "q_norm"), s[sq], s[f"{i}.q"], eps)
            L.k_norm = norm_params(source.tensor(p + "k_norm"), s[sk], s[f"{i}.k"], eps)
        L.v = gemm_params(s[f"{i}.xn"], w(p + "v_proj"), s[f"{i}.v"],
                          bias(p + "v_bias", cfg.qkv_bias))
        L.attn = attn_params(s[f"{i}.q"], s[f"{i}.k"], s[f"{i}.v"], s[f"{i}.ao"],
                             softmax_scale(cfg))
        L.o = gemm_params(s[f"{i}.ao"], w(p + "o_proj"), s[f"{i}.o"],
                          bias(p + "o_bias", cfg.o_bias))
        o_out = f"{i}.on" if post else f"{i}.o"
        L.add1 = add_params(s[f"x{i}"], s[o_out], s[f"{i}.xm"])
        if post:
            L.post_attn_norm = norm_params(source.tensor(p + "post_attn_norm"), s[f"{i}.o"],
                                           s[o_out], eps)
        if cfg.parallel_block:  # the layer input's norm again (blocks/parallel.py)
            L.mlp_norm = norm_params(source.tensor(p + "attn_norm"), s[f"x{i}"],
                                     s[f"{i}.xn2"], eps)
        elif pre:
            L.mlp_norm = norm_params(source.tensor(p + "mlp_norm"), s[f"{i}.xm"],
                                     s[f"{i}.xn2"], eps)
        if cfg.layer_is_moe(i):
            moe_params(cfg, i, s, w, L)
            layers.append(L)
            qw = {k: v for k, v in qw.items() if not k.startswith(p)}
            continue
        L.gate = gemm_params(s[f"{i}.xn2"], w(p + "gate_proj"), s[f"{i}.gate"], None)
        L.up = gemm_params(s[f"{i}.xn2"], w(p + "up_proj"), s[f"{i}.up"], None)
        L.silu = silu_params(s[f"{i}.gate"], s[f"{i}.up"], s[f"{i}.h"])
        L.down = gemm_params(s[f"{i}.h"], w(p + "down_proj"), s[f"{i}.down"], None)
        d_out = f"{i}.dn" if post else f"{i}.down"
        L.add2 = add_params(s[f"{i}.xm"], s[d_out], s[f"x{i + 1}"])
        if post:
            L.post_mlp_norm = norm_params(source.tensor(p + "post_mlp_norm"),
                                          s[f"{i}.down"], s[d_out], eps)
        layers.append(L)
        qw = {k: v for k, v in qw.items() if not k.startswith(p)}  # keep memory bounded
    final = norm_params(source.tensor("final_norm"), s[f"x{cfg.num_layers}"], s["fn"], eps)
    head_w = w(cfg.lm_head_tensor)
    head = gemm_params(s["fn"], head_w, None, None)
    row_scale = (s["fn"] * cfg.logit_scale
                 * head_w.scales.astype(np.float64)).astype(np.float32)
    return Numerics(input_scale=s["x0"], layers=layers, final_norm=final, head=head,
                    head_row_scale=row_scale, scales=s, functional=True)
