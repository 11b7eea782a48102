"""Import of Hugging Face ``config.json`` files into :class:`~models.config.ModelConfig`.

Supported model types (``model_type``, or the first of ``architectures``): ``llama``,
``qwen2``, ``mistral``, ``deepseek_v2``, ``cohere2`` (Command-R7B), ``exaone4``
(EXAONE-4.0), ``qwen2_moe`` (Qwen1.5-MoE, Qwen2-MoE), ``mixtral`` and ``gemma3_text``
(Gemma 3, :mod:`models.hf_gemma`); Cohere2, EXAONE-4.0 and Gemma 3 bring per-layer features
(:mod:`models.layer_features`), Qwen2-MoE and Mixtral a mixture-of-experts MLP beside
grouped-query attention. Keys
that the HF configuration classes give a default (``num_key_value_heads``, ``rope_theta``,
...) take that default when absent, as ``transformers`` does; keys without a safe default
are required, and a file that lacks some gets one :class:`~kvsim.errors.ConfigError` listing
all of them. Features kvsim does not model (another activation, MLP biases, Qwen2/Mistral
sliding windows, other RoPE scalings, other MoE scoring) are rejected by name rather than
silently ignored.

Sources for the defaults: ``LlamaConfig``, ``Qwen2Config``, ``MistralConfig`` in
``transformers``, ``DeepseekV2Config`` in DeepSeek-V2's ``configuration_deepseek.py``,
``Cohere2Config``, ``Exaone4Config``, ``Qwen2MoeConfig`` and ``MixtralConfig`` in
``transformers`` 4.57.

Cohere's ``position_embedding_type = "rope_gptj"`` rotates interleaved pairs of a head's
dimensions; kvsim rotates the two halves (as Llama). The two agree once each q and k head's
rows are permuted (even dimensions, then odd ones), which leaves every attention score
unchanged; synthetic weights need no permutation, a loader of real Cohere weights would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError

from .config import ModelConfig, build_model
from .hf_family import FamilyMapping
from .hf_gemma import GEMMA3
from .layer_features import LAYER_TYPES, pattern_layer_types

#: The families whose mapping is a module of its own (``models/hf_<family>.py``), by model
#: type: a new one is its module and one entry here.
MAPPINGS: dict[str, FamilyMapping] = {m.model_type: m for m in (GEMMA3,)}
#: ``architectures`` entries and the model type each one means.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "Cohere2ForCausalLM": "cohere2",
    "Exaone4ForCausalLM": "exaone4",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    **{m.architecture: m.model_type for m in MAPPINGS.values()},
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted((
    "cohere2", "deepseek_v2", "exaone4", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe",
    *MAPPINGS)))

#: Keys every supported file must have (no safe default exists for them).
REQUIRED_KEYS: tuple[str, ...] = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
#: Extra keys for DeepSeek-V2 (MLA). ``q_lora_rank`` must be present but may be null: the
#: HF class defaults it to 1536, so an absent key would not mean "no query compression".
MLA_REQUIRED_KEYS: tuple[str, ...] = (
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
)
#: Extra keys for DeepSeek-V2 files whose ``n_routed_experts`` is set (MoE).
MOE_REQUIRED_KEYS: tuple[str, ...] = ("num_experts_per_tok", "moe_intermediate_size")

#: ``max_position_embeddings`` default of each HF configuration class.
_MAX_POSITIONS_DEFAULT = {"llama": 2048, "qwen2": 32768, "mistral": 4096 * 32, "deepseek_v2": 2048,
                          "cohere2": 8192, "exaone4": 2048, "qwen2_moe": 32768,
                          "mixtral": 4096 * 32}
_ROPE_THETA_DEFAULT = 10000.0  # all classes but MixtralConfig
_RMS_NORM_EPS_DEFAULT = 1e-6  # LlamaConfig, Qwen2Config, MistralConfig, DeepseekV2Config,
# Qwen2MoeConfig
#: MixtralConfig defaults (transformers 4.57) that differ from the ones above.
_MIXTRAL_DEFAULTS = {"rope_theta": 1e6, "rms_norm_eps": 1e-5, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2}
#: Qwen2MoeConfig defaults (transformers 4.57) of its MoE keys (Qwen1.5-MoE-A2.7B's sizes).
_QWEN2_MOE_DEFAULTS = {"num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
                       "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                       "decoder_sparse_step": 1, "norm_topk_prob": False}
#: Cohere2Config / Exaone4Config defaults (transformers 4.57).
_COHERE2_DEFAULTS = {"layer_norm_eps": 1e-5, "logit_scale": 0.0625, "sliding_window": 4096,
                     "sliding_window_pattern": 4, "tie_word_embeddings": True}
_EXAONE4_DEFAULTS = {"rms_norm_eps": 1e-5, "sliding_window": 4096,
                     "sliding_window_pattern": 4, "tie_word_embeddings": False}
_SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3", "yarn")


def _model_type(data: dict[str, Any], where: str) -> str:
    mtype = data.get("model_type")
    if mtype is None:
        archs = data.get("architectures") or []
        known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
        if known:
            return known[0]
        if not archs:
            raise ConfigError(
                f"{where}: lacks required keys: model_type (or architectures); supported model "
                f"types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        raise ConfigError(
            f"{where}: unsupported architectures {archs}; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}"
        )
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{where}: unsupported model_type {mtype!r}; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return str(mtype)


def _rope_scaling(raw: Any, where: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: rope_scaling must be an object or null, got {raw!r}")
    kind = raw.get("rope_type", raw.get("type"))
    if kind == "default":
        return None
    if kind not in _SUPPORTED_ROPE_SCALING:
        raise ConfigError(
            f"{where}: rope_scaling type {kind!r} is not supported; supported: "
            f"{', '.join(_SUPPORTED_ROPE_SCALING)}"
        )
    keys = {
        "linear": ("factor",),
        "llama3": (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ),
        "yarn": (
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
        ),
    }[kind]
    out: dict[str, Any] = {"type": kind}
    out.update({k: raw[k] for k in keys if raw.get(k) is not None})
    if kind == "yarn":
        out.setdefault("original_max_position_embeddings", 4096)  # DeepseekV2 default
    return out


def _unsupported(data: dict[str, Any], mtype: str) -> list[str]:
    """Features present in the file that kvsim's models do not implement."""
    if mtype in MAPPINGS:
        return MAPPINGS[mtype].unsupported(data)
    problems = []
    act = data.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act {act!r} (only 'silu', i.e. SwiGLU)")
    if data.get("mlp_bias"):
        problems.append("mlp_bias true")
    if mtype in ("qwen2", "qwen2_moe") and data.get("use_sliding_window"):
        problems.append("use_sliding_window true")
    if mtype == "qwen2_moe" and data.get("qkv_bias") is False:
        problems.append("qkv_bias false (Qwen2MoeAttention has q/k/v biases)")
    if mtype in ("mistral", "mixtral"):
        window = data.get("sliding_window")
        max_pos = data.get("max_position_embeddings", _MAX_POSITIONS_DEFAULT[mtype])
        if window is not None and window < max_pos:
            problems.append(f"sliding_window {window} (< max_position_embeddings {max_pos})")
    if mtype in ("cohere2", "exaone4"):
        if data.get("attention_bias"):
            problems.append("attention_bias true")
        if data.get("use_qk_norm"):
            problems.append("use_qk_norm true (Cohere's per-head LayerNorm)")
    if mtype == "cohere2":
        if data.get("use_parallel_block", True) is not True:
            problems.append("use_parallel_block false (Cohere2 blocks are parallel)")
        if data.get("rotary_pct", 1.0) != 1.0:
            problems.append(f"rotary_pct {data['rotary_pct']} (only 1.0)")
        pe = data.get("position_embedding_type", "rope_gptj")
        if pe != "rope_gptj":
            problems.append(f"position_embedding_type {pe!r} (only 'rope_gptj')")
        order = data.get("order_of_interleaved_layers", "local_attn_first")
        if order != "local_attn_first":
            problems.append(f"order_of_interleaved_layers {order!r} (only 'local_attn_first')")
        if data.get("use_gated_activation", True) is not True:
            problems.append("use_gated_activation false (only SwiGLU)")
    if mtype == "deepseek_v2":
        if data.get("attention_bias"):
            problems.append("attention_bias true")
        if data.get("scoring_func", "softmax") != "softmax":
            problems.append(f"scoring_func {data['scoring_func']!r} (only 'softmax')")
        if data.get("moe_layer_freq", 1) != 1:
            problems.append(f"moe_layer_freq {data['moe_layer_freq']} (only 1)")
        method = data.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            problems.append(f"topk_method {method!r} (only 'greedy', 'group_limited_greedy')")
    return problems


