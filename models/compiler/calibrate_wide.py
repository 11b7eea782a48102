"""Integer parameters of the wide pipeline (``numerics.residual = int16 | int32`` with
``act_scale = token``), the kernels of ``isa.kernels.wide``:

- the residual stream is int16/int32 with one static scale per point (``x<i>``, ``<i>.xm``:
  calibrated largest magnitude x :data:`~.qparams.MARGIN` over the type's largest value);
- each RMSNorm (RMSNORM_WIDE) writes int32 at a scale fixed by its gain's int16 encoding,
  and QUANT_ROW turns it into int8 with one dynamic scale per token (row);
- q/k/v are GemmRow outputs in static int8 (the native int8 KV cache); the attention output
  stays static int8 (it is stored per head by the core that owns the head, so no core sees
  a whole token's row);
- o_proj/down_proj are GemmRow outputs in int32 already on the output residual's scale, and
  ADD_WIDE adds them to the rescaled residual (the fused epilogue: they never exist as int8);
- gate/up are GemmRow int32 outputs and SILU_MUL_WIDE writes int32 SwiGLU outputs, at static
  scales of :data:`WIDE_Q` bits; down_proj's core quantizes each whole row per token;
- the LM head is a GemmRow with int32 logits on one static scale (``head_row_scale``).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np

from isa.kernels.fixed import quantize_multiplier
from isa.kernels.wide import MIN_ROW_SHIFT, ROW_FACTOR_Q, SILU_WIDE_OUT_MULT_BITS

from .. import exact
from ..bits import BitConfig
from ..config import ModelConfig
from ..reference import softmax_scale
from ..source import calibration_text, model_tokenizer, open_weights
from ..weights import CachedWeights, QuantizedWeight, WeightSource
from .calibrate import activation_absmax, calibrate, calibration_tokens
from .numerics import AddQ, GemmQ, LayerQ, NormQ, Numerics, SiluQ, residual_bits
from .qparams import GAMMA_MAX, INT8_MAX, INT32_MAX, MARGIN, SILU_Q, attn_params, norm_params
from .rotation import RotatedWeights, head_tensor, rotated_layer_norm
from .wgroup import MULT_BITS, GroupQuantizedWeight, quantize_matrix, weight_group_size

#: Bits of magnitude the int32 intermediates (gate/up, SwiGLU output) use at their static
#: scale: the calibrated maximum x MARGIN maps to 2**22 (SILU_MUL_WIDE needs |up| < 2**23
#: for its bound; 22 bits are far finer than the int8 they are quantized to next).
WIDE_Q = 22
#: Logits: the calibrated maximum x MARGIN maps to 2**24 of the int32 output.
LOGITS_Q = 24
#: The RMSNORM_WIDE output stays below 2**30 (``|x / rms(x)| <= sqrt(cols)``).
NORM_OUT_BITS = 30
#: At most this many tokens of the calibration passage (one float forward pass).
CALIBRATION_TEXT_TOKENS = 512


def wide_norm_params(gamma: np.ndarray, s_in: float, eps: float,
                     cols: int) -> tuple[NormQ, float]:
    """RMSNORM_WIDE parameters and the real value of one step of its int32 output:
    ``out = x / rms(x) * g * 2**(23 - shift)`` with ``g = gamma / s_g`` (int16)."""
    s_g = max(float(np.abs(gamma).max()), 1e-12) / GAMMA_MAX
    g = np.clip(np.rint(gamma / s_g), -GAMMA_MAX, GAMMA_MAX).astype(np.int16)
    top = math.sqrt(cols) * GAMMA_MAX * 2.0**23
    shift = max(0, math.ceil(math.log2(top)) - NORM_OUT_BITS)
    eps_q = int(min(INT32_MAX, round(eps / (s_in * s_in) * 2**16)))
    return NormQ(eps_q=eps_q, shift=shift, gamma=g), s_g * 2.0 ** (shift - 23)


def wide_post_norm_params(gamma: np.ndarray, s_in: float, eps: float, cols: int,
                          s_out: float) -> NormQ:
    """RMSNORM_WIDE parameters of a post-norm (EXAONE-4.0) whose int32 output lands on the
    residual's scale ``s_out``, so ADD_WIDE adds it as it is: one output step is ``s_g *
    2**(shift - 23)`` (:func:`wide_norm_params`), so the gain's scale is ``s_g = s_out *
    2**(23 - shift)`` with the largest ``shift`` that keeps ``|gamma| / s_g`` within the
    int16 gain's range (``s_g`` within a factor 2 of the finest: 14+ bits of gain)."""
    top = max(float(np.abs(gamma).max()), 1e-12)
    shift = max(0, 23 + math.floor(math.log2(GAMMA_MAX * s_out / top)))
    s_g = s_out * 2.0 ** (23 - shift)
    g = np.clip(np.rint(gamma / s_g), -GAMMA_MAX, GAMMA_MAX).astype(np.int16)
    eps_q = int(min(INT32_MAX, round(eps / (s_in * s_in) * 2**16)))
    return NormQ(eps_q=eps_q, shift=shift, gamma=g)


