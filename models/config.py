"""LLM architecture configuration: validated, frozen, and the derived counts kvsim needs.

A :class:`ModelConfig` describes one decoder-only transformer of the families kvsim
supports: Llama, Qwen2, Mistral (grouped-query attention, SwiGLU MLP), DeepSeek-V2
(multi-head latent attention, MLA, and a mixture-of-experts MLP, MoE), Cohere2 (Command-R7B:
sliding-window layers, parallel attention + MLP on one LayerNorm, logit scale) and EXAONE-4.0
(per-layer attention types, QK RMSNorm, post-attention and post-MLP norms); the per-layer
features are described in :mod:`models.layer_features`. Field names follow
the Hugging Face ``config.json`` keys where those are clear, and say what they count where
they are not (``num_layers`` for ``num_hidden_layers``, ``num_heads`` for
``num_attention_heads``).

Presets live in ``models/presets/``: Hugging Face ``config.json`` files (``*.json``, read by
:func:`models.hf.load_hf_config`) and kvsim-schema TOML files (``*.toml``, the fields of
:class:`ModelConfig`) for the small test models. The three ``*.json`` presets are the
published ``config.json`` files of Qwen/Qwen2.5-0.5B-Instruct,
meta-llama/Llama-3.2-1B-Instruct and deepseek-ai/DeepSeek-V2-Lite (copies of
``shared/hf-configs/``).

Tensor names. Every weight tensor has a kvsim name (``embed``, ``final_norm``, ``lm_head``,
``layers.<i>.<tensor>``; see :meth:`ModelConfig.layer_tensors`). Matrices are stored
output-channel-major, shape ``(out, in)`` (``n`` rows of ``k`` values), which is both the
PyTorch ``nn.Linear`` layout and the layout of the ISA's ``Gemm`` ``w`` operand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from kvsim.errors import ConfigError

from .layer_features import LayerType, check_layer_features
from .schema import Frozen as _Frozen
from .schema import validation_message

#: Sanity bounds on a model's layer and routed-expert counts (see ModelConfig.num_layers).
MAX_LAYERS = 1024
MAX_EXPERTS = 4096

Family = Literal["llama", "qwen2", "mistral", "deepseek_v2", "cohere2", "exaone4",
                 "qwen2_moe", "mixtral", "gemma3"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "mistral", "deepseek_v2", "cohere2", "exaone4",
                             "qwen2_moe", "mixtral", "gemma3")
#: Families with a mixture-of-experts MLP: DeepSeek-V2 (MLA attention), Qwen2-MoE and
#: Mixtral (grouped-query attention).
MOE_FAMILIES: tuple[str, ...] = ("deepseek_v2", "qwen2_moe", "mixtral")

#: What a tensor is, independent of the model family. The weight bit config maps a role to
#: a bit width (:meth:`models.bits.WeightBits.bits_for`).
TensorRole = Literal[
    "query",  # q_proj, q_a_proj, q_b_proj
    "key",  # k_proj, k_b_proj (MLA: latent -> per-head key "nope" part)
    "value",  # v_proj, v_b_proj (MLA: latent -> per-head value)
    "kv_latent",  # MLA kv_a_proj: hidden -> compressed latent + shared RoPE key
    "output",  # o_proj
    "gate",
    "up",
    "down",
    "router",  # MoE gate (expert scores)
    "head",  # LM head (the embedding matrix when tied)
    "embedding",  # token embedding (host side)
    "norm",  # RMSNorm / LayerNorm gammas (also the QK norms)
    "bias",
]
TensorKind = Literal["matrix", "vector"]


# --- RoPE scaling -------------------------------------------------------------------------


class Llama3RopeScaling(_Frozen):
    """Llama 3.1+ frequency remap (``rope_type = "llama3"`` in HF ``rope_scaling``).

    Source: ``_compute_llama3_parameters`` in ``transformers.modeling_rope_utils``.
    """

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> Llama3RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                f"({self.low_freq_factor})"
            )
        return self


class YarnRopeScaling(_Frozen):
    """YaRN (``type = "yarn"``), as DeepSeek-V2 applies it.

    Source: ``DeepseekV2YarnRotaryEmbedding`` and ``DeepseekV2Attention`` in DeepSeek-V2's
    ``modeling_deepseek.py`` (softmax scale multiplied by ``mscale(factor, mscale_all_dim)^2``).
    """

    type: Literal["yarn"] = "yarn"
    factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(ge=1)
    beta_fast: float = Field(default=32.0, gt=0)
    beta_slow: float = Field(default=1.0, gt=0)
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


class LinearRopeScaling(_Frozen):
    """Position interpolation: positions divided by ``factor`` (``type = "linear"``)."""

    type: Literal["linear"] = "linear"
    factor: float = Field(gt=0)


RopeScaling = Annotated[
    Llama3RopeScaling | YarnRopeScaling | LinearRopeScaling, Field(discriminator="type")
]


# --- tensors --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One weight tensor: kvsim name, shape (``(out, in)`` for matrices), kind and role."""

    name: str
    shape: tuple[int, ...]
    kind: TensorKind
    role: TensorRole

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def _mat(name: str, out: int, inp: int, role: TensorRole) -> TensorSpec:
    return TensorSpec(name, (out, inp), "matrix", role)


