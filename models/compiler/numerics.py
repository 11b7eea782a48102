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

The wide pipeline (``calibrate_wide.py``) reuses these records for its kernels
(``isa.kernels.wide``): ``NormQ`` for RMSNORM_WIDE (int32 output), ``AddQ`` (``ma``,
``shift``) for ADD_WIDE, ``SiluQ`` for SILU_MUL_WIDE, ``GemmQ`` with ``row_shift`` and
``out_bits`` for GemmRow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from isa.kernels.wide import ROW_FACTOR_Q

#: The wide pipeline's GEMMs with int32 outputs (o/down: into the residual add; gate/up:
#: into SwiGLU); q/k/v stay int8 (the KV cache). The LM head's logits are int32 too.
WIDE_INT32_OUTPUTS = ("o", "gate", "up", "down")


@dataclass
class GemmQ:
    shift: int = 0
    mult: np.ndarray | None = None  # int32[n]; None: int32 output (LM head)
    bias: np.ndarray | None = None  # int32[n]
    #: wide pipeline (``GemmRow``): the per-row shift base and the output width
    row_shift: int = ROW_FACTOR_Q
    out_bits: int = 8


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
class MlaQ:
    """An MLA layer's parameters beyond :class:`LayerQ`'s (``q``: ``q_proj`` or ``q_b_proj``,
    ``k``: ``kv_a_proj``, ``v``: ``v_b_proj``; ``attn``: the absorbed attention)."""

    q_a: GemmQ = field(default_factory=GemmQ)  # q_a_proj (models with a query latent)
    q_a_norm: NormQ = field(default_factory=NormQ)
    kv_a_norm: NormQ = field(default_factory=NormQ)  # the latent's RMSNorm
    #: the absorption GEMMs (per head, ``k_b_proj``'s block transposed): ``mult`` is
    #: int32[num_heads * kv_lora_rank], head-major
    k_b: GemmQ = field(default_factory=GemmQ)


@dataclass
class MoeQ:
    """A MoE layer's parameters (blocks/moe.py, blocks/moe_calib.py). The experts of a
    layer share one program, so their GEMMs share ``shift`` and their activations one
    step; the per-row multipliers of each expert (``experts[e]``: gate, up, down) sit in
    that expert's parameter regions, which the routed loads index."""

    router: GemmQ = field(default_factory=GemmQ)
    #: TOPK_GATE: int8 router logit -> Q20 (mult, shift) and its flags (RENORM)
    topk_mult: int = 1
    topk_shift: int = 0
    topk_flags: int = 0
    gate: GemmQ = field(default_factory=GemmQ)  # shift (and, per expert, multipliers)
    up: GemmQ = field(default_factory=GemmQ)
    silu: SiluQ = field(default_factory=SiluQ)
    down: GemmQ = field(default_factory=GemmQ)  # GemmRow into int32 (the routed step)
    experts: list[tuple[GemmQ, GemmQ, GemmQ]] = field(default_factory=list)
    #: the routed sum (int32, the down projections' step) -> int8
    routed_mult: int = 1
    routed_shift: int = 0
    shared_gate: GemmQ = field(default_factory=GemmQ)  # shared experts' gate/up/SwiGLU/down
    shared_up: GemmQ = field(default_factory=GemmQ)
    shared_silu: SiluQ = field(default_factory=SiluQ)
    shared_down: GemmQ = field(default_factory=GemmQ)
    #: Qwen2-MoE: the shared expert's gate logit (one column), its SIGMOID (mult, shift)
    #: and the requantization of the gated shared output (int32 -> int8)
    shared_logit: GemmQ = field(default_factory=GemmQ)
    sigmoid_mult: int = 1
    sigmoid_shift: int = 0
    gated_mult: int = 1
    gated_shift: int = 0
    #: the combine: residual + first operand, then + each further routed partial sum
    add_first: AddQ = field(default_factory=AddQ)
    add_next: AddQ = field(default_factory=AddQ)


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
    #: MLA layers of a calibrated model (blocks/mla_calib.py); None: timing-only or GQA
    mla: MlaQ | None = None
    #: MoE layers of a calibrated model (blocks/moe_calib.py); None: timing-only or dense
    moe: MoeQ | None = None


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
    #: the representation (``BitConfig.numerics``): residual bits (8: the int8 scheme;
    #: 16/32: the wide pipeline, which has per-token GEMM inputs), residual rotated
    residual_bits: int = 8
    rotated: bool = False

    @property
    def wide(self) -> bool:
        """The wide pipeline (int16/int32 residual, per-token int8 GEMM inputs)."""
        return self.residual_bits > 8

    @property
    def residual_bytes(self) -> int:
        return self.residual_bits // 8

    @classmethod
    def placeholder(cls, num_layers: int, residual_bits: int = 8,
                    rotated: bool = False) -> Numerics:
        """Scalars only (no arrays): enough to lower programs for timing-only runs (the
        same programs as the calibrated parameters give: output widths are structural)."""
        layers = [LayerQ() for _ in range(num_layers)]
        head = GemmQ()
        if residual_bits > 8:
            for L in layers:
                for key in WIDE_INT32_OUTPUTS:
                    getattr(L, key).out_bits = 32
            head.out_bits = 32
        return cls(1.0, layers, NormQ(), head, functional=False,
                   residual_bits=residual_bits, rotated=rotated)