#: The largest ``|D c + M|`` of a group-wise 4-bit weight (uint8 D, uint4 c, int16 M).
GROUP_WEIGHT_MAX = 255 * 15 + 32768


def gemm_row_params(s_in: float, qw: QuantizedWeight | GroupQuantizedWeight, s_out: float,
                    bias: np.ndarray | None, *, rowed: bool, out_bits: int) -> GemmQ:
    """GemmRow parameters (``isa.kernels.wide.requant_rows``): ``mult[n] * 2**-S =
    s_in * s_w[n] / s_out``; with per-row inputs (factor ``fa * 2**(p - 22)``) the shift
    splits into ``shift`` (keeps ``acc * mult`` inside int32) and ``row_shift``. Group-wise
    weights (``gemm.gr``): multipliers below ``2**24`` (their int64 accumulators need the
    room) and the accumulator bound of their integer weights ``D c + M``."""
    grouped = isinstance(qw, GroupQuantizedWeight)
    limit = 2**MULT_BITS - 1 if grouped else INT32_MAX
    real = s_in * qw.scales.astype(np.float64)
    ratio = real / s_out
    top = float(ratio.max()) or 1.0
    s_total = min(62, math.floor(math.log2(limit / top)))
    mult = np.clip(np.rint(ratio * 2.0**s_total), 0, limit).astype(np.int32)
    if not rowed:
        b = None if bias is None else np.clip(np.rint(bias / real), -INT32_MAX - 1,
                                              INT32_MAX).astype(np.int32)
        return GemmQ(shift=max(0, s_total), mult=mult, bias=b, out_bits=out_bits)
    # |acc| bound: int8 activations times int8 weights, or times |D c + M| of group weights
    acc_max = 128 * GROUP_WEIGHT_MAX * qw.k if grouped else INT8_MAX * INT8_MAX * qw.k
    acc_bits = acc_max.bit_length()
    sh1 = max(0, min(acc_bits, s_total + ROW_FACTOR_Q - MIN_ROW_SHIFT))
    sh1 = max(sh1, s_total + ROW_FACTOR_Q - 62)  # a tiny ratio: keep row_shift <= 62
    row_shift = s_total - sh1 + ROW_FACTOR_Q
    if not MIN_ROW_SHIFT <= row_shift <= 62:
        raise ValueError(f"gemm_row_params: row_shift {row_shift} out of range (scale ratio "
                         f"{top:.3g})")
    b = None if bias is None else np.clip(np.rint(bias / s_out), -INT32_MAX - 1,
                                          INT32_MAX).astype(np.int32)
    return GemmQ(shift=sh1, mult=mult, bias=b, row_shift=row_shift, out_bits=out_bits)


