"""Gemma 3's ``config.json`` (``model_type = "gemma3_text"``, ``Gemma3ForCausalLM``) to the
fields of :class:`~models.config.ModelConfig`.

Source: ``Gemma3TextConfig`` and ``modeling_gemma3.py`` in ``transformers`` 4.57. A layer is
``x_m = x + post_attention_layernorm(attn(input_layernorm(x)))`` and ``x_next = x_m +
post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x_m)))`` (``norm_position =
"sandwich"``); the MLP is GeGLU ``down(gelu_tanh(gate(x)) * up(x))``; q and k are
RMS-normalised per head before RoPE (``qk_norm``); every RMSNorm scales by ``1 + w``
(``Gemma3RMSNorm``: ``norm_unit_offset``, folded when the weights are read); the token
embeddings are multiplied by ``sqrt(hidden_size)`` (``Gemma3TextScaledWordEmbedding``:
``embed_scale``, on the host); the attention scale is ``query_pre_attn_scalar ** -0.5``.
Layer ``i`` is a sliding-window layer unless ``(i + 1) % sliding_window_pattern == 0``
(default 6), as Cohere2's are. Sliding layers rotate with ``rope_local_base_freq`` and
without ``rope_scaling``; when that differs from the full layers' RoPE the model gets
``rope_local_theta`` (timing only: kvsim builds one RoPE table per model).

Rejected by name: logit soft-capping (``attn_logit_softcapping``,
``final_logit_softcapping``: Gemma 2's, not modelled), bidirectional attention, attention
biases, another activation than ``gelu_pytorch_tanh``.
"""

from __future__ import annotations

import math
from typing import Any

from kvsim.errors import ConfigError

from .hf_family import FamilyMapping
from .layer_features import LAYER_TYPES, pattern_layer_types

MODEL_TYPE = "gemma3_text"
FAMILY = "gemma3"
ARCHITECTURE = "Gemma3ForCausalLM"
#: ``Gemma3TextConfig`` defaults (transformers 4.57) of the keys this module reads.
DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "sliding_window_pattern": 6, "rope_local_base_freq": 10_000.0,
}
#: The one activation: HF's ``gelu_pytorch_tanh`` (GELU's tanh approximation).
ACTIVATION = "gelu_pytorch_tanh"


def unsupported(data: dict[str, Any]) -> list[str]:
    """What a Gemma 3 file has that kvsim does not model."""
    problems = []
    act = data.get("hidden_activation", data.get("hidden_act", ACTIVATION))
    if act != ACTIVATION:
        problems.append(f"hidden_activation {act!r} (only {ACTIVATION!r})")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if data.get(key) is not None:
            problems.append(f"{key} {data[key]} (logit soft-capping is not modelled)")
    if data.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention true")
    if data.get("attention_bias"):
        problems.append("attention_bias true")
    return problems


def _layer_types(data: dict[str, Any], layers: int, where: str) -> tuple[tuple[str, ...], Any]:
    window = data.get("sliding_window", DEFAULTS["sliding_window"])
    types = data.get("layer_types")
    if types is None:
        pattern = data.get("sliding_window_pattern", DEFAULTS["sliding_window_pattern"])
        if type(pattern) is not int or pattern < 1:
            raise ConfigError(f"{where}: sliding_window_pattern must be a positive integer, "
                              f"got {pattern!r}")
        types = pattern_layer_types(layers, pattern)
    elif (not isinstance(types, list) or len(types) != layers
          or any(t not in LAYER_TYPES for t in types)):
        raise ConfigError(f"{where}: layer_types must be a list of {layers} entries of "
                          f"{' / '.join(LAYER_TYPES)}, got {types!r}")
    if "sliding_attention" not in types or window is None:
        return tuple("full_attention" for _ in range(layers)), None
    if type(window) is not int or window < 1:
        raise ConfigError(f"{where}: sliding_window must be a positive integer, got "
                          f"{window!r}")
    return tuple(types), window


def model_fields(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The :class:`~models.config.ModelConfig` fields a Gemma 3 file gives beyond the
    common ones (``models.hf.hf_config_to_model`` reads those, ``head_dim`` with the
    default of :data:`DEFAULTS`)."""
    layers = data["num_hidden_layers"]
    types, window = _layer_types(data, layers, where)
    theta = data.get("rope_theta", DEFAULTS["rope_theta"])
    local = data.get("rope_local_base_freq", DEFAULTS["rope_local_base_freq"])
    sliding = window is not None
    own_rope = sliding and (local != theta or data.get("rope_scaling") is not None)
    return {
        "family": FAMILY,
        "num_kv_heads": data.get("num_key_value_heads") or DEFAULTS["num_key_value_heads"],
        "rope_theta": theta,
        "max_position_embeddings": data.get("max_position_embeddings",
                                            DEFAULTS["max_position_embeddings"]),
        "rms_norm_eps": data.get("rms_norm_eps", DEFAULTS["rms_norm_eps"]),
        "tie_word_embeddings": bool(data.get("tie_word_embeddings",
                                             DEFAULTS["tie_word_embeddings"])),
        "layer_types": types if sliding else None,
        "sliding_window": window,
        "norm_position": "sandwich",
        "qk_norm": True,
        "hidden_act": "gelu_tanh",
        "norm_unit_offset": True,
        "embed_scale": math.sqrt(data["hidden_size"]),
        "query_pre_attn_scalar": float(data.get("query_pre_attn_scalar",
                                                DEFAULTS["query_pre_attn_scalar"])),
        "rope_local_theta": float(local) if own_rope else None,
    }


#: Gemma 3's Hugging Face tensor names of the norms (``Gemma3DecoderLayer``), by kvsim name.
HF_NORMS = {
    "attn_norm": "input_layernorm.weight",
    "post_attn_norm": "post_attention_layernorm.weight",
    "mlp_norm": "pre_feedforward_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
}

GEMMA3 = FamilyMapping(MODEL_TYPE, ARCHITECTURE, unsupported, model_fields, DEFAULTS)
