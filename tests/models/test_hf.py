"""Import of Hugging Face config.json files: the three shared configs, defaults, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.errors import ConfigError
from models.hf import load_hf_config
from models.source import load_model, load_preset

ROOT = Path(__file__).resolve().parents[2]
#: The project's shared documents sit beside the repository (in CI too).
HF_DIR = ROOT.parent / "shared" / "hf-configs"
PRESETS = ROOT / "models" / "presets"


def _write(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


LLAMA_MIN = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}


@pytest.mark.parametrize("stem", ["qwen2.5-0.5b", "llama-3.2-1b", "deepseek-v2-lite"])
def test_presets_are_the_shared_hf_files(stem: str) -> None:
    shared = HF_DIR / f"{stem}.json"
    if shared.exists():
        assert json.loads(shared.read_text()) == json.loads((PRESETS / f"{stem}.json").read_text())
    assert load_hf_config(PRESETS / f"{stem}.json") == load_preset(stem)


def test_qwen_import() -> None:
    c = load_hf_config(PRESETS / "qwen2.5-0.5b.json")
    assert c.name == "qwen2.5-0.5b" and c.family == "qwen2"
    assert c.qkv_bias and not c.o_bias  # Qwen2 always has q/k/v bias
    assert c.head_dim == 896 // 14 and c.num_kv_heads == 2 and c.tie_word_embeddings


def test_llama_import_honours_head_dim_and_rope_scaling() -> None:
    c = load_hf_config(PRESETS / "llama-3.2-1b.json")
    assert c.family == "llama" and c.head_dim == 64 and c.num_kv_heads == 8
    assert not c.qkv_bias and c.tie_word_embeddings and c.rope_theta == 500000.0
    assert c.rope_scaling is not None and c.rope_scaling.type == "llama3"
    assert c.rope_scaling.factor == 32.0 and c.rope_scaling.original_max_position_embeddings == 8192


def test_deepseek_import() -> None:
    c = load_hf_config(PRESETS / "deepseek-v2-lite.json")
    assert c.family == "deepseek_v2" and c.num_layers == 27 and c.q_lora_rank is None
    assert (c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim) == (
        512,
        64,
        128,
        128,
    )
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts) == (64, 6, 2)
    assert (c.moe_intermediate_size, c.first_k_dense_replace, c.intermediate_size) == (
        1408,
        1,
        10944,
    )
    assert not c.norm_topk_prob and c.routed_scaling_factor == 1.0 and c.topk_method == "greedy"
    assert not c.tie_word_embeddings
    assert c.rope_scaling is not None and c.rope_scaling.type == "yarn"


def test_defaults_head_dim_kv_heads_tie(tmp_path: Path) -> None:
    c = load_hf_config(_write(tmp_path, LLAMA_MIN))
    assert c.head_dim == 16 and c.num_kv_heads == 4 and not c.tie_word_embeddings
    assert c.rope_theta == 10000.0 and c.max_position_embeddings == 2048 and c.rms_norm_eps == 1e-6
    assert c.name == tmp_path.name  # config.json: named after its folder
    assert load_hf_config(tmp_path) == c  # a folder holding config.json


def test_head_dim_key_wins(tmp_path: Path) -> None:
    c = load_hf_config(_write(tmp_path, {**LLAMA_MIN, "model_type": "mistral", "head_dim": 32}))
    assert c.family == "mistral" and c.head_dim == 32


def test_llama_attention_bias(tmp_path: Path) -> None:
    c = load_hf_config(_write(tmp_path, {**LLAMA_MIN, "attention_bias": True}))
    assert c.qkv_bias and c.o_bias


def test_architectures_when_no_model_type(tmp_path: Path) -> None:
    data = {k: v for k, v in LLAMA_MIN.items() if k != "model_type"}
    data["architectures"] = ["Qwen2ForCausalLM"]
    assert load_hf_config(_write(tmp_path, data)).family == "qwen2"


def test_missing_keys_listed_exactly(tmp_path: Path) -> None:
    data = {k: v for k, v in LLAMA_MIN.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(ConfigError) as err:
        load_hf_config(_write(tmp_path, data))
    msg = str(err.value)
    assert str(tmp_path / "config.json") in msg
    assert msg.endswith("model_type 'llama' lacks required keys: hidden_size, vocab_size")


def test_missing_mla_and_moe_keys(tmp_path: Path) -> None:
    data = json.loads((PRESETS / "deepseek-v2-lite.json").read_text())
    for k in ("q_lora_rank", "v_head_dim", "moe_intermediate_size"):
        del data[k]
    with pytest.raises(
        ConfigError, match="lacks required keys: q_lora_rank, v_head_dim, moe_intermediate_size$"
    ):
        load_hf_config(_write(tmp_path, data))


def test_unsupported_model_type_lists_supported(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match="unsupported model_type 'gpt2'; supported: cohere2, deepseek_v2, exaone4, "
              "gemma3_text, llama, mistral, mixtral, qwen2, qwen2_moe",
    ):
        load_hf_config(_write(tmp_path, {**LLAMA_MIN, "model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="unsupported architectures"):
        load_hf_config(_write(tmp_path, {"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match=r"lacks required keys: model_type \(or architectures\)"):
        load_hf_config(_write(tmp_path, {"hidden_size": 3}))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"mlp_bias": True}, "mlp_bias true"),
        (
            {"rope_scaling": {"rope_type": "longrope"}},
            "rope_scaling type 'longrope' is not supported",
        ),
        (
            {"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768},
            "sliding_window 4096",
        ),
    ],
)
def test_unsupported_features_rejected(tmp_path: Path, extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_hf_config(_write(tmp_path, {**LLAMA_MIN, **extra}))


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"config\.json: model\.num_kv_heads: 3 must divide num_heads 4"
    ):
        load_hf_config(_write(tmp_path, {**LLAMA_MIN, "num_key_value_heads": 3}))


@pytest.mark.parametrize("extra, message", [
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"num_key_value_heads": 0}, "model.num_kv_heads: Input should be greater than or equal to 1"),
    ({"num_hidden_layers": 2**40}, "model.num_layers: Input should be less than or equal to 1024"),
])
def test_impossible_counts_are_refused(tmp_path: Path, extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_hf_config(_write(tmp_path, {**LLAMA_MIN, **extra}))


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=f"{missing}: cannot read model config"):
        load_hf_config(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=f"{bad}: not valid JSON"):
        load_hf_config(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="top level must be a JSON object"):
        load_hf_config(arr)


def test_load_model_accepts_a_path(tmp_path: Path) -> None:
    p = _write(tmp_path, LLAMA_MIN, "mini.json")
    c = load_model(str(p), {"num_layers": 1})
    assert c.name == "mini" and c.num_layers == 1
