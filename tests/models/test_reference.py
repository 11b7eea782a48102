"""Float reference model: cache consistency, MLA/MoE paths, RoPE, quantized weights."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import W4V8, W8
from models.config import ModelConfig
from models.reference import (
    FLOAT,
    ReferenceModel,
    apply_rope,
    rms_norm,
    rope_cos_sin,
    rope_inv_freq,
    softmax,
    softmax_scale,
)
from models.source import load_model, load_preset
from models.weights import SyntheticWeights

TOKENS = [3, 17, 200, 5, 9, 44, 1, 250, 77, 128]

VARIANTS: dict[str, dict] = {
    "tiny": {},
    "tiny-llama-untied": {
        "family": "llama",
        "qkv_bias": False,
        "o_bias": True,
        "tie_word_embeddings": False,
    },
    "tiny-mha": {"num_kv_heads": 4},
    "tiny-llama3-rope": {
        "family": "llama",
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "tiny-mla": {},
    "tiny-mla-qlora": {"q_lora_rank": 16},
    "tiny-mla-yarn": {
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        }
    },
    "tiny-mla-grouped": {
        "topk_method": "group_limited_greedy",
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": True,
    },
    "tiny-mla-all-moe": {
        "first_k_dense_replace": 0,
        "n_shared_experts": 0,
        "routed_scaling_factor": 2.0,
    },
    "tiny-qwen2-moe": {},
    "tiny-mixtral": {},
}


def _config(variant: str) -> ModelConfig:
    base = ("tiny-mla" if variant.startswith("tiny-mla")
            else variant if variant in ("tiny-qwen2-moe", "tiny-mixtral") else "tiny")
    return load_model(base, VARIANTS[variant])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_then_decode_equals_full_prefill(variant: str) -> None:
    c = _config(variant)
    m = ReferenceModel(c, seed=11)
    full = m.prefill(TOKENS)
    assert full.shape == (len(TOKENS), c.vocab_size) and full.dtype == FLOAT == np.float64
    assert np.all(np.isfinite(full)) and full.std() > 0.01
    full_cache = m.kv_cache()
    n = 6
    first = m.prefill(TOKENS[:n])
    np.testing.assert_allclose(first, full[:n], rtol=1e-5, atol=1e-5)  # causal: no look-ahead
    for i, tok in enumerate(TOKENS[n:]):
        logits = m.decode(tok)
        assert logits.shape == (c.vocab_size,)
        np.testing.assert_allclose(logits, full[n + i], rtol=1e-4, atol=1e-5)
    assert m.num_cached == len(TOKENS)
    for a, b in zip(m.kv_cache(), full_cache, strict=True):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_chunked_forward_equals_prefill() -> None:
    m = ReferenceModel(load_preset("tiny-mla"), seed=2)
    full = m.prefill(TOKENS)
    m.reset()
    parts = [m.forward(TOKENS[:3]), m.forward(TOKENS[3:7]), m.forward(TOKENS[7:])]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("preset", ["tiny", "tiny-mla"])
def test_kv_cache_shapes_and_reload(preset: str) -> None:
    c = load_preset(preset)
    m = ReferenceModel(c)
    m.prefill(TOKENS[:5])
    cache = m.kv_cache()
    assert len(cache) == c.num_layers
    assert {k: v.shape for k, v in cache[0].items()} == {
        k: (5, w) for k, w in c.kv_components().items()
    }
    expected = m.decode(TOKENS[5])
    m.reset()
    assert m.num_cached == 0
    m.set_kv_cache(cache)
    assert m.num_cached == 5
    np.testing.assert_array_equal(m.decode(TOKENS[5]), expected)
    # an edited cache really changes the output
    edited = [{k: v.copy() for k, v in layer.items()} for layer in cache]
    first = next(iter(edited[0]))
    edited[0][first][2] *= -3.0
    m.set_kv_cache(edited)
    assert not np.allclose(m.decode(TOKENS[5]), expected)
    with pytest.raises(ConfigError, match="kv cache layer 1"):
        m.set_kv_cache([cache[0], {k: v[:3] for k, v in cache[1].items()}])
    with pytest.raises(ConfigError, match="kv cache: 1 layers"):
        m.set_kv_cache(cache[:1])


def test_gqa_attention_matches_naive_loop() -> None:
    """Layer 0 of tiny recomputed with explicit per-head loops from the same weights."""
    c = load_preset("tiny")
    w = SyntheticWeights(c, seed=4)
    m = ReferenceModel(c, w)
    _, hidden = m.forward_embeddings(m.embed(TOKENS[:4]), return_hidden=True)
    x = hidden[0]
    h = rms_norm(x, w.tensor("layers.0.attn_norm"), c.rms_norm_eps)
    q = h @ w.tensor("layers.0.q_proj").T + w.tensor("layers.0.q_bias")
    k = h @ w.tensor("layers.0.k_proj").T + w.tensor("layers.0.k_bias")
    v = h @ w.tensor("layers.0.v_proj").T + w.tensor("layers.0.v_bias")
    d, half = c.head_dim, c.head_dim // 2
    freqs = 1.0 / c.rope_theta ** (np.arange(half) * 2 / d)
    out = np.zeros((4, c.num_heads * d))
    for t in range(4):
        for head in range(c.num_heads):
            kvh = head // (c.num_heads // c.num_kv_heads)

            def rot(vec: np.ndarray, pos: int) -> np.ndarray:
                a, b = vec[:half], vec[half:]
                cos, sin = np.cos(pos * freqs), np.sin(pos * freqs)
                return np.concatenate([a * cos - b * sin, b * cos + a * sin])

            qv = rot(q[t, head * d : (head + 1) * d], t)
            scores = [
                qv @ rot(k[s, kvh * d : (kvh + 1) * d], s) / math.sqrt(d) for s in range(t + 1)
            ]
            p = np.exp(np.array(scores) - max(scores))
            p /= p.sum()
            out[t, head * d : (head + 1) * d] = sum(
                p[s] * v[s, kvh * d : (kvh + 1) * d] for s in range(t + 1)
            )
    attn = out @ w.tensor("layers.0.o_proj").T
    h2 = x + attn
    mlp_in = rms_norm(h2.astype(np.float32), w.tensor("layers.0.mlp_norm"), c.rms_norm_eps)
    g = mlp_in @ w.tensor("layers.0.gate_proj").T
    u = mlp_in @ w.tensor("layers.0.up_proj").T
    y = h2 + (g / (1 + np.exp(-g)) * u) @ w.tensor("layers.0.down_proj").T
    np.testing.assert_allclose(hidden[1], y, rtol=1e-4, atol=1e-5)


def test_mla_cache_suffices_for_absorbed_attention() -> None:
    """The cached latent and RoPE key reproduce layer 0's attention output with the
    weight-absorbed formulation MLA decode kernels use (q_nope @ W_UK against the latent)."""
    c = load_preset("tiny-mla")
    w = SyntheticWeights(c, seed=9)
    m = ReferenceModel(c, w)
    _, hidden = m.forward_embeddings(m.embed(TOKENS[:5]), return_hidden=True)
    cache = m.kv_cache()[0]
    latent, k_pe = cache["content"], cache["rope"]
    n, heads, nope, rope = 5, c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
    h = rms_norm(hidden[0], w.tensor("layers.0.attn_norm"), c.rms_norm_eps)
    q = (h @ w.tensor("layers.0.q_proj").T).reshape(n, heads, nope + rope)
    cos, sin = rope_cos_sin(c, np.arange(n))
    q_pe = apply_rope(q[..., nope:], cos, sin, interleaved=True)
    w_uk = w.tensor("layers.0.k_b_proj").reshape(heads, nope, c.kv_lora_rank)
    w_uv = w.tensor("layers.0.v_b_proj").reshape(heads, c.v_head_dim, c.kv_lora_rank)
    q_lat = np.einsum("nhd,hdr->nhr", q[..., :nope], w_uk)  # absorbed query
    scores = np.einsum("nhr,tr->hnt", q_lat, latent) + np.einsum("nhd,td->hnt", q_pe, k_pe)
    scores = scores * softmax_scale(c)
    scores[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
    ctx = np.einsum("hnt,tr->nhr", softmax(scores.astype(np.float32)), latent)
    out = np.einsum("nhr,hvr->nhv", ctx, w_uv).reshape(n, -1) @ w.tensor("layers.0.o_proj").T
    after_attn = hidden[0] + out
    mlp_in = rms_norm(after_attn.astype(np.float32), w.tensor("layers.0.mlp_norm"), c.rms_norm_eps)
    g = mlp_in @ w.tensor("layers.0.gate_proj").T
    u = mlp_in @ w.tensor("layers.0.up_proj").T
    y = after_attn + (g / (1 + np.exp(-g)) * u) @ w.tensor("layers.0.down_proj").T
    np.testing.assert_allclose(hidden[1], y, rtol=1e-4, atol=1e-5)


def test_moe_routing() -> None:
    c = load_preset("tiny-mla")
    m = ReferenceModel(c)
    m.prefill(TOKENS)
    assert set(m.last_routing) == {1}  # layer 0 is dense
    ids = m.last_routing[1]
    assert ids.shape == (len(TOKENS), 2) and ids.min() >= 0 and ids.max() < 8
    assert all(len(set(row)) == 2 for row in ids.tolist())
    h = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    ids, weights = m.route(1, h)
    scores = softmax(h @ SyntheticWeights(c).tensor("layers.1.router").T)
    np.testing.assert_array_equal(ids, np.argsort(-scores, axis=1, kind="stable")[:, :2])
    np.testing.assert_allclose(weights, np.take_along_axis(scores, ids, axis=1), rtol=1e-6)
    g = ReferenceModel(load_model("tiny-mla", VARIANTS["tiny-mla-grouped"]))
    gids, gw = g.route(1, h)
    np.testing.assert_allclose(gw.sum(axis=1), 1.0, rtol=1e-5)  # norm_topk_prob
    # group-limited: both experts come from the best topk_group=2 of 4 groups of 2
    gscores = softmax(h @ SyntheticWeights(g.config).tensor("layers.1.router").T)
    best_groups = np.argsort(-gscores.reshape(4, 4, 2).max(-1), axis=1)[:, :2]
    for row, groups in zip(gids // 2, best_groups, strict=True):
        assert set(row.tolist()) <= set(groups.tolist())


def test_rope_properties() -> None:
    c = load_preset("tiny")
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 16)).astype(np.float32)
    cos, sin = rope_cos_sin(c, np.array([5, 2, 12, 9]))
    rq = apply_rope(np.stack([q, q, q, q]), cos, sin)
    rk = apply_rope(np.stack([k, k, k, k]), cos, sin)
    assert np.allclose(np.linalg.norm(rq, axis=1), np.linalg.norm(q), rtol=1e-5)
    # the score depends only on the relative position: (5, 2) and (12, 9) are both +3
    assert rq[0] @ rk[1] == pytest.approx(rq[2] @ rk[3], rel=1e-4)
    cos0, sin0 = rope_cos_sin(c, np.array([0]))
    np.testing.assert_array_equal(apply_rope(q[None], cos0, sin0)[0], q)


def test_llama3_and_yarn_frequencies() -> None:
    llama = load_preset("llama-3.2-1b")
    base = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    inv = rope_inv_freq(llama)
    wavelen = 2 * np.pi / base
    assert np.array_equal(inv[wavelen < 8192 / 4], base[wavelen < 8192 / 4])  # high freq kept
    np.testing.assert_allclose(inv[wavelen > 8192], base[wavelen > 8192] / 32)  # low freq / 32
    ds = load_preset("deepseek-v2-lite")
    base = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)
    inv = rope_inv_freq(ds)
    # YaRN correction range for dim 64, base 1e4, 4096 positions, beta 32/1: [10, 23]
    np.testing.assert_allclose(inv[:11], base[:11])
    np.testing.assert_allclose(inv[23:], base[23:] / 40)
    mscale = 0.1 * 0.707 * math.log(40) + 1
    assert softmax_scale(ds) == pytest.approx(192**-0.5 * mscale**2)
    assert softmax_scale(load_preset("qwen2.5-0.5b")) == pytest.approx(1 / 8)


def test_weight_quantization_error_grows_with_fewer_bits() -> None:
    c = load_preset("tiny")
    ref = ReferenceModel(c).prefill(TOKENS)
    w8 = ReferenceModel(c, weight_bits=W8).prefill(TOKENS)
    w4 = ReferenceModel(c, weight_bits=W4V8).prefill(TOKENS)
    e8, e4 = np.abs(w8 - ref).mean(), np.abs(w4 - ref).mean()
    assert 0 < e8 < e4 < 0.5 * np.abs(ref).mean()


def test_bad_inputs() -> None:
    m = ReferenceModel(load_preset("tiny"))
    with pytest.raises(ConfigError, match="ids must lie in 0..255"):
        m.prefill([1, 256])
    with pytest.raises(ConfigError, match="at least one token"):
        m.prefill([])
    with pytest.raises(ConfigError, match="another model config"):
        ReferenceModel(load_preset("tiny"), SyntheticWeights(load_preset("tiny-mla")))


def test_qwen_config_builds_with_published_param_count() -> None:
    c = load_preset("qwen2.5-0.5b")
    assert c.param_count == pytest.approx(494e6, rel=0.001)  # published: 0.49B