def _layer_types(data: dict[str, Any], mtype: str, layers: int,
                 where: str) -> tuple[list[str], int | None]:
    """The layer types and sliding window of a Cohere2 / EXAONE-4.0 file: ``layer_types``
    if given, else from ``sliding_window_pattern`` (an int: every n-th layer full; EXAONE's
    string form, e.g. ``"LLLG"``: ``L`` sliding, ``G`` full, repeated); no window: all full."""
    defaults = _COHERE2_DEFAULTS if mtype == "cohere2" else _EXAONE4_DEFAULTS
    window = data.get("sliding_window", defaults["sliding_window"])
    types = data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or any(t not in LAYER_TYPES for t in types):
            raise ConfigError(f"{where}: layer_types must be a list of "
                              f"{' / '.join(LAYER_TYPES)}, got {types!r}")
        if len(types) != layers:
            raise ConfigError(f"{where}: layer_types has {len(types)} entries for "
                              f"num_hidden_layers {layers}")
    elif window is None:
        types = ["full_attention"] * layers
    else:
        pattern = data.get("sliding_window_pattern", defaults["sliding_window_pattern"])
        if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
            types = ["sliding_attention" if pattern[i % len(pattern)] == "L"
                     else "full_attention" for i in range(layers)]
        elif type(pattern) is int and pattern >= 1:
            types = list(pattern_layer_types(layers, pattern))
        else:
            raise ConfigError(f"{where}: sliding_window_pattern must be a positive integer "
                              f"or a string of L and G, got {pattern!r}")
    if "sliding_attention" not in types:
        window = None  # a window no layer uses
    elif type(window) is not int or window < 1:
        raise ConfigError(f"{where}: sliding_window must be a positive integer, got "
                          f"{window!r}")
    return types, window