def wide_add_params(s_in: float, s_out: float) -> AddQ:
    """ADD_WIDE: ``rs(r * ma, shift)`` puts the residual ``r`` on the output's scale."""
    ma, shift = quantize_multiplier(s_in / s_out)
    return AddQ(ma=ma, mb=1, shift=shift)


def wide_silu_params(s_gate: float, s_up: float, s_out: float) -> SiluQ:
    im, ish = quantize_multiplier(s_gate * 2**SILU_Q)
    om, osh = quantize_multiplier(s_up / s_out, mult_bits=SILU_WIDE_OUT_MULT_BITS)
    return SiluQ(in_mult=im, in_shift=ish, out_mult=om, out_shift=osh)


def derive_wide(cfg: ModelConfig, source: WeightSource, bits_for, amax: dict[str, float],
                fn: np.ndarray, *, residual_bits: int, rotated: bool,
                group: int = 0) -> Numerics:
    """The wide pipeline's integer parameters from the calibration maxima ``amax`` (keys
    of :func:`.calibrate.activation_absmax`) and the final norm's float output ``fn``;
    4-bit matrices are group-wise for ``group`` > 0 (:mod:`.wgroup`)."""
    qmax = 2 ** (residual_bits - 1) - 1

    def scale(key: str, top: float) -> float:
        return max(float(amax[key]), 1e-6) * MARGIN / top

    def w(name: str) -> QuantizedWeight | GroupQuantizedWeight:
        return quantize_matrix(source.tensor(name), bits_for(name), group)

    def bias(name: str, present: bool) -> np.ndarray | None:
        return source.tensor(name) if present else None

    eps, h = cfg.rms_norm_eps, cfg.hidden_size
    # a post-norm's int32 input is no finer than this step, so that its eps (in the
    # input's units: eps / s**2 * 2**16) fits RMSNORM_WIDE's int32 eps_q: a projection
    # output whose RMS is near sqrt(eps) is then normalised as the float model does
    post_floor = math.sqrt(eps * 2**16 / INT32_MAX)
    s: dict[str, float] = {}
    for i in range(cfg.num_layers + 1):
        s[f"x{i}"] = scale(f"x{i}", qmax)
    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        s[f"{i}.xm"] = scale(f"{i}.xm", qmax)
        for key in ("q", "k", "v", "ao"):
            s[f"{i}.{key}"] = scale(f"{i}.{key}", INT8_MAX)
        for key in ("gate", "up", "h"):
            s[f"{i}.{key}"] = scale(f"{i}.{key}", 2.0**WIDE_Q)
        L = LayerQ()
        # EXAONE-4.0: norms after the branches only; Gemma: before and after (sandwich)
        pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
        if not pre:  # no norm: QUANT_ROW_WIDE of the residual itself
            s_xn = s[f"x{i}"]
        else:
            L.attn_norm, s_xn = wide_norm_params(source.tensor(p + "attn_norm"), s[f"x{i}"],
                                                 eps, h)
        if cfg.qk_norm:  # q, k before their head norms (int8 RMSNORM, static scales)
            for key in ("qraw", "kraw"):
                s[f"{i}.{key}"] = scale(f"{i}.{key}", INT8_MAX)
        for key, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
            out = f"{i}.{key}raw" if cfg.qk_norm and key != "v" else f"{i}.{key}"
            setattr(L, key, gemm_row_params(s_xn, w(p + proj), s[out],
                                            bias(p + f"{key}_bias", cfg.qkv_bias),
                                            rowed=True, out_bits=8))
        if cfg.qk_norm:
            L.q_norm = norm_params(source.tensor(p + "q_norm"), s[f"{i}.qraw"], s[f"{i}.q"],
                                   eps)
            L.k_norm = norm_params(source.tensor(p + "k_norm"), s[f"{i}.kraw"], s[f"{i}.k"],
                                   eps)
        L.attn = attn_params(s[f"{i}.q"], s[f"{i}.k"], s[f"{i}.v"], s[f"{i}.ao"],
                             softmax_scale(cfg))
        if post:  # o_proj to int32, its post-norm straight onto the residual's scale
            s[f"{i}.o"] = max(scale(f"{i}.o", 2.0**WIDE_Q), post_floor)
            L.o = gemm_row_params(s[f"{i}.ao"], w(p + "o_proj"), s[f"{i}.o"],
                                  bias(p + "o_bias", cfg.o_bias), rowed=False, out_bits=32)
            L.post_attn_norm = wide_post_norm_params(source.tensor(p + "post_attn_norm"),
                                                     s[f"{i}.o"], eps, h, s[f"{i}.xm"])
        else:
            L.o = gemm_row_params(s[f"{i}.ao"], w(p + "o_proj"), s[f"{i}.xm"],
                                  bias(p + "o_bias", cfg.o_bias), rowed=False, out_bits=32)
        L.add1 = wide_add_params(s[f"x{i}"], s[f"{i}.xm"])
        if not pre:  # the MLP reads x_m unnormalised (QUANT_ROW_WIDE)
            s_xn2 = s[f"{i}.xm"]
        elif cfg.parallel_block:  # the layer input's norm again (blocks/parallel.py)
            L.mlp_norm, s_xn2 = wide_norm_params(source.tensor(p + "attn_norm"), s[f"x{i}"],
                                                 eps, h)
        else:
            L.mlp_norm, s_xn2 = wide_norm_params(source.tensor(p + "mlp_norm"), s[f"{i}.xm"],
                                                 eps, h)
        L.gate = gemm_row_params(s_xn2, w(p + "gate_proj"), s[f"{i}.gate"], None, rowed=True,
                                 out_bits=32)
        L.up = gemm_row_params(s_xn2, w(p + "up_proj"), s[f"{i}.up"], None, rowed=True,
                               out_bits=32)
        L.silu = wide_silu_params(s[f"{i}.gate"], s[f"{i}.up"], s[f"{i}.h"])
        if post:  # down_proj to int32, its post-norm onto the next residual's scale
            s[f"{i}.down"] = max(scale(f"{i}.down", 2.0**WIDE_Q), post_floor)
            L.down = gemm_row_params(s[f"{i}.h"], w(p + "down_proj"), s[f"{i}.down"], None,
                                     rowed=True, out_bits=32)
            L.post_mlp_norm = wide_post_norm_params(source.tensor(p + "post_mlp_norm"),
                                                    s[f"{i}.down"], eps, h, s[f"x{i + 1}"])
        else:
            L.down = gemm_row_params(s[f"{i}.h"], w(p + "down_proj"), s[f"x{i + 1}"], None,
                                     rowed=True, out_bits=32)
        L.add2 = wide_add_params(s[f"{i}.xm"], s[f"x{i + 1}"])
        layers.append(L)
    final, s_fn = wide_norm_params(source.tensor("final_norm"), s[f"x{cfg.num_layers}"], eps, h)
    head_w = quantize_matrix(head_tensor(source), bits_for(cfg.lm_head_tensor), group)
    logits = exact.weight_product(fn, head_w)
    s["logits"] = max(float(np.abs(logits).max()), 1e-6) * MARGIN / 2.0**LOGITS_Q
    head = gemm_row_params(s_fn, head_w, s["logits"], None, rowed=True, out_bits=32)
    row_scale = np.full(cfg.vocab_size, s["logits"] * cfg.logit_scale, np.float32)
    return Numerics(input_scale=s["x0"], layers=layers, final_norm=final, head=head,
                    head_row_scale=row_scale, scales=s, functional=True,
                    residual_bits=residual_bits, rotated=rotated)


