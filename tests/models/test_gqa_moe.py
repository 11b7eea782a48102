"""GQA + MoE: Qwen2-MoE and Mixtral config.json files import (published parameter counts),
their float reference routes as the HF modeling files do, and the registry builds them
from GQA attention and the MoE MLP block."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.compiler.blocks.registry import features
from models.hf import hf_config_to_model, load_hf_config
from models.reference import ReferenceModel, softmax
from models.source import load_model, load_preset
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
    from isa.instructions import DmaLoad, DmaLoadIndexed, Gemm
    from models.bits import BitConfig
    from models.compiler import HardwareTarget, compile_model
    from sim.device.device import Device
    from sim.device.hw import load_hardware

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
    # the decode step's routed loads: k slots, each its expert's gate, up and down (the
    # routing table names which), never a fixed expert's region
    ix = [ins for ins in prog if isinstance(ins, DmaLoadIndexed)]
    moe_layers = sum(cfg.layer_is_moe(la) for la in range(cfg.num_layers))
    per_slot = cfg.moe_intermediate_size * cfg.hidden_size * 3  # W8 codes
    tile = cm.lowering(cm.tile_for(1)).target.tile_bytes
    codes = sum(ins.total_bytes for ins in ix if ins.dst < 2 * tile)  # into a tile buffer
    assert codes == moe_layers * cfg.num_experts_per_tok * per_slot
    plain = [ins for ins in prog if isinstance(ins, DmaLoad)
             and not isinstance(ins, DmaLoadIndexed)]
    regions = sorted(cm.mm.regions, key=lambda r: r.base)
    assert not any(r.name.startswith("w.") and ".experts." in r.name and
                   r.base <= ins.src < r.base + r.size for ins in plain for r in regions)
    gemms = {ins.n for ins in prog if isinstance(ins, Gemm)}
    assert (1 in gemms) == cfg.shared_expert_gate  # Qwen2-MoE's gate: one column per token


# --- the router on the vector unit (TOPK_GATE) against the float reference ----------------


def _router_inputs(m: ReferenceModel, tokens: np.ndarray, layer: int) -> np.ndarray:
    """The normed hidden states the reference's MoE layer ``layer`` routes (n, hidden)."""
    got: list[np.ndarray] = []
    route = m.route

    def capture(la: int, h: np.ndarray):
        if la == layer:
            got.append(h)
        return route(la, h)

    m.route = capture  # type: ignore[method-assign]
    m.reset()
    m.prefill(tokens)
    m.route = route  # type: ignore[method-assign]
    return np.concatenate(got)


@pytest.mark.parametrize(("preset", "same_sets"), [("tiny-qwen2-moe", 64), ("tiny-mixtral", 62),
                                                   ("tiny-mla", 62)])
def test_int8_router_logits_route_as_the_float_reference(preset: str, same_sets: int) -> None:
    """Router logits quantized to int8 at a static scale (calibration absmax * 1.25 / 127,
    as calibrate.py scales activations) and routed by TOPK_GATE pick the float reference's
    experts for ``same_sets`` of 64 tokens (the rest are near-ties); where both agree the
    gate weights differ by < 2e-3 on average, and the kernel is within 1e-3 of the float
    softmax of its own int8 logits."""
    from isa.kernels import moe
    from isa.kernels.fixed import quantize_multiplier
    from models.compiler.calibrate import calibration_tokens
    from models.compiler.qparams import MARGIN

    c = load_preset(preset)
    m = ReferenceModel(c, seed=0)
    layer = next(i for i in range(c.num_layers) if c.layer_is_moe(i))
    w = SyntheticWeights(c, seed=0).tensor(f"layers.{layer}.router")
    cal = _router_inputs(m, calibration_tokens(c, 0), layer) @ w.T
    s = float(np.abs(cal).max()) * MARGIN / 127
    h = _router_inputs(m, np.random.default_rng(1).integers(0, c.vocab_size, 64), layer)
    ids_f, w_f = m.route(layer, h)
    x = np.clip(np.round(h @ w.T / s), -128, 127).astype(np.int8)
    mult, shift = quantize_multiplier(s * 2**20)  # int8 logit -> Q20
    k = c.num_experts_per_tok
    out = np.zeros((len(h), 2 * k), np.int32)
    moe.topk_gate_rows(x, mult, shift, k, moe.RENORM if c.norm_topk_prob else 0, out)
    ids, gates = out[:, 0::2], out[:, 1::2] / 2**24
    assert sum(set(a) == set(b) for a, b in zip(ids.tolist(), ids_f.tolist(),
                                                strict=True)) == same_sets
    agree = ids == ids_f
    assert np.abs(gates - w_f)[agree].mean() < 2e-3
    z = x.astype(np.float64) * s
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = np.take_along_axis(p / p.sum(axis=1, keepdims=True), ids, axis=1)
    if c.norm_topk_prob:
        p /= p.sum(axis=1, keepdims=True)
    assert np.abs(gates - p).max() < 1e-3