def _vec(name: str, n: int, role: TensorRole) -> TensorSpec:
    return TensorSpec(name, (n,), "vector", role)


# --- the model config -----------------------------------------------------------------------


class ModelConfig(_Frozen):
    """A decoder-only LLM architecture. All sizes are element counts, not bytes.

    GQA families (llama, qwen2, mistral) leave the MLA and MoE fields ``None``. DeepSeek-V2
    sets the MLA fields (``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
    ``v_head_dim``; ``q_lora_rank`` may be ``None``: queries then come from one projection)
    and, for MoE models, the MoE fields. For MLA ``head_dim`` is the query/key head width
    used in attention scores, ``qk_nope_head_dim + qk_rope_head_dim``.
    """

    name: str = ""
    family: Family
    # The upper bounds on layer and expert counts are sanity bounds (assumptions, not
    # hardware facts): published models stay far below them (DeepSeek-V3: 61 layers, 256
    # routed experts), and a corrupt count of 2**40 would otherwise build for hours.
    num_layers: int = Field(ge=1, le=MAX_LAYERS,
                            description="decoder blocks (HF num_hidden_layers)")
    hidden_size: int = Field(ge=1, description="residual-stream width")
    num_heads: int = Field(ge=1, description="query heads (HF num_attention_heads)")
    num_kv_heads: int = Field(ge=1, description="key/value heads (HF num_key_value_heads)")
    head_dim: int = Field(ge=1, description="query/key/value width of one head")
    intermediate_size: int = Field(ge=1, description="dense SwiGLU MLP width")
    vocab_size: int = Field(ge=1)
    rope_theta: float = Field(gt=0, description="RoPE base of the inverse frequencies")
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = Field(ge=1, description="longest context, tokens")
    rms_norm_eps: float = Field(gt=0, description="epsilon of every norm (RMSNorm or "
                                "LayerNorm, see norm_kind)")
    qkv_bias: bool = Field(default=False, description="q/k/v projections have a bias")
    o_bias: bool = Field(default=False, description="o projection has a bias (Llama)")
    tie_word_embeddings: bool = Field(default=False, description="LM head = embedding matrix")

    # MLA (DeepSeek-V2 multi-head latent attention)
    kv_lora_rank: int | None = Field(default=None, ge=1, description="compressed KV latent")
    q_lora_rank: int | None = Field(default=None, ge=1, description="compressed query latent")
    qk_rope_head_dim: int | None = Field(default=None, ge=2, description="decoupled RoPE key")
    qk_nope_head_dim: int | None = Field(default=None, ge=1, description="per-head key, no RoPE")
    v_head_dim: int | None = Field(default=None, ge=1, description="per-head value width")

    # MoE (routed + shared experts: DeepSeek-V2, Qwen2-MoE, Mixtral)
    n_routed_experts: int | None = Field(default=None, ge=1, le=MAX_EXPERTS)
    num_experts_per_tok: int | None = Field(default=None, ge=1, description="top-k routing")
    n_shared_experts: int | None = Field(default=None, ge=0)
    moe_intermediate_size: int | None = Field(default=None, ge=1, description="per expert")
    first_k_dense_replace: int | None = Field(
        default=None, ge=0, description="the first k layers keep a dense MLP"
    )
    norm_topk_prob: bool = Field(default=False, description="renormalise top-k weights to 1")
    routed_scaling_factor: float = Field(default=1.0, gt=0)
    topk_method: Literal["greedy", "group_limited_greedy"] = "greedy"
    n_group: int = Field(default=1, ge=1, description="expert groups (group_limited_greedy)")
    topk_group: int = Field(default=1, ge=1, description="groups kept per token")
    shared_expert_intermediate_size: int | None = Field(
        default=None, ge=1, description="width of the one shared expert (Qwen2-MoE); None: "
        "n_shared_experts * moe_intermediate_size (DeepSeek-V2)")
    shared_expert_gate: bool = Field(
        default=False, description="the shared expert's output is scaled by "
        "sigmoid(shared_gate . x), a per-token scalar (Qwen2-MoE)")
    decoder_sparse_step: int = Field(
        default=1, ge=1, description="layer i is MoE only if (i + 1) % step == 0 (Qwen2-MoE)")
    mlp_only_layers: tuple[int, ...] = Field(
        default=(), description="layers that keep a dense MLP (Qwen2-MoE)")

    # Per-layer attention and block variants (GQA only; see models.layer_features)
    layer_types: tuple[LayerType, ...] | None = Field(
        default=None, description="attention of each layer (None: every layer full)")
    sliding_window: int | None = Field(
        default=None, ge=1, description="tokens a sliding layer's query attends to, itself "
        "included (HF sliding_window)")
    rope_layers: Literal["all", "sliding"] = Field(
        default="all", description="'sliding': full-attention layers have no positional "
        "embedding (Cohere2; EXAONE-4.0 with sliding layers)")
    norm_kind: Literal["rms", "layer"] = Field(
        default="rms", description="'layer': LayerNorm (mean removed, gamma, no bias; Cohere)")
    norm_position: Literal["pre", "post", "sandwich"] = Field(
        default="pre", description="'post': norms after attention and after the MLP, "
        "before each residual add (EXAONE-4.0); 'sandwich': a norm before and one after "
        "each (Gemma 2/3)")
    qk_norm: bool = Field(default=False, description="RMSNorm of each q and k head, "
                          "before RoPE (EXAONE-4.0)")
    parallel_block: bool = Field(default=False, description="attention and MLP read one "
                                 "norm of the layer input, both added to it (Cohere)")
    logit_scale: float = Field(default=1.0, gt=0, description="logits multiplied by it")
    hidden_act: Literal["silu", "gelu_tanh"] = Field(
        default="silu", description="the MLP's gate activation: SwiGLU's silu, or GeGLU's "
        "GELU in its tanh form (Gemma: gelu_pytorch_tanh)")
    embed_scale: float = Field(default=1.0, gt=0, description="the host multiplies the "
                               "token embeddings by it (Gemma: sqrt(hidden_size))")
    norm_unit_offset: bool = Field(
        default=False, description="a checkpoint stores each norm's gain as w and applies "
        "1 + w (Gemma's RMSNorm): loading its safetensors adds the 1, so kvsim's gains are "
        "the applied ones")
    query_pre_attn_scalar: float | None = Field(
        default=None, gt=0, description="attention scores scaled by its -0.5 power instead "
        "of head_dim's (Gemma)")
    rope_local_theta: float | None = Field(
        default=None, gt=0, description="RoPE base of the sliding layers when it is their "
        "own (Gemma 3: rope_local_base_freq; rope_scaling then applies to the full layers "
        "only). kvsim builds one RoPE table, so such a model compiles for timing only")

    @model_validator(mode="after")
    def _layer_features(self) -> ModelConfig:
        check_layer_features(self)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        mla = {
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
        }
        moe = {
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
        }
        if self.family == "deepseek_v2":
            missing = [k for k, v in mla.items() if v is None]
            if missing:
                raise ValueError(f"family 'deepseek_v2' (MLA) needs {', '.join(missing)}")
            assert self.qk_nope_head_dim is not None and self.qk_rope_head_dim is not None
            q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.head_dim != q_head:
                raise ValueError(
                    f"head_dim: {self.head_dim} must equal qk_nope_head_dim + qk_rope_head_dim "
                    f"= {q_head} for MLA"
                )
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim: {self.qk_rope_head_dim} must be even (RoPE)")
            if self.qkv_bias or self.o_bias:
                raise ValueError("qkv_bias/o_bias: MLA projections have no bias in kvsim")
        else:
            given = [k for k, v in {**mla, "q_lora_rank": self.q_lora_rank}.items() if v]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: MLA fields need family 'deepseek_v2', not {self.family!r}"
                )
            if self.head_dim % 2:
                raise ValueError(f"head_dim: {self.head_dim} must be even (RoPE)")
        if self.rope_scaling is not None and self.rope_scaling.type == "yarn":
            if self.family != "deepseek_v2":
                # HF's generic YaRN (Qwen2, Llama) scales cos/sin, not the softmax, and
                # differs in detail; kvsim implements DeepSeek-V2's variant only.
                raise ValueError(
                    f"rope_scaling: 'yarn' is implemented for family 'deepseek_v2' only, "
                    f"not {self.family!r}"
                )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads: {self.num_kv_heads} must divide num_heads {self.num_heads}"
            )
        set_moe = [k for k, v in moe.items() if v is not None]
        if set_moe:
            if self.family not in MOE_FAMILIES:
                raise ValueError(f"{set_moe[0]}: MoE needs a family of "
                                 f"{', '.join(MOE_FAMILIES)}, not {self.family!r}")
            if len(set_moe) != len(moe):
                missing = [k for k in moe if k not in set_moe]
                raise ValueError(f"{', '.join(missing)}: MoE needs all of {', '.join(moe)}")
            assert self.n_routed_experts is not None and self.num_experts_per_tok is not None
            if self.num_experts_per_tok > self.n_routed_experts:
                raise ValueError(
                    f"num_experts_per_tok: {self.num_experts_per_tok} exceeds n_routed_experts "
                    f"{self.n_routed_experts}"
                )
            if self.first_k_dense_replace is not None and (
                self.first_k_dense_replace > self.num_layers
            ):
                raise ValueError(
                    f"first_k_dense_replace: {self.first_k_dense_replace} exceeds num_layers "
                    f"{self.num_layers}"
                )
            if self.n_routed_experts % self.n_group:
                raise ValueError(
                    f"n_group: {self.n_group} must divide n_routed_experts {self.n_routed_experts}"
                )
            if self.topk_group > self.n_group:
                raise ValueError(f"topk_group: {self.topk_group} exceeds n_group {self.n_group}")
            bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(f"mlp_only_layers: layer {bad[0]} out of range "
                                 f"0..{self.num_layers - 1}")
            if self.shared_expert_intermediate_size is not None and self.n_shared_experts != 1:
                raise ValueError("shared_expert_intermediate_size: is the width of one shared "
                                 "expert; set n_shared_experts = 1")
            if self.shared_expert_gate and not self.n_shared_experts:
                raise ValueError("shared_expert_gate: needs a shared expert (n_shared_experts)")
        elif (self.n_shared_experts or self.first_k_dense_replace or self.mlp_only_layers
              or self.shared_expert_intermediate_size or self.shared_expert_gate
              or self.decoder_sparse_step != 1):
            raise ValueError(
                "n_shared_experts/first_k_dense_replace/mlp_only_layers/decoder_sparse_step/"
                "shared_expert_intermediate_size/shared_expert_gate: need n_routed_experts "
                "(MoE) too"
            )
        return self

    # --- kind of model ----------------------------------------------------------------------

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2): the cache holds a latent + a RoPE key."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        """Mixture-of-experts MLP in the layers from ``first_k_dense_replace`` on."""
        return self.n_routed_experts is not None

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ConfigError(f"layer {layer} out of range 0..{self.num_layers - 1}")

    def layer_is_moe(self, layer: int) -> bool:
        """True if layer ``layer`` (0-based) has routed experts instead of a dense MLP: from
        ``first_k_dense_replace`` on (DeepSeek-V2), every ``decoder_sparse_step``-th layer
        not in ``mlp_only_layers`` (Qwen2MoeDecoderLayer's rule)."""
        self._check_layer(layer)
        return (self.is_moe and layer >= (self.first_k_dense_replace or 0)
                and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def shared_expert_width(self) -> int:
        """Intermediate width of the fused shared experts (0: none)."""
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return (self.n_shared_experts or 0) * (self.moe_intermediate_size or 0)

    def layer_type(self, layer: int) -> LayerType:
        """``"full_attention"`` or ``"sliding_attention"`` for layer ``layer``."""
        self._check_layer(layer)
        return "full_attention" if self.layer_types is None else self.layer_types[layer]

    def layer_window(self, layer: int) -> int | None:
        """Tokens layer ``layer``'s queries attend to, each itself included (None: all)."""
        return self.sliding_window if self.layer_type(layer) == "sliding_attention" else None

    def layer_has_rope(self, layer: int) -> bool:
        """Whether layer ``layer`` rotates its queries and keys (RoPE)."""
        return self.rope_layers == "all" or self.layer_type(layer) == "sliding_attention"

    def kv_tokens(self, layer: int, context: int) -> int:
        """Tokens layer ``layer``'s cache holds after ``context`` tokens: a sliding layer
        keeps its last ``sliding_window``, a full layer all of them."""
        window = self.layer_window(layer)
        return context if window is None else min(window, context)

    @property
    def lm_head_tensor(self) -> str:
        """Name of the LM-head matrix: ``embed`` when tied, else ``lm_head``."""
        return "embed" if self.tie_word_embeddings else "lm_head"

    @property
    def q_head_dim(self) -> int:
        """Width of one query/key head in the attention scores (MLA: nope + rope)."""
        return self.head_dim

    @property
    def attn_v_head_dim(self) -> int:
        """Width of one value head (MLA: ``v_head_dim``; GQA: ``head_dim``)."""
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    # --- tensors ----------------------------------------------------------------------------

    def global_tensors(self) -> list[TensorSpec]:
        """Tensors outside the decoder blocks: embedding, final norm, untied LM head."""
        specs = [
            TensorSpec(
                "embed",
                (self.vocab_size, self.hidden_size),
                "matrix",
                "head" if self.tie_word_embeddings else "embedding",
            ),
            _vec("final_norm", self.hidden_size, "norm"),
        ]
        if not self.tie_word_embeddings:
            specs.append(_mat("lm_head", self.vocab_size, self.hidden_size, "head"))
        return specs

    def attention_tensors(self, layer: int) -> list[TensorSpec]:
        """The attention block's tensors of layer ``layer`` (including its input norm)."""
        self._check_layer(layer)
        p = f"layers.{layer}."
        h = self.hidden_size
        specs = [] if self.norm_position == "post" else [_vec(p + "attn_norm", h, "norm")]
        if self.is_mla:
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            assert self.qk_nope_head_dim is not None and self.v_head_dim is not None
            q_out = self.num_heads * self.q_head_dim
            if self.q_lora_rank is None:
                specs.append(_mat(p + "q_proj", q_out, h, "query"))
            else:
                specs += [
                    _mat(p + "q_a_proj", self.q_lora_rank, h, "query"),
                    _vec(p + "q_a_norm", self.q_lora_rank, "norm"),
                    _mat(p + "q_b_proj", q_out, self.q_lora_rank, "query"),
                ]
            specs += [
                _mat(p + "kv_a_proj", self.kv_lora_rank + self.qk_rope_head_dim, h, "kv_latent"),
                _vec(p + "kv_a_norm", self.kv_lora_rank, "norm"),
                _mat(
                    p + "k_b_proj", self.num_heads * self.qk_nope_head_dim, self.kv_lora_rank, "key"
                ),
                _mat(p + "v_b_proj", self.num_heads * self.v_head_dim, self.kv_lora_rank, "value"),
                _mat(p + "o_proj", h, self.num_heads * self.v_head_dim, "output"),
            ]
            return specs
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        specs.append(_mat(p + "q_proj", q_out, h, "query"))
        if self.qkv_bias:
            specs.append(_vec(p + "q_bias", q_out, "bias"))
        specs.append(_mat(p + "k_proj", kv_out, h, "key"))
        if self.qkv_bias:
            specs.append(_vec(p + "k_bias", kv_out, "bias"))
        specs.append(_mat(p + "v_proj", kv_out, h, "value"))
        if self.qkv_bias:
            specs.append(_vec(p + "v_bias", kv_out, "bias"))
        specs.append(_mat(p + "o_proj", h, q_out, "output"))
        if self.o_bias:
            specs.append(_vec(p + "o_bias", h, "bias"))
        if self.qk_norm:  # one gamma per head width, shared by the heads (EXAONE-4.0)
            o = next(i for i, s in enumerate(specs) if s.name == p + "o_proj")
            specs[o:o] = [_vec(p + "q_norm", self.head_dim, "norm"),
                          _vec(p + "k_norm", self.head_dim, "norm")]
        if self.norm_position != "pre":
            specs.append(_vec(p + "post_attn_norm", h, "norm"))
        return specs

    def _swiglu(self, prefix: str, inter: int) -> list[TensorSpec]:
        h = self.hidden_size
        return [
            _mat(prefix + "gate_proj", inter, h, "gate"),
            _mat(prefix + "up_proj", inter, h, "up"),
            _mat(prefix + "down_proj", h, inter, "down"),
        ]

    def mlp_tensors(self, layer: int) -> list[TensorSpec]:
        """The MLP block's tensors of layer ``layer`` (including its input norm).

        Dense: ``gate_proj``, ``up_proj``, ``down_proj``. MoE: ``router`` (expert scores),
        ``experts.<e>.{gate,up,down}_proj`` for each routed expert and, if any shared
        experts, one SwiGLU ``shared.{gate,up,down}_proj`` of width
        :attr:`shared_expert_width` (as DeepSeek-V2 fuses them) and, with
        ``shared_expert_gate``, its gate row ``shared_gate`` (1 x hidden, Qwen2-MoE).
        """
        self._check_layer(layer)
        p = f"layers.{layer}."
        specs = [_vec(p + "mlp_norm", self.hidden_size, "norm")]
        if self.parallel_block:  # the MLP reads the attention's input norm
            specs = []
        elif self.norm_position != "pre":  # after the MLP (and, in a sandwich, before it)
            return (specs if self.norm_position == "sandwich" else []) + self._swiglu(
                p, self.intermediate_size) + [_vec(p + "post_mlp_norm", self.hidden_size,
                                                   "norm")]
        if not self.layer_is_moe(layer):
            return specs + self._swiglu(p, self.intermediate_size)
        assert self.n_routed_experts is not None and self.moe_intermediate_size is not None
        specs.append(_mat(p + "router", self.n_routed_experts, self.hidden_size, "router"))
        for e in range(self.n_routed_experts):
            specs += self._swiglu(f"{p}experts.{e}.", self.moe_intermediate_size)
        if self.n_shared_experts:
            specs += self._swiglu(p + "shared.", self.shared_expert_width)
        if self.shared_expert_gate:
            specs.append(_mat(p + "shared_gate", 1, self.hidden_size, "router"))
        return specs

    def layer_tensors(self, layer: int) -> list[TensorSpec]:
        """All tensors of decoder block ``layer``, attention first, in execution order."""
        return self.attention_tensors(layer) + self.mlp_tensors(layer)

    def tensors(self) -> list[TensorSpec]:
        """Every tensor of the model: globals, then the layers in order."""
        out = self.global_tensors()
        for i in range(self.num_layers):
            out += self.layer_tensors(i)
        return out

    @cached_property
    def _spec_index(self) -> dict[str, TensorSpec]:
        return {s.name: s for s in self.tensors()}

    def tensor_spec(self, name: str) -> TensorSpec:
        """The spec of tensor ``name``; :class:`ConfigError` naming it if the model has none."""
        try:
            return self._spec_index[name]
        except KeyError:
            raise ConfigError(
                f"model {self.name or self.family!r} has no tensor {name!r}"
            ) from None

    # --- counts -----------------------------------------------------------------------------

    def weights_per_layer(self, layer: int) -> int:
        """Projection-matrix elements of block ``layer`` (all experts; no norms, no biases).

        For Qwen2.5-0.5B this is 14,909,440 (FACTS.md).
        """
        return sum(s.size for s in self.layer_tensors(layer) if s.kind == "matrix")

    def active_weights_per_layer(self, layer: int) -> int:
        """Projection-matrix elements one token uses in block ``layer``: as
        :meth:`weights_per_layer`, but only ``num_experts_per_tok`` routed experts."""
        total = self.weights_per_layer(layer)
        if not self.layer_is_moe(layer):
            return total
        assert self.n_routed_experts is not None and self.num_experts_per_tok is not None
        assert self.moe_intermediate_size is not None
        per_expert = 3 * self.hidden_size * self.moe_intermediate_size
        return total - (self.n_routed_experts - self.num_experts_per_tok) * per_expert

    @property
    def lm_head_weights(self) -> int:
        """LM-head matrix elements (``vocab_size * hidden_size``, tied or not)."""
        return self.vocab_size * self.hidden_size

    @property
    def weights_total(self) -> int:
        """Projection-matrix elements the NPU's GEMMs read: every block plus the LM head.

        The token embedding is looked up on the host (FACTS.md, qb SDK) and not counted,
        except as the LM head when tied.
        """
        return sum(self.weights_per_layer(i) for i in range(self.num_layers)) + (
            self.lm_head_weights
        )

    @property
    def active_weights_per_token(self) -> int:
        """Matrix elements one decode token reads: :attr:`weights_total` with only the
        active routed experts of each MoE layer."""
        return sum(self.active_weights_per_layer(i) for i in range(self.num_layers)) + (
            self.lm_head_weights
        )

    def params_per_layer(self, layer: int) -> int:
        """Every parameter of block ``layer``: matrices, biases and norm gammas."""
        return sum(s.size for s in self.layer_tensors(layer))

    @property
    def param_count(self) -> int:
        """All parameters, the tied embedding counted once (Qwen2.5-0.5B: 494,032,768)."""
        return sum(s.size for s in self.global_tensors()) + sum(
            self.params_per_layer(i) for i in range(self.num_layers)
        )

    def kv_components(self) -> dict[str, int]:
        """Cached values per token per layer, per cache component.

        GQA: ``{"key": kv_heads*head_dim, "value": kv_heads*head_dim}`` (keys after RoPE).
        MLA: ``{"content": kv_lora_rank, "rope": qk_rope_head_dim}`` (the normalised
        latent and the decoupled RoPE key, as MLA kernels cache them).
        """
        if self.is_mla:
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return {"content": self.kv_lora_rank, "rope": self.qk_rope_head_dim}
        width = self.num_kv_heads * self.head_dim
        return {"key": width, "value": width}

    @property
    def kv_values_per_token_per_layer(self) -> int:
        """Cached values per token per layer (GQA: 2*kv_heads*head_dim; MLA: latent+rope)."""
        return sum(self.kv_components().values())

    @property
    def kv_values_per_token(self) -> int:
        """Cached values per token over all layers (Qwen2.5-0.5B: 24*2*2*64 = 6144)."""
        return self.num_layers * self.kv_values_per_token_per_layer


# --- building -------------------------------------------------------------------


def build_model(data: dict[str, Any], *, where: str = "model") -> ModelConfig:
    """Validate a kvsim-schema mapping; :class:`ConfigError` naming each bad field."""
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, where)) from None