def device_weights(cfg: ModelConfig, spec: dict[str, Any], bits: BitConfig) -> WeightSource:
    """The float weights the device computes with: rotated for ``rotation = residual``.
    The last model's weights are kept (:class:`CachedWeights`): its compile and its
    launch (the weight image) read the same tensors."""
    rotated = bits.numerics.rotation != "none"
    key = (cfg.model_dump_json(), json.dumps(spec, sort_keys=True, default=repr), rotated)
    if _LAST_WEIGHTS and _LAST_WEIGHTS[0] == key:
        return _LAST_WEIGHTS[1]
    source: WeightSource = CachedWeights(open_weights(cfg, spec))
    if rotated:
        source = CachedWeights(RotatedWeights(source))
    _LAST_WEIGHTS[:] = [key, source]
    return source


#: ``[key, source]`` of the last :func:`device_weights` call (one model's weights kept).
_LAST_WEIGHTS: list = []


def calibration_ids(cfg: ModelConfig, spec: dict[str, Any], bits: BitConfig,
                    seed: int) -> np.ndarray:
    """The calibration tokens: the calibration passage (``models/data/calibration.txt``)
    in the model's own tokenizer for ``calibration = text``, else
    :func:`.calibrate.calibration_tokens`. Synthetic weights have no tokenizer (and a text
    means nothing to random weights): they are calibrated on random ids either way."""
    if bits.numerics.calibration != "text" or spec.get("kind") == "synthetic":
        return calibration_tokens(cfg, seed)
    ids = model_tokenizer(spec).encode(calibration_text())
    return np.asarray(ids[:CALIBRATION_TEXT_TOKENS], np.int64) % cfg.vocab_size