def _family_features(data: dict[str, Any], mtype: str, layers: int,
                     where: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a Cohere2 or EXAONE-4.0 file's layer features."""
    types, window = _layer_types(data, mtype, layers, where)
    sliding = "sliding_attention" in types
    out: dict[str, Any] = {"layer_types": tuple(types), "sliding_window": window}
    if mtype == "cohere2":
        # Cohere2Attention rotates only in sliding layers; CohereLayerNorm; parallel block
        d = _COHERE2_DEFAULTS
        out.update(rope_layers="sliding" if sliding else "all", norm_kind="layer",
                   parallel_block=True,
                   rms_norm_eps=data.get("layer_norm_eps", d["layer_norm_eps"]),
                   logit_scale=data.get("logit_scale", d["logit_scale"]),
                   tie_word_embeddings=bool(data.get("tie_word_embeddings",
                                                     d["tie_word_embeddings"])))
    else:
        # Exaone4Attention: RoPE in every layer without sliding layers, else in the sliding
        # ones only; q_norm/k_norm; post_attention_layernorm / post_feedforward_layernorm
        d = _EXAONE4_DEFAULTS
        out.update(rope_layers="sliding" if sliding else "all", norm_position="post",
                   qk_norm=True, rms_norm_eps=data.get("rms_norm_eps", d["rms_norm_eps"]),
                   tie_word_embeddings=bool(data.get("tie_word_embeddings",
                                                     d["tie_word_embeddings"])))
    return out


def _gqa_moe_fields(data: dict[str, Any], mtype: str) -> dict[str, Any]:
    """The MoE fields of a Qwen2-MoE or Mixtral file (empty: a Qwen2-MoE file with
    ``num_experts`` 0, dense in every layer).

    Routing as the HF modeling files do it (``modeling_qwen2_moe.py``,
    ``modeling_mixtral.py``, transformers 4.57): softmax over all experts' router logits,
    the top ``num_experts_per_tok``; Qwen2-MoE renormalises them only with
    ``norm_topk_prob``, Mixtral always (its softmax over the top-k logits is the same
    thing), neither scales them. Qwen2-MoE adds one shared expert of width
    ``shared_expert_intermediate_size`` scaled by ``sigmoid(shared_expert_gate(x))``; its
    layer ``i`` is sparse iff ``i`` is not in ``mlp_only_layers`` and
    ``(i + 1) % decoder_sparse_step == 0``. Mixtral has no shared expert."""
    if mtype == "mixtral":
        d = _MIXTRAL_DEFAULTS
        return {"n_routed_experts": data.get("num_local_experts", d["num_local_experts"]),
                "num_experts_per_tok": data.get("num_experts_per_tok",
                                                d["num_experts_per_tok"]),
                "moe_intermediate_size": data["intermediate_size"],
                "n_shared_experts": 0, "norm_topk_prob": True}
    d = _QWEN2_MOE_DEFAULTS
    experts = data.get("num_experts", d["num_experts"])
    if experts == 0:
        return {}
    shared = data.get("shared_expert_intermediate_size", d["shared_expert_intermediate_size"])
    out: dict[str, Any] = {
        "n_routed_experts": experts,
        "num_experts_per_tok": data.get("num_experts_per_tok", d["num_experts_per_tok"]),
        "moe_intermediate_size": data.get("moe_intermediate_size", d["moe_intermediate_size"]),
        "norm_topk_prob": bool(data.get("norm_topk_prob", d["norm_topk_prob"])),
        "decoder_sparse_step": data.get("decoder_sparse_step", d["decoder_sparse_step"]),
        "mlp_only_layers": tuple(data.get("mlp_only_layers") or ()),
        "n_shared_experts": 0,
    }
    if shared:  # a shared expert and its sigmoid gate
        out.update(n_shared_experts=1, shared_expert_intermediate_size=shared,
                   shared_expert_gate=True)
    return out


def hf_config_to_model(
    data: dict[str, Any], *, name: str = "", where: str = "config.json"
) -> ModelConfig:
    """Translate a parsed HF ``config.json`` mapping; ``where`` prefixes every error."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: top level must be a JSON object")
    mtype = _model_type(data, where)
    required = list(REQUIRED_KEYS)
    if mtype == "deepseek_v2":
        required += MLA_REQUIRED_KEYS
        if data.get("n_routed_experts") is not None:
            required += MOE_REQUIRED_KEYS
    missing = [k for k in required if k not in data or (data[k] is None and k != "q_lora_rank")]
    if missing:
        raise ConfigError(
            f"{where}: model_type {mtype!r} lacks required keys: {', '.join(missing)}"
        )
    problems = _unsupported(data, mtype)
    if problems:
        raise ConfigError(f"{where}: unsupported features: {'; '.join(problems)}")

    heads = data["num_attention_heads"]
    hidden = data["hidden_size"]
    kv_default = {"mixtral": _MIXTRAL_DEFAULTS,
                  "qwen2_moe": _QWEN2_MOE_DEFAULTS}.get(mtype, {}).get("num_key_value_heads",
                                                                     heads)
    mixtral = _MIXTRAL_DEFAULTS if mtype == "mixtral" else {}
    out: dict[str, Any] = {
        "name": name,
        "family": mtype,
        "num_layers": data["num_hidden_layers"],
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": (kv_default if data.get("num_key_value_heads") is None
                         else data["num_key_value_heads"]),
        "intermediate_size": data["intermediate_size"],
        "vocab_size": data["vocab_size"],
        "rope_theta": data.get("rope_theta", mixtral.get("rope_theta", _ROPE_THETA_DEFAULT)),
        "rope_scaling": _rope_scaling(data.get("rope_scaling"), where),
        "max_position_embeddings": data.get(
            "max_position_embeddings", _MAX_POSITIONS_DEFAULT.get(mtype)
        ),
        "rms_norm_eps": data.get("rms_norm_eps",
                                 mixtral.get("rms_norm_eps", _RMS_NORM_EPS_DEFAULT)),
        "tie_word_embeddings": bool(data.get("tie_word_embeddings", False)),
    }
    if mtype == "deepseek_v2":
        out.update({k: data[k] for k in MLA_REQUIRED_KEYS})
        out["head_dim"] = data["qk_nope_head_dim"] + data["qk_rope_head_dim"]
        if data.get("n_routed_experts") is not None:
            out.update(
                n_routed_experts=data["n_routed_experts"],
                num_experts_per_tok=data["num_experts_per_tok"],
                moe_intermediate_size=data["moe_intermediate_size"],
                n_shared_experts=data.get("n_shared_experts") or 0,
                first_k_dense_replace=data.get("first_k_dense_replace") or 0,
                norm_topk_prob=bool(data.get("norm_topk_prob", False)),
                routed_scaling_factor=data.get("routed_scaling_factor", 1.0),
                topk_method=data.get("topk_method", "greedy"),
                n_group=data.get("n_group") or 1,
                topk_group=data.get("topk_group") or 1,
            )
    else:
        head_dim = data.get("head_dim", MAPPINGS[mtype].defaults.get("head_dim")
                            if mtype in MAPPINGS else None)
        if head_dim is None:
            if type(heads) is not int or heads < 1:
                raise ConfigError(f"{where}: num_attention_heads must be a positive integer, "
                                  f"got {heads!r}")
            if type(hidden) is not int or hidden < 1:
                raise ConfigError(f"{where}: hidden_size must be a positive integer, got "
                                  f"{hidden!r}")
            if hidden % heads:
                raise ConfigError(
                    f"{where}: no head_dim and hidden_size {hidden!r} is not a multiple of "
                    f"num_attention_heads {heads!r}"
                )
            head_dim = hidden // heads
        out["head_dim"] = head_dim
        if mtype in ("cohere2", "exaone4"):
            out.update(_family_features(data, mtype, data["num_hidden_layers"], where))
        elif mtype in ("qwen2", "qwen2_moe"):
            out["qkv_bias"] = True  # Qwen2(Moe)Attention: q/k/v Linear(bias=True), o no bias
        elif data.get("attention_bias"):
            # LlamaAttention: attention_bias applies to q, k, v and o (MistralAttention has
            # no such key; its projections never have a bias).
            out["qkv_bias"] = out["o_bias"] = mtype == "llama"
        if mtype in ("qwen2_moe", "mixtral"):
            out.update(_gqa_moe_fields(data, mtype))
        if mtype in MAPPINGS:
            out.update(MAPPINGS[mtype].fields(data, where))
    return build_model(out, where=f"{where}: model")


def parse_hf_json(text: str, *, source: str) -> dict[str, Any]:
    """``json.loads`` with a :class:`ConfigError` naming ``source`` on bad JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a JSON object")
    return data


def load_hf_config(path: str | Path, *, name: str | None = None) -> ModelConfig:
    """Read a HF ``config.json`` (or a directory holding one) into a :class:`ModelConfig`.

    ``name`` defaults to the file's directory name for ``config.json``, else the file stem.
    Errors (missing file, bad JSON, missing keys, unsupported types) are
    :class:`ConfigError` naming the path.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"{p}: cannot read model config: {err.strerror or err}") from None
    if name is None:
        name = p.parent.name if p.name == "config.json" else p.stem
    return hf_config_to_model(parse_hf_json(text, source=str(p)), name=name, where=str(p))
