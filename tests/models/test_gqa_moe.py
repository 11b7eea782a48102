"""GQA + MoE: Qwen2-MoE and Mixtral config.json files import (published parameter counts),
their float reference routes as the HF modeling files do, and the registry builds them
from GQA attention and the MoE MLP block."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from isa.errors import ConfigError
from models.compiler.blocks.registry import features
from models.config import load_model, load_preset
from models.hf import hf_config_to_model, load_hf_config
from models.reference import ReferenceModel, softmax
from models.weights import SyntheticWeights, hf_tensor_name

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "models" / "presets"


def test_mixtral_8x7b_import() -> None:
    c = load_hf_config(PRESETS / "mixtral-8x7b.json")
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
            c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size,
            c.shared_expert_width, c.norm_topk_prob) == ("mixtral", 32, 4096, 32, 8, 8, 2,
                                                         14336, 0, True)
    assert all(c.layer_is_moe(i) for i in range(32))
    # Mistral AI's announcement: 46.7 B parameters in all, 12.9 B used per token
    assert c.param_count == 46_702_792_704
    active = c.active_weights_per_token + c.vocab_size * c.hidden_size  # + the embedding
    assert round(active / 1e9, 1) == 12.9
    f = features(c)
    assert f.attention == "gqa" and f.mlp == ("moe",) * 32


def test_qwen15_moe_a27b_import() -> None:
    c = load_hf_config(PRESETS / "qwen1.5-moe-a2.7b.json")
    assert (c.family, c.num_layers, c.n_routed_experts, c.num_experts_per_tok,
            c.moe_intermediate_size, c.n_shared_experts, c.shared_expert_width,
            c.shared_expert_gate, c.norm_topk_prob, c.qkv_bias) == (
        "qwen2_moe", 24, 60, 4, 1408, 1, 5632, True, False, True)
    # Qwen's model card: 14.3 B parameters, 2.7 B activated (embeddings included)
    assert round(c.param_count / 1e9, 1) == 14.3
    active = c.active_weights_per_token + c.vocab_size * c.hidden_size
    assert round(active / 1e9, 1) == 2.7
    assert c.tensor_spec("layers.0.shared_gate").shape == (1, 2048)
    assert features(c) == features(c).__class__("gqa", ("moe",) * 24)


def test_qwen2_moe_dense_layers_and_defaults() -> None:
    base = json.loads((PRESETS / "qwen1.5-moe-a2.7b.json").read_text())
    data = {**base, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    c = hf_config_to_model(data)
    # Qwen2MoeDecoderLayer: sparse iff not mlp-only and (i + 1) % step == 0
    assert [c.layer_is_moe(i) for i in range(6)] == [False, True, False, False, False, True]
    assert features(c).mlp == ("dense", "moe", "dense", "dense", "dense", "moe")
    dense = hf_config_to_model({**base, "num_experts": 0})
    assert not dense.is_moe and features(dense).mlp == ("dense",) * 24
    for k in ("num_experts", "moe_intermediate_size", "shared_expert_intermediate_size"):
        del base[k]  # Qwen2MoeConfig's defaults: Qwen1.5-MoE-A2.7B's sizes
    assert hf_config_to_model(base, name="qwen1.5-moe-a2.7b") == load_hf_config(
        PRESETS / "qwen1.5-moe-a2.7b.json")


def test_mixtral_defaults_and_errors() -> None:
    data = json.loads((PRESETS / "mixtral-8x7b.json").read_text())
    for k in ("rope_theta", "rms_norm_eps", "num_key_value_heads", "num_local_experts"):
        del data[k]  # MixtralConfig's defaults
    assert hf_config_to_model(data, name="mixtral-8x7b") == load_hf_config(
        PRESETS / "mixtral-8x7b.json")
    with pytest.raises(ConfigError, match="sliding_window 4096"):
        hf_config_to_model({**data, "sliding_window": 4096})
    with pytest.raises(ConfigError, match=r"model\.mlp_only_layers: layer 40 out of range"):
        hf_config_to_model({**json.loads((PRESETS / "qwen1.5-moe-a2.7b.json").read_text()),
                            "mlp_only_layers": [40]})
    with pytest.raises(ConfigError, match=r"shared_expert_gate: needs a shared expert"):
        load_model("tiny-qwen2-moe", {"n_shared_experts": 0,
                                      "shared_expert_intermediate_size": None})


def test_hf_tensor_names_per_family() -> None:
    assert (hf_tensor_name("layers.2.experts.5.gate_proj", family="mixtral")
            == "model.layers.2.block_sparse_moe.experts.5.w1.weight")
    assert (hf_tensor_name("layers.2.experts.5.down_proj", family="mixtral")
            == "model.layers.2.block_sparse_moe.experts.5.w2.weight")
    assert (hf_tensor_name("layers.2.router", family="mixtral")
            == "model.layers.2.block_sparse_moe.gate.weight")
    assert (hf_tensor_name("layers.1.shared.up_proj", family="qwen2_moe")
            == "model.layers.1.mlp.shared_expert.up_proj.weight")
    assert (hf_tensor_name("layers.1.shared_gate", family="qwen2_moe")
            == "model.layers.1.mlp.shared_expert_gate.weight")
    assert (hf_tensor_name("layers.1.experts.0.up_proj", family="qwen2_moe")
            == "model.layers.1.mlp.experts.0.up_proj.weight")


def _h() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)


def test_mixtral_routing_is_a_softmax_over_the_top_k_logits() -> None:
    c = load_preset("tiny-mixtral")
    m = ReferenceModel(c, seed=3)
    ids, w = m.route(0, _h())
    logits = _h() @ SyntheticWeights(c, seed=3).tensor("layers.0.router").T
    top = np.argsort(-logits, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(ids, top)
    # MixtralSparseMoeBlock: softmax, top-k, renormalise == softmax of the top-k logits
    np.testing.assert_allclose(w, softmax(np.take_along_axis(logits, top, axis=1)), rtol=1e-5)


def test_qwen2_moe_routing_and_gated_shared_expert() -> None:
    c = load_preset("tiny-qwen2-moe")
    m = ReferenceModel(c, seed=4)
    sw = SyntheticWeights(c, seed=4)
    h = _h()
    ids, w = m.route(1, h)
    scores = softmax(h @ sw.tensor("layers.1.router").T)
    np.testing.assert_allclose(w, np.take_along_axis(scores, ids, axis=1), rtol=1e-6)
    assert np.all(w.sum(axis=1) < 1)  # norm_topk_prob false: not renormalised
    # the MoE output is the weighted experts plus sigmoid(gate . h) * shared(h)
    def swiglu(pre: str, x: np.ndarray) -> np.ndarray:
        g = x @ sw.tensor(pre + "gate_proj").T
        u = x @ sw.tensor(pre + "up_proj").T
        return (g / (1 + np.exp(-g)) * u) @ sw.tensor(pre + "down_proj").T

    want = np.zeros_like(h)
    for t in range(5):
        for j in range(2):
            want[t] += w[t, j] * swiglu(f"layers.1.experts.{ids[t, j]}.", h[t:t + 1])[0]
    gate = 1 / (1 + np.exp(-(h @ sw.tensor("layers.1.shared_gate").T)))
    want += gate * swiglu("layers.1.shared.", h)
    np.testing.assert_allclose(m._moe(1, h), want, rtol=1e-4, atol=1e-5)


# --- timing-only compilation ---------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny-qwen2-moe", "tiny-mixtral"])
def test_gqa_moe_compiles_and_decode_reads_only_its_experts(preset: str) -> None:
    from isa.instructions import DmaLoad, Gemm
    from models.bits import BitConfig
    from models.compiler import HardwareTarget, compile_model
    from models.compiler.blocks.moe import routed_experts
    from sim.device import Device
    from sim.hw import load_hardware

    cfg = load_preset(preset)
    hw = load_hardware("tiny")
    cm = compile_model(cfg, BitConfig(), HardwareTarget.from_hw(hw), kv="int8",
                       core_mode="single", max_seq=16, cap=64, functional=False)
    assert cm.blocks.features.attention == "gqa"
    dev = Device(hw, functional=False, layout=cm.layout(host_bytes=1 << 22))
    pre = dev.run(cm.program(tokens=16, cache_size=0))
    pos = 16
    prog = cm.program(tokens=1, cache_size=pos)
    dec = dev.run(prog)
    assert pre.duration_ps > dec.duration_ps > 0
    # the weight regions the decode step's loads read: its token's experts, no other
    regions = sorted(cm.mm.regions, key=lambda r: r.base)
    read = {r.name for ins in prog if isinstance(ins, DmaLoad)
            for r in regions if r.base <= ins.src < r.base + r.size}
    for la in range(cfg.num_layers):
        if not cfg.layer_is_moe(la):
            assert not any(n.startswith(f"w.layers.{la}.experts.") for n in read)
            continue
        used = {int(n.split(".")[4]) for n in read
                if n.startswith(f"w.layers.{la}.experts.")}
        assert used == set(routed_experts(cfg, la, pos))
    gemms = {ins.n for ins in prog if isinstance(ins, Gemm)}
    assert (1 in gemms) == cfg.shared_expert_gate  # Qwen2-MoE's gate: one column per token