def residual_bits(opts) -> int:
    """Bits per residual value of the numerics options ``opts`` (``NumericsOptions``)."""
    return {"int8": 8, "int16": 16, "int16e": 16, "int32": 32}[opts.residual]


def numerics_problem(opts, *, mla_or_moe: bool, unrotatable: str | None = None) -> str | None:
    """Why the compiler cannot build numerics options ``opts`` (a ``NumericsOptions``), or
    None. Built: the int8 scheme (residual int8, static scales) and the wide pipeline
    (residual int16/int32, per-token GEMM inputs, static q/k/v), each with or without the
    offline residual rotation (``unrotatable``: why the model's blocks cannot take it)."""
    if opts.residual == "int16e":
        return ("residual = 'int16e' (a per-token exponent) is not implemented yet; use "
                "'int16' or 'int32'")
    if opts.rotation == "residual+down":
        return ("rotation = 'residual+down' (the online down_proj Hadamard) is not "
                "implemented yet; use 'residual' or 'none'")
    if opts.qkv_scale != "static":
        return "qkv_scale = 'token' is not implemented yet; use 'static'"
    wide = opts.residual != "int8"
    if wide and opts.act_scale != "token":
        return (f"residual = {opts.residual!r} is built with act_scale = 'token' (per-token "
                "GEMM inputs); static GEMM inputs on a wide residual are not implemented")
    if not wide and opts.act_scale != "static":
        return ("act_scale = 'token' is built with a wide residual (residual = 'int16' or "
                "'int32'); the int8 residual keeps static scales")
    if opts.rotation != "none" and mla_or_moe:
        return ("rotation = 'residual' folds the norms into grouped-query attention's "
                "projections; it is not built for MLA/MoE models: use rotation = 'none'")
    if opts.rotation != "none" and unrotatable:
        return (f"rotation = {opts.rotation!r} folds RMSNorm gains into the projections "
                f"that read the residual stream; {unrotatable}: use rotation = 'none' "
                "(e.g. [bits.numerics] preset = 'w8' with rotation = 'none')")
    if wide and mla_or_moe:
        return ("the wide pipeline (residual int16/int32) is built for dense grouped-query-"
                "attention models; use [bits.numerics] preset = 'static-int8' for MLA/MoE")
    return None


def rotation_problem(model, *, wide: bool) -> str | None:
    """Why the residual rotation does not fit a model's blocks (a ``ModelConfig``), or
    None. A LayerNorm centres its input: under a Sylvester Hadamard (hidden size a power
    of two) that is zeroing one channel, which LAYERNORM_WIDE's rotated mode does, and
    nothing else (the int8 scheme's LAYERNORM, other orders) keeps it; a post-norm sits
    between a projection and the stream, so its gain cannot be folded."""
    h = model.hidden_size
    if model.norm_kind == "layer" and not (wide and h & (h - 1) == 0):
        return ("a LayerNorm (Cohere) centres its input, which the rotation keeps only for "
                f"the wide pipeline and a hidden size that is a power of two (here {h})")
    if model.norm_position != "pre":
        return ("a post-norm (EXAONE-4.0, Gemma) normalises a projection's output before the "
                "residual add, so its gain cannot be folded into a projection")
    return None
