"""Attention accuracy of KV formats against a float reference (integer path end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from isa import accuracy as acc
from isa import kvformats as kf


def keys_with_outliers(rng: np.random.Generator, t: int, kv_heads: int, d: int) -> np.ndarray:
    """Gaussian keys whose channels 3, 17 and 40 are 12x larger and offset, as the massive
    channels of real LLM keys are (KIVI, fig. 2)."""
    k = rng.standard_normal((t, kv_heads, d))
    k[:, :, [3, 17, 40]] = k[:, :, [3, 17, 40]] * 12 + 6
    return k


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(7)
    t, lq, h, kh, d = 384, 4, 8, 2, 64
    q = rng.standard_normal((lq, h, d))
    k = keys_with_outliers(rng, t, kh, d)
    v = rng.standard_normal((t, kh, d))
    return q, k, v


def test_metrics() -> None:
    a = np.array([1.0, 2.0, 2.0])
    assert acc.rel_l2(a, a) == 0.0 and acc.cosine(a, a) == pytest.approx(1.0)
    assert acc.rel_l2(a * 1.1, a) == pytest.approx(0.1)
    assert acc.cosine(-a, a) == pytest.approx(-1.0)
    assert acc.rel_l2(np.zeros(3), np.zeros(3)) == 0.0


def test_reference_is_causal_softmax_attention() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 2, 4))
    k = rng.standard_normal((3, 1, 4))
    v = rng.standard_normal((3, 1, 5))
    out = acc.attention_reference(q, k, v)  # queries at positions 1 and 2
    s = k[:2, 0] @ q[0, 1] / 2.0
    p = np.exp(s) / np.exp(s).sum()
    assert np.allclose(out[0, 1], p @ v[:2, 0])


def test_error_falls_from_2_to_4_to_8_bits(inputs) -> None:
    q, k, v = inputs
    res = {}
    for bits in (2, 4, 8):
        kfmt = kf.parse(f"b{bits}.channel.g32.asym.scale-fp16.zero-fp16")
        vfmt = kf.parse(f"b{bits}.token.g32.asym.scale-fp16.zero-fp16")
        res[bits] = acc.attention_accuracy(q, k, v, kfmt, vfmt)
    print("\nper-channel K / per-token V, outlier keys:",
          {b: (round(r.rel_l2, 4), round(r.cosine, 5)) for b, r in res.items()})
    assert res[2].rel_l2 > res[4].rel_l2 > res[8].rel_l2
    assert res[2].cosine < res[4].cosine < res[8].cosine
    assert res[8].rel_l2 < 0.15 and res[8].cosine > 0.99


def test_per_channel_key_groups_beat_per_token_on_outlier_keys(inputs) -> None:
    q, k, v = inputs
    rows = {}
    for bits in (2, 4):
        for axis in ("token", "channel"):
            kfmt = kf.parse(f"b{bits}.{axis}.g32.asym")
            rows[bits, axis] = acc.attention_accuracy(q, k, v, kfmt, "int8").rel_l2
    print("\nK rel L2 (V int8), outlier keys:", {k_: round(e, 4) for k_, e in rows.items()})
    for bits in (2, 4):
        assert rows[bits, "channel"] < 0.6 * rows[bits, "token"]


def test_without_outliers_grouping_matters_little() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 64))
    k = rng.standard_normal((256, 1, 64))
    v = rng.standard_normal((256, 1, 64))
    tok = acc.attention_accuracy(q, k, v, "b4.token.g32.asym", "int8").rel_l2
    ch = acc.attention_accuracy(q, k, v, "b4.channel.g32.asym", "int8").rel_l2
    assert 0.5 < tok / ch < 2.0


def test_named_formats(inputs) -> None:
    q, k, v = inputs
    bf16 = acc.attention_accuracy(q, k, v, "bf16", "bf16")
    int8 = acc.attention_accuracy(q, k, v, "int8", "int8")
    assert bf16.rel_l2 == int8.rel_l2  # int8 values are exact in bf16
    kivi4 = acc.attention_accuracy(q, k, v, *kf.pair("kivi-4"))
    kivi2 = acc.attention_accuracy(q, k, v, *kf.pair("kivi-2"))
    qs = acc.attention_accuracy(q, k, v, "qserve-kv4", "qserve-kv4")
    assert int8.rel_l2 < kivi4.rel_l2 < kivi2.rel_l2
    assert kivi4.rel_l2 < qs.rel_l2  # per-channel keys and the fp16 window help


def test_mla_formats() -> None:
    rng = np.random.default_rng(5)
    t, d = 400, 576
    cache = rng.standard_normal((t, d))
    cache[:, 512:] *= 3  # the RoPE part has its own range
    q = rng.standard_normal((2, 4, d)) * 0.2
    res = {n: acc.mla_attention_accuracy(q, cache, n, v_dim=512)
           for n in ("bf16", "quantmla-c4r4", "quantmla-c2r4")}
    assert res["bf16"].rel_l2 < res["quantmla-c4r4"].rel_l2 < res["quantmla-c2r4"].rel_l2
    assert res["quantmla-c4r4"].cosine > 0.98


def test_cache_error_ordering() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 64))
    errs = [acc.cache_error(f"b{b}.token.g32.asym", x) for b in (2, 4, 8)]
    assert errs[0] > errs[1] > errs[2]
