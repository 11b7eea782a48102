"""The integer parameters of a compiled model: requantization multipliers and shifts,
norm gains, attention and SwiGLU fixed-point factors, per layer.

They are derived (``calibrate.py``) from static per-tensor activation scales (``real =
int8 * scale``) measured on a float forward pass, and from the per-row weight scales. The
kernels' formulas are in ``isa/kernels`` (round half up, saturation); each parameter's
meaning follows them:

- GEMM: ``out = sat8(rs((acc + bias) * mult[n], shift))``, ``mult[n] * 2**-shift =
  s_in * s_w[n] / s_out``, ``bias = round(b / (s_in * s_w[n]))``
- RMSNorm: ``out = sat8(rs(x * g * floor(2**31 / rms_q8), shift))``, ``g = round(gamma /
  s_out * 2**(shift - 23))`` (int16), ``eps_q = eps / s_x**2 * 2**16``
- residual add: ``out = sat8(rs(a * ma + b * mb, shift))``, ``ma * 2**-shift = s_a / s_out``
- SwiGLU: ``in_mult * 2**-in_shift = s_gate * 2**20``, ``out_mult * 2**-out_shift =
  s_up / (s_out * 2**20)``
- attention: ``score_mult * 2**-score_shift = s_q * s_k * softmax_scale * 2**20``,
  ``out_mult * 2**-out_shift = s_v / (s_out * 2**24)``
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GemmQ:
    shift: int = 0
    mult: np.ndarray | None = None  # int32[n]; None: int32 output (LM head)
    bias: np.ndarray | None = None  # int32[n]


@dataclass
class NormQ:
    eps_q: int = 0
    shift: int = 0
    gamma: np.ndarray | None = None  # int16[width]


@dataclass
class AddQ:
    ma: int = 1
    mb: int = 1
    shift: int = 0


@dataclass
class SiluQ:
    in_mult: int = 1
    in_shift: int = 0
    out_mult: int = 1
    out_shift: int = 0


@dataclass
class AttnQ:
    score_mult: int = 1
    score_shift: int = 0
    out_mult: int = 1
    out_shift: int = 0


@dataclass
class LayerQ:
    attn_norm: NormQ = field(default_factory=NormQ)
    q: GemmQ = field(default_factory=GemmQ)
    k: GemmQ = field(default_factory=GemmQ)
    v: GemmQ = field(default_factory=GemmQ)
    attn: AttnQ = field(default_factory=AttnQ)
    o: GemmQ = field(default_factory=GemmQ)
    add1: AddQ = field(default_factory=AddQ)
    mlp_norm: NormQ = field(default_factory=NormQ)
    gate: GemmQ = field(default_factory=GemmQ)
    up: GemmQ = field(default_factory=GemmQ)
    silu: SiluQ = field(default_factory=SiluQ)
    down: GemmQ = field(default_factory=GemmQ)
    add2: AddQ = field(default_factory=AddQ)
    # EXAONE-4.0 (blocks/postnorm.py): QK norms and the norms after attention and MLP
    q_norm: NormQ = field(default_factory=NormQ)
    k_norm: NormQ = field(default_factory=NormQ)
    post_attn_norm: NormQ = field(default_factory=NormQ)
    post_mlp_norm: NormQ = field(default_factory=NormQ)


@dataclass
class Numerics:
    """Everything the programs and the weight image need beyond the weights' codes."""

    input_scale: float  # real value of one int8 step of the embeddings fed to layer 0
    layers: list[LayerQ]
    final_norm: NormQ
    head: GemmQ
    head_row_scale: np.ndarray | None = None  # float32[vocab]: logit = acc * row_scale
    scales: dict[str, float] = field(default_factory=dict)  # activation scales, for reports
    functional: bool = True

    @classmethod
    def placeholder(cls, num_layers: int) -> Numerics:
        """Scalars only (no arrays): enough to lower programs for timing-only runs."""
        return cls(1.0, [LayerQ() for _ in range(num_layers)], NormQ(), GemmQ(),
                   functional=False)
