"""Bit configurations: weight bits per projection, and the KV-cache format names.

:class:`WeightBits` is shaped like the vendor compiler's
``BitConfig.Transformer.Weight(query, key, value, output, ffn, head)`` in its newer form,
where ``ffn`` is split into ``up``, ``gate`` and ``down`` (FACTS.md, qb SDK). ``ffn=`` is
still accepted as a shorthand that sets all three. Published LLM builds are **W8** (all
8-bit) and **W4V8** (all 4-bit except the V projection at 8-bit; kvsim keeps the head at
8), available by name through :func:`weight_bits_preset`.

:class:`BitConfig` adds the KV-cache format names. It only stores names (``"int8"`` by
default): the formats themselves, their byte layouts and their validation belong to
``isa/kvformats.py``.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, ValidationError, field_validator, model_validator

from kvsim.errors import ConfigError

from .config import ModelConfig, TensorRole
from .schema import Frozen as _Frozen
from .schema import validation_message

WeightBitWidth = Literal[4, 8]

#: Bits of the MoE router (expert-score) matrix whatever the preset: routing decisions
#: flip on small score changes and the router is tiny (DeepSeek-V2-Lite: 64x2048 per
#: layer, 0.01 % of the weights), so kvsim keeps it at 8 bits. An assumption of kvsim's.
ROUTER_BITS = 8

_KV_FORMAT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class WeightBits(_Frozen):
    """Weight bits (4 or 8) per projection kind."""

    query: WeightBitWidth = 8
    key: WeightBitWidth = 8
    value: WeightBitWidth = 8
    output: WeightBitWidth = 8
    up: WeightBitWidth = 8
    gate: WeightBitWidth = 8
    down: WeightBitWidth = 8
    head: WeightBitWidth = 8

    @model_validator(mode="before")
    @classmethod
    def _ffn_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ffn" in data:
            both = [k for k in ("up", "gate", "down") if k in data]
            if both:
                raise ValueError(f"ffn: give either ffn or {', '.join(both)}, not both")
            data = dict(data)
            ffn = data.pop("ffn")
            data.update(up=ffn, gate=ffn, down=ffn)
        return data

    @classmethod
    def uniform(cls, bits: int) -> WeightBits:
        """Every projection at ``bits``."""
        return build_weight_bits({f: bits for f in cls.model_fields})

    def bits_for(self, role: TensorRole) -> int:
        """Bits of a matrix with role ``role`` (see :data:`models.config.TensorRole`).

        MLA's ``kv_latent`` down-projection feeds both keys and values, so it takes the
        wider of ``key`` and ``value``; the MoE router is :data:`ROUTER_BITS`; a tied
        embedding used as LM head is ``head``. Norms, biases and the host-side embedding
        are not quantized: asking for them is a :class:`ConfigError`.
        """
        if role in ("query", "key", "value", "output", "up", "gate", "down", "head"):
            return int(getattr(self, role))
        if role == "kv_latent":
            return max(self.key, self.value)
        if role == "router":
            return ROUTER_BITS
        raise ConfigError(f"tensors of role {role!r} are not quantized")


def build_weight_bits(data: dict[str, Any], *, where: str = "bits.weights") -> WeightBits:
    """Validate a mapping; :class:`ConfigError` naming the field (e.g. ``bits.weights.key``)."""
    try:
        return WeightBits.model_validate(data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, where)) from None


W8 = WeightBits()
W4V8 = WeightBits(query=4, key=4, value=8, output=4, up=4, gate=4, down=4, head=8)

WEIGHT_BITS_PRESETS: dict[str, WeightBits] = {"W8": W8, "W4V8": W4V8}


def weight_bits_preset(name: str, *, where: str = "bits.weights") -> WeightBits:
    """The weight-bit preset ``name`` (case-insensitive); the error lists the valid names."""
    for key, bits in WEIGHT_BITS_PRESETS.items():
        if key.lower() == name.lower():
            return bits
    raise ConfigError(
        f"{where}: unknown weight-bit preset {name!r}; valid: {', '.join(WEIGHT_BITS_PRESETS)}"
    )


def preset_with_overrides(preset: str, overrides: dict[str, Any], *,
                          where: str = "bits") -> WeightBits:
    """The weight-bit preset ``preset`` with per-projection ``overrides`` on top (``ffn``
    overrides ``up``, ``gate`` and ``down`` together)."""
    base = weight_bits_preset(preset, where=f"{where}.preset").model_dump()
    over = dict(overrides)
    if "ffn" in over:
        both = [k for k in ("up", "gate", "down") if k in over]
        if both:
            raise ConfigError(f"{where}.weights.ffn: give either ffn or {', '.join(both)}, "
                              "not both")
        ffn = over.pop("ffn")
        if isinstance(ffn, bool) or ffn not in get_args(WeightBitWidth):
            raise ConfigError(f"{where}.weights.ffn: must be one of "
                              f"{', '.join(map(str, get_args(WeightBitWidth)))}, got {ffn!r}")
        over.update(up=ffn, gate=ffn, down=ffn)
    return build_weight_bits({**base, **over}, where=f"{where}.weights")


ResidualWidth = Literal["int8", "int16", "int16e", "int32"]
ActScale = Literal["static", "token"]
Rotation = Literal["none", "residual", "residual+down"]
WeightGroup = Literal["channel", "g128", "g32"]
KvReadPath = Literal["integer", "dequant"]
WideSchedule = Literal["resident", "lean"]


class NumericsOptions(_Frozen):
    """How the integer pipeline represents activations: each choice is a compile option
    whose cost shows in time and bytes (``[bits.numerics]`` in a run config).

    - ``residual``: the residual stream between blocks: ``int8`` (one static scale per
      tensor; collapses on real LLMs, whose massive activations set the scale), ``int16`` /
      ``int32`` (static scale, wider DRAM rows), ``int16e`` (int16 with a per-token
      power-of-two exponent).
    - ``act_scale``: the GEMM inputs (norm outputs, attention output, SwiGLU output, gate/up
      outputs): ``static`` per-tensor scales or ``token`` (a dynamic per-token int8 scale
      computed on the vector unit).
    - ``qkv_scale``: q/k/v and the KV cache: ``static`` (the native int8 cache) or ``token``.
    - ``rotation``: ``none``, ``residual`` (an offline Hadamard rotation of the residual
      stream, norm gains folded into the next projections) or ``residual+down`` (plus an
      online Hadamard of down_proj's input on the vector unit).
    - ``weight_group``: how 4-bit weights are scaled: ``channel`` (one scale per output
      row), ``g128`` / ``g32`` (group-wise asymmetric, integer two-level scales).
    - ``calibration``: the tokens the static scales are measured on: ``text`` (the
      project's English calibration passage) or ``random`` ids.
    - ``schedule``: how the wide pipeline's stages use a core's SRAM (the same integer
      results either way). ``resident``: the norms' int32 rows, the gate/up/SwiGLU int32
      rows and the down projection's whole int32 input are held in SRAM, so a prefill
      token tile holds few tokens and the weights are streamed once per tile, many times.
      ``lean``: the norm and its per-token quantization fused (``RMSNORM_QUANT``), gate/up
      in column chunks with SwiGLU in place, the SwiGLU rows quantized per token by the
      cores that computed them after exchanging their row maxima through DRAM
      (``ROW_AMAX`` / ``QUANT_ROW_AMAX``), so the down projection reads int8 rows, and its
      epilogue in column chunks with the residual add in place. Costs: a barrier and a
      few bytes per token for the exchange, more (smaller) instructions.

    The defaults are the scheme kvsim had before these options (one static int8 scale per
    tensor); the presets in :data:`NUMERICS_PRESETS` name the recipes. The compiler builds
    the int8 scheme and the wide pipeline (``int16``/``int32`` with ``act_scale = token``,
    ``qkv_scale = static``), each with ``rotation`` ``none`` or ``residual``, and refuses
    the rest by name (``models.compiler.numerics.numerics_problem``).
    """

    residual: ResidualWidth = "int8"
    act_scale: ActScale = "static"
    qkv_scale: ActScale = "static"
    rotation: Rotation = "none"
    weight_group: WeightGroup = "channel"
    calibration: Literal["text", "random"] = "random"
    schedule: WideSchedule = "lean"


#: Named numerics recipes (``[bits.numerics] preset = ...``).
#: ``w8`` and ``w4g32`` are the minimal recipes that keep SmolLM2-135M within its quality
#: targets (W8 + INT8 KV; W4V8 with 4-bit g32 weights). ``w4g32`` keeps the residual
#: unrotated (a rotated matrix leaves the checkpoint's Q4_1 grid and re-quantizes worse, the
#: numerics study's section 4) and q/k/v static: measured top-1 0.871, KL 0.076 over 257
#: tokens (``tests/sim/test_numerics_w4.py``); the study's int16e residual with per-token
#: q/k/v (0.891 / 0.034 in its emulator) is not built yet.
NUMERICS_PRESETS: dict[str, NumericsOptions] = {
    "static-int8": NumericsOptions(),
    "w8": NumericsOptions(residual="int16", act_scale="token", qkv_scale="static",
                          rotation="residual", weight_group="channel", calibration="text"),
    "w4g32": NumericsOptions(residual="int16", act_scale="token", qkv_scale="static",
                             rotation="none", weight_group="g32", calibration="text"),
}


def default_numerics(real_weights: bool) -> NumericsOptions:
    """The numerics a model gets when none are named: ``w8`` for a real checkpoint (its
    massive activations collapse one static int8 scale per tensor: every logit rounds to
    zero on SmolLM2-135M), ``static-int8`` for synthetic weights (which have none; the
    timing presets' scheme). A published W8 build runs real weights, so
    ``configs/validate-llama-3.2-1b.toml`` names ``w8`` explicitly."""
    return NUMERICS_PRESETS["w8" if real_weights else "static-int8"]


def build_numerics(data: dict[str, Any], *, where: str = "bits.numerics") -> NumericsOptions:
    """A preset (``preset`` key, optional) with field overrides; errors name the field."""
    data = dict(data)
    preset = data.pop("preset", None)
    base: dict[str, Any] = {}
    if preset is not None:
        matches = [k for k in NUMERICS_PRESETS if k.lower() == str(preset).lower()]
        if not matches:
            raise ConfigError(f"{where}.preset: unknown numerics preset {preset!r}; valid: "
                              f"{', '.join(NUMERICS_PRESETS)}")
        base = NUMERICS_PRESETS[matches[0]].model_dump()
    try:
        return NumericsOptions.model_validate({**base, **data})
    except ValidationError as err:
        raise ConfigError(validation_message(err, where)) from None


_PROJECTIONS = ("query", "key", "value", "output", "up", "gate", "down", "head")


class BitConfig(_Frozen):
    """Weight bits plus the names of the KV-cache formats.

    GQA models use ``kv_key_format`` and ``kv_value_format``; MLA models use
    ``kv_content_format`` (the compressed latent) and ``kv_rope_format`` (the decoupled
    RoPE key). ``weights`` may be given as a preset name (``"W4V8"``).
    """

    weights: WeightBits = W8
    kv_key_format: str = Field(default="int8", pattern=_KV_FORMAT_PATTERN)
    kv_value_format: str = Field(default="int8", pattern=_KV_FORMAT_PATTERN)
    kv_content_format: str = Field(default="int8", pattern=_KV_FORMAT_PATTERN)
    kv_rope_format: str = Field(default="int8", pattern=_KV_FORMAT_PATTERN)
    numerics: NumericsOptions = NumericsOptions()
    #: How attention consumes the cache: ``integer`` (the codes as integers, what ARIES
    #: has) or ``dequant`` (dequantized to fp16 on a vector unit, fp16 attention).
    kv_read: KvReadPath = "integer"

    @model_validator(mode="after")
    def _group_needs_4bit_weights(self) -> BitConfig:
        # group-wise scales are a 4-bit weight scheme; 8-bit matrices of a mixed config stay
        # per channel, but a config without a 4-bit matrix cannot mean it
        group = self.numerics.weight_group
        if group != "channel" and all(self.weights.bits_for(r) == 8 for r in _PROJECTIONS):
            raise ValueError(f"numerics.weight_group {group!r} scales 4-bit weights in groups, "
                             "but every projection of weights is 8-bit: set weight_group = "
                             "'channel' or use 4-bit weights (e.g. weights = 'W4V8')")
        return self

    @field_validator("weights", mode="before")
    @classmethod
    def _preset_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            matches = [k for k in WEIGHT_BITS_PRESETS if k.lower() == value.lower()]
            if not matches:
                raise ValueError(
                    f"unknown weight-bit preset {value!r}; valid: {', '.join(WEIGHT_BITS_PRESETS)}"
                )
            return WEIGHT_BITS_PRESETS[matches[0]]
        return value

    def kv_formats(self, model: ModelConfig) -> dict[str, str]:
        """Format name per cache component of ``model`` (keys of
        :meth:`ModelConfig.kv_components`: ``key``/``value`` or ``content``/``rope``)."""
        if model.is_mla:
            return {"content": self.kv_content_format, "rope": self.kv_rope_format}
        return {"key": self.kv_key_format, "value": self.kv_value_format}


def build_bit_config(data: dict[str, Any], *, where: str = "bits") -> BitConfig:
    """Validate a mapping; :class:`ConfigError` naming the field path."""
    try:
        return BitConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, where)) from None
