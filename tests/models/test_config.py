"""Model configs: presets, derived counts (checked against FACTS.md), validation errors."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from models.config import ModelConfig, TensorSpec
from models.source import load_model, load_preset, preset_names


def test_preset_names_list_all_sixteen() -> None:
    assert preset_names() == [
        "command-r7b",
        "deepseek-v2-lite",
        "exaone-4.0-1.2b",
        "gemma-3-1b",
        "llama-3.2-1b",
        "mixtral-8x7b",
        "qwen1.5-moe-a2.7b",
        "qwen2.5-0.5b",
        "tiny",
        "tiny-cohere2",
        "tiny-exaone4",
        "tiny-gemma3",
        "tiny-mixtral",
        "tiny-mla",
        "tiny-mla-dense",
        "tiny-qwen2-moe",
    ]


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"model\.preset: unknown model preset 'qwen'.*tiny-mla"):
        load_preset("qwen")


def test_qwen_matches_facts() -> None:
    c = load_preset("qwen2.5-0.5b")
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == (
        "qwen2",
        24,
        896,
        14,
        2,
    )
    assert (c.head_dim, c.intermediate_size, c.vocab_size) == (64, 4864, 151936)
    assert c.rope_theta == 1e6 and c.max_position_embeddings == 32768 and c.rms_norm_eps == 1e-6
    assert c.qkv_bias and not c.o_bias and c.tie_word_embeddings
    assert not c.is_mla and not c.is_moe
    # FACTS.md (derived): 14,909,440 weights per layer; KV per token 24x2x2x64 = 6144.
    assert all(c.weights_per_layer(i) == 14_909_440 for i in range(24))
    assert c.kv_values_per_token_per_layer == 2 * 2 * 64
    assert c.kv_values_per_token == 6144
    # Published: 0.49B parameters (494,032,768 with the tied embedding counted once).
    assert c.param_count == 494_032_768
    assert c.weights_total == 24 * 14_909_440 + 151936 * 896


def test_llama_weights_match_facts_traffic() -> None:
    c = load_preset("llama-3.2-1b")
    assert c.param_count == 1_235_814_400  # published 1.24B
    # FACTS.md (derived): ~1.24 GB of INT8 NPU weights per token.
    assert c.weights_total == pytest.approx(1.24e9, rel=0.01)
    assert c.kv_values_per_token == 16 * 2 * 8 * 64
    assert c.rope_scaling is not None and c.rope_scaling.type == "llama3"


def test_deepseek_v2_lite_counts() -> None:
    c = load_preset("deepseek-v2-lite")
    assert c.is_mla and c.is_moe and c.q_lora_rank is None
    assert c.head_dim == 192 and c.attn_v_head_dim == 128
    assert not c.layer_is_moe(0) and all(c.layer_is_moe(i) for i in range(1, 27))
    # FACTS.md: 512 + 64 = 576 cached values per token per layer.
    assert c.kv_components() == {"content": 512, "rope": 64}
    assert c.kv_values_per_token_per_layer == 576
    # Published: 15.7B total, 2.4B activated parameters.
    assert c.param_count == pytest.approx(15.7e9, rel=0.005)
    assert c.active_weights_per_token == pytest.approx(2.4e9, rel=0.03)
    assert c.active_weights_per_layer(0) == c.weights_per_layer(0)
    per_expert = 3 * 2048 * 1408
    assert c.weights_per_layer(1) - c.active_weights_per_layer(1) == (64 - 6) * per_expert


def test_tiny_presets() -> None:
    t = load_preset("tiny")
    assert (t.num_layers, t.hidden_size, t.num_heads, t.num_kv_heads, t.head_dim) == (
        2,
        64,
        4,
        2,
        16,
    )
    assert t.qkv_bias and t.tie_word_embeddings and t.name == "tiny"
    m = load_preset("tiny-mla")
    assert m.is_mla and m.is_moe and [m.layer_is_moe(i) for i in range(2)] == [False, True]
    assert m.kv_values_per_token_per_layer == 32 + 8


def test_tensor_specs_gqa() -> None:
    c = load_preset("tiny")
    names = [s.name for s in c.layer_tensors(1)]
    assert names == [
        "layers.1.attn_norm",
        "layers.1.q_proj",
        "layers.1.q_bias",
        "layers.1.k_proj",
        "layers.1.k_bias",
        "layers.1.v_proj",
        "layers.1.v_bias",
        "layers.1.o_proj",
        "layers.1.mlp_norm",
        "layers.1.gate_proj",
        "layers.1.up_proj",
        "layers.1.down_proj",
    ]
    assert c.tensor_spec("layers.0.k_proj") == TensorSpec(
        "layers.0.k_proj", (32, 64), "matrix", "key"
    )
    assert c.tensor_spec("embed").role == "head"  # tied: the embedding is the LM head
    assert c.lm_head_tensor == "embed"
    with pytest.raises(ConfigError, match="no tensor 'layers.2.q_proj'"):
        c.tensor_spec("layers.2.q_proj")
    with pytest.raises(ConfigError, match="layer 2 out of range 0..1"):
        c.layer_is_moe(2)


def test_tensor_specs_mla_moe() -> None:
    c = load_preset("tiny-mla")
    names = {s.name: s for s in c.layer_tensors(1)}
    assert names["layers.1.kv_a_proj"].shape == (32 + 8, 64)
    assert names["layers.1.k_b_proj"].shape == (4 * 16, 32)
    assert names["layers.1.v_b_proj"].shape == (4 * 16, 32)
    assert names["layers.1.o_proj"].shape == (64, 4 * 16)
    assert names["layers.1.router"].shape == (8, 64)
    assert names["layers.1.experts.7.down_proj"].shape == (64, 32)
    assert names["layers.1.shared.up_proj"].shape == (32, 64)
    assert "layers.0.gate_proj" in {s.name for s in c.layer_tensors(0)}
    q = load_model("tiny-mla", {"q_lora_rank": 16})
    qn = {s.name: s.shape for s in q.attention_tensors(0)}
    assert qn["layers.0.q_a_proj"] == (16, 64) and qn["layers.0.q_b_proj"] == (4 * 24, 16)
    assert c.lm_head_tensor == "lm_head"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_kv_heads": 3}, r"model\.num_kv_heads: 3 must divide num_heads 4"),
        ({"head_dim": 15}, r"model\.head_dim: 15 must be even"),
        ({"hidden_size": 0}, r"model\.hidden_size: Input should be greater than or equal to 1"),
        ({"bogus": 1}, r"model\.bogus: unknown key"),
        ({"family": "gpt2"}, r"model\.family: Input should be"),
        ({"kv_lora_rank": 8}, r"model\.kv_lora_rank: MLA fields need family 'deepseek_v2'"),
        ({"n_routed_experts": 4},
         r"n_routed_experts: MoE needs a family of deepseek_v2, qwen2_moe, mixtral, not 'qwen2'"),
        (
            {"rope_scaling": {"type": "yarn", "factor": 2, "original_max_position_embeddings": 8}},
            r"model\.rope_scaling: 'yarn' is implemented for family 'deepseek_v2' only",
        ),
        ({"rope_scaling": {"type": "ntk", "factor": 2.0}}, r"model\.rope_scaling: Input tag 'ntk'"),
    ],
)
def test_validation_errors_name_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_model("tiny", overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"head_dim": 16},
            r"model\.head_dim: 16 must equal qk_nope_head_dim \+ qk_rope_head_dim = 24",
        ),
        ({"num_experts_per_tok": 9}, r"model\.num_experts_per_tok: 9 exceeds n_routed_experts 8"),
        ({"moe_intermediate_size": None}, r"model\.moe_intermediate_size: MoE needs all of"),
        ({"first_k_dense_replace": 3}, r"model\.first_k_dense_replace: 3 exceeds num_layers 2"),
        ({"n_group": 3}, r"model\.n_group: 3 must divide n_routed_experts 8"),
        ({"v_head_dim": None}, r"model: family 'deepseek_v2' \(MLA\) needs v_head_dim"),
    ],
)
def test_mla_validation_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_model("tiny-mla", overrides)


def test_config_is_frozen() -> None:
    c = load_preset("tiny")
    with pytest.raises(Exception, match="frozen"):
        c.num_layers = 3  # type: ignore[misc]
    assert isinstance(c, ModelConfig)


@pytest.mark.parametrize("name", preset_names())
def test_presets_round_trip_through_dump(name: str) -> None:
    c = load_preset(name)
    assert ModelConfig.model_validate(c.model_dump()) == c
    assert c.param_count > c.weights_per_layer(0) > 0


def test_overrides_keep_the_rest() -> None:
    c = load_model("llama-3.2-1b", {"num_layers": 2})
    assert c.num_layers == 2 and c.name == "llama-3.2-1b"
    assert c.rope_scaling == load_preset("llama-3.2-1b").rope_scaling
    m = load_model("tiny-mla", {"q_lora_rank": None})
    assert m == load_preset("tiny-mla")
