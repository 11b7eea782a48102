"""Integer parameters of the int8 kernels from activation scales: the multipliers, shifts
and gains of :mod:`.numerics` that follow from a static scale per activation, the
weights' per-row scales and the kernels' formulas (``isa/kernels``). Every calibration
(:mod:`.calibrate`, :mod:`.calibrate_wide`, the blocks' own: ``blocks/*_calib.py``)
derives its parameters with these."""

from __future__ import annotations

import math

import numpy as np

from isa.kernels.fixed import quantize_multiplier

from ..weights import QuantizedWeight
from .numerics import AddQ, AttnQ, GemmQ, NormQ, SiluQ
from .wgroup import MULT_BITS as GROUP_MULT_BITS
from .wgroup import GroupQuantizedWeight

#: Headroom over the calibration maximum: inputs outside the calibration set can be
#: larger, and a clipped int8 activation costs more than a coarser step (25 % is a
#: common choice for static max calibration).
MARGIN = 1.25
INT8_MAX = 127
INT32_MAX = 2**31 - 1
#: Gain of RMSNorm is stored as int16.
GAMMA_MAX = 32767
#: Bound of the residual-add multipliers so ``a*ma + b*mb`` stays far inside int64.
ADD_MULT_BITS = 30
#: Fractional bits of SwiGLU's internal fixed point (isa.kernels.vector: Q20).
SILU_Q = 20
#: SwiGLU ``out_mult`` must stay below 2**24 (isa.kernels.vector.silu_mul).
SILU_OUT_MULT_BITS = 23
#: Attention: logits in Q20, probabilities in Q24 (isa.kernels.attention).
LOGIT_Q = 20
PROB_Q = 24


def activation_scale(absmax: float) -> float:
    """The static int8 step of an activation whose calibration maximum is ``absmax``."""
    return max(float(absmax), 1e-6) * MARGIN / INT8_MAX


def gemm_params(s_in: float, qw: QuantizedWeight | GroupQuantizedWeight, s_out: float | None,
                bias: np.ndarray | None) -> GemmQ:
    """Per-row multipliers with one shared shift (as large as int32 multipliers allow;
    below ``2**24`` for group-wise weights, whose int64 accumulators need the room)."""
    limit = 2**GROUP_MULT_BITS - 1 if isinstance(qw, GroupQuantizedWeight) else 2**31 - 1
    real = (s_in * qw.scales.astype(np.float64))
    b = None
    if bias is not None:
        b = np.clip(np.rint(bias.astype(np.float64) / real), -(2**31), 2**31 - 1)
        b = b.astype(np.int32)
    if s_out is None:
        return GemmQ(shift=0, mult=None, bias=b)
    ratio = real / s_out
    top = float(ratio.max())
    shift = min(62, max(0, math.floor(math.log2(limit / top))))
    mult = np.clip(np.rint(ratio * 2.0**shift), 0, limit).astype(np.int32)
    return GemmQ(shift=shift, mult=mult, bias=b)


def norm_params(gamma: np.ndarray, s_in: float, s_out: float, eps: float) -> NormQ:
    """RMSNorm: ``out ~= x * g * 2**(23 - shift) / rms(x)`` (isa.kernels.vector.rmsnorm)."""
    gmax = float(np.abs(gamma).max()) or 1.0
    shift = 23 + math.floor(math.log2(GAMMA_MAX * s_out / gmax))
    shift = max(0, min(62, shift))
    g = np.clip(np.rint(gamma / s_out * 2.0 ** (shift - 23)), -GAMMA_MAX, GAMMA_MAX)
    eps_q = int(round(eps / (s_in * s_in) * 2**16))
    return NormQ(eps_q=eps_q, shift=shift, gamma=g.astype(np.int16))


def add_params(s_a: float, s_b: float, s_out: float) -> AddQ:
    ra, rb = s_a / s_out, s_b / s_out
    shift = max(0, min(62, math.floor(math.log2((2**ADD_MULT_BITS) / max(ra, rb)))))
    return AddQ(ma=int(round(ra * 2**shift)), mb=int(round(rb * 2**shift)), shift=shift)


def silu_params(s_gate: float, s_up: float, s_out: float) -> SiluQ:
    im, ish = quantize_multiplier(s_gate * 2**SILU_Q)
    om, osh = quantize_multiplier(s_up / (s_out * 2**SILU_Q), mult_bits=SILU_OUT_MULT_BITS)
    return SiluQ(in_mult=im, in_shift=ish, out_mult=om, out_shift=osh)


def attn_params(s_q: float, s_k: float, s_v: float, s_out: float, scale: float) -> AttnQ:
    sm, ss = quantize_multiplier(s_q * s_k * scale * 2**LOGIT_Q)
    om, osh = quantize_multiplier(s_v / (s_out * 2**PROB_Q))
    return AttnQ(score_mult=sm, score_shift=ss, out_mult=om, out_shift=osh)