def calibrate_for(cfg: ModelConfig, bits: BitConfig, source: WeightSource,
                  spec: dict[str, Any]) -> Numerics:
    """The integer parameters of ``bits.numerics`` (int8 scheme or wide pipeline). They
    depend on the model, its weights, the weight bits and the numerics only (not on the KV
    format or the read path), so the last few are kept: compiling one model in several KV
    formats calibrates it once. Each caller gets its own copy."""
    key = (cfg.model_dump_json(), json.dumps(spec, sort_keys=True, default=repr),
           bits.weights.model_dump_json(), bits.numerics.model_dump_json())
    for k, nq in _CALIBRATED:
        if k == key:
            return copy.deepcopy(nq)
    nq = _calibrate_for(cfg, bits, source, spec)
    _CALIBRATED[:] = [*_CALIBRATED[-(_CALIBRATED_KEPT - 1):], (key, copy.deepcopy(nq))]
    return nq


#: (key, numerics) of the last :data:`_CALIBRATED_KEPT` calibrations (:func:`calibrate_for`).
_CALIBRATED: list = []
_CALIBRATED_KEPT = 4


def _calibrate_for(cfg: ModelConfig, bits: BitConfig, source: WeightSource,
                   spec: dict[str, Any]) -> Numerics:
    def bits_for(name: str) -> int:
        return bits.weights.bits_for(cfg.tensor_spec(name).role)

    group = weight_group_size(bits)

    def quantize(name: str) -> QuantizedWeight | GroupQuantizedWeight:
        return quantize_matrix(source.tensor(name), bits_for(name), group)

    tokens = calibration_ids(cfg, spec, bits, int(spec.get("seed", 0)))
    rb = residual_bits(bits.numerics)
    rotated = bits.numerics.rotation != "none"
    if rb == 8:
        nq = calibrate(cfg, source, bits_for, tokens=tokens, quantize=quantize)
        nq.rotated = rotated
        return nq
    norm = rotated_layer_norm if rotated and cfg.norm_kind == "layer" else None
    amax, _, fn = activation_absmax(cfg, source, bits_for, tokens, quantize=quantize,
                                    norm=norm)
    return derive_wide(cfg, source, bits_for, amax, fn, residual_bits=rb, rotated=rotated,
                       group=group)
