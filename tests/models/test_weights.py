"""Synthetic weights, quantization and packing, and the safetensors loader."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.instructions import Gemm
from kvsim.errors import ConfigError
from models.bits import W4V8, W8
from models.config import ModelConfig
from models.source import load_model, load_preset
from models.weights import (
    KEY_OUTLIER_GAIN,
    SafetensorsWeights,
    SyntheticWeights,
    hf_tensor_name,
    load_safetensors,
    pack_int4,
    quantize_tensor,
    quantize_weight,
    unpack_int4,
)

# --- synthetic weights ------------------------------------------------------------------------


def test_every_tensor_has_its_spec_shape_and_float32() -> None:
    for name in ("tiny", "tiny-mla"):
        c = load_preset(name)
        w = SyntheticWeights(c, seed=3)
        for spec in c.tensors():
            t = w.tensor(spec.name)
            assert t.shape == spec.shape and t.dtype == np.float32, spec.name
            assert np.all(np.isfinite(t))


def test_deterministic_and_independent_of_order() -> None:
    c = load_preset("tiny")
    a = SyntheticWeights(c, seed=7)
    first = a.tensor("layers.1.v_proj")
    for spec in c.tensors():  # generating everything else changes nothing
        a.tensor(spec.name)
    assert np.array_equal(a.tensor("layers.1.v_proj"), first)
    assert np.array_equal(SyntheticWeights(c, seed=7).tensor("layers.1.v_proj"), first)
    assert not np.array_equal(SyntheticWeights(c, seed=8).tensor("layers.1.v_proj"), first)
    assert not np.array_equal(a.tensor("layers.0.v_proj"), first)
    # The same tensor of a deeper model is the same: seeds depend on (seed, layer, name) only.
    deeper = SyntheticWeights(load_model("tiny", {"num_layers": 4}), seed=7)
    assert np.array_equal(deeper.tensor("layers.1.v_proj"), first)


def test_statistics() -> None:
    c = load_model("tiny", {"hidden_size": 256, "intermediate_size": 512})
    w = SyntheticWeights(c)
    assert w.tensor("layers.0.q_proj").std() == pytest.approx(1 / 16, rel=0.05)
    down = w.tensor("layers.0.down_proj")
    assert down.std() == pytest.approx(1 / np.sqrt(512) / np.sqrt(2 * c.num_layers), rel=0.05)
    gamma = w.tensor("layers.0.attn_norm")
    assert gamma.mean() == pytest.approx(1.0, abs=0.03) and gamma.min() > 0.5
    assert w.tensor("embed").std() == pytest.approx(0.02, rel=0.05)
    assert abs(w.tensor("layers.0.k_bias").mean()) < 0.05


def test_keys_have_outlier_channels() -> None:
    c = load_preset("tiny")
    k = SyntheticWeights(c).tensor("layers.0.k_proj")
    row_rms = np.sqrt(np.mean(k**2, axis=1))
    outliers = np.nonzero(row_rms > 4 * np.median(row_rms))[0]
    d = c.head_dim
    # one RoPE pair (j, j + d/2) per KV head, in the low-frequency half
    assert len(outliers) == 2 * c.num_kv_heads
    for h in range(c.num_kv_heads):
        js = sorted(o - h * d for o in outliers if h * d <= o < (h + 1) * d)
        assert len(js) == 2 and js[1] == js[0] + d // 2 and d // 4 <= js[0] < d // 2
    ratio = row_rms[outliers].mean() / np.median(row_rms)
    assert ratio == pytest.approx(KEY_OUTLIER_GAIN, rel=0.25)
    # MLA: outliers in the latent rows and one RoPE pair of kv_a_proj
    m = load_preset("tiny-mla")
    kv = SyntheticWeights(m).tensor("layers.0.kv_a_proj")
    rms = np.sqrt(np.mean(kv**2, axis=1))
    big = np.nonzero(rms > 4 * np.median(rms))[0]
    assert len(big) == 4 and sum(b >= 32 for b in big) == 2


def test_negative_seed_rejected() -> None:
    with pytest.raises(ConfigError, match="weights.seed"):
        SyntheticWeights(load_preset("tiny"), seed=-1)


# --- packing and quantization -------------------------------------------------------------------


def test_int4_layout_low_nibble_first() -> None:
    codes = np.array([[1, -2, 7, -8, 3]], dtype=np.int8)
    packed = pack_int4(codes)
    # byte 0 = (-2 & 0xF) << 4 | 1 = 0xE1; byte 1 = (-8 & 0xF) << 4 | 7 = 0x87; byte 2 = 0x03
    assert packed.tolist() == [[0xE1, 0x87, 0x03]]
    assert np.array_equal(unpack_int4(packed, 5), codes)


def test_int4_matches_isa_semantics() -> None:
    """The packed bytes are what the Gemm instruction's int4 kernel reads: multiplying the
    identity by them gives the codes back."""
    from isa.kernels.matrix import matmul

    rng = np.random.default_rng(0)
    codes = rng.integers(-8, 8, size=(6, 11), dtype=np.int8)
    packed = pack_int4(codes)
    eye = np.eye(11, dtype=np.int8)
    np.testing.assert_array_equal(matmul(eye, packed, 4, 11), codes.T.astype(np.int32))


@given(
    hnp.arrays(
        np.int8,
        st.tuples(st.integers(1, 5), st.integers(1, 9)),
        elements=st.integers(-8, 7),
    )
)
def test_pack_unpack_roundtrip(codes: np.ndarray) -> None:
    packed = pack_int4(codes)
    assert packed.shape == (codes.shape[0], (codes.shape[1] + 1) // 2)
    assert np.array_equal(unpack_int4(packed, codes.shape[1]), codes)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_weight(bits: int) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((7, 13)).astype(np.float32)
    w[3] = 0.0
    q = quantize_weight(w, bits)
    qmax = 2 ** (bits - 1) - 1
    codes = q.codes()
    assert codes.dtype == np.int8 and codes.shape == (7, 13)
    assert codes.min() >= -qmax and codes.max() <= qmax
    assert np.all(np.abs(codes).max(axis=1)[[0, 1, 2, 4, 5, 6]] == qmax)  # absmax row -> qmax
    assert q.scales[3] == 1.0 and not codes[3].any()
    assert np.all(np.abs(q.dequantize() - w) <= q.scales[:, None] / 2 * (1 + 1e-6))
    # the bytes are exactly the Gemm w operand
    g = Gemm(m=1, k=13, n=7, w_bits=bits, a=0, w=0, out=0)
    assert q.data.dtype == np.uint8 and q.data.size == q.nbytes == g.w_nbytes
    if bits == 8:
        assert np.array_equal(q.data.view(np.int8), codes)
    else:
        assert np.array_equal(q.data, pack_int4(codes))
    with pytest.raises(ConfigError, match="must be 4 or 8"):
        quantize_weight(w, 3)


def test_quantize_tensor_uses_role_bits() -> None:
    c = load_preset("tiny")
    w = SyntheticWeights(c)
    assert quantize_tensor(w, "layers.0.v_proj", W4V8).bits == 8
    assert quantize_tensor(w, "layers.0.k_proj", W4V8).bits == 4
    assert quantize_tensor(w, "embed", W4V8).bits == 8  # tied: embed is the LM head
    assert quantize_tensor(w, "layers.0.gate_proj", W8).bits == 8
    with pytest.raises(ConfigError, match="only matrices are quantized"):
        quantize_tensor(w, "layers.0.q_bias", W8)


# --- safetensors ------------------------------------------------------------------------------


def _to_bf16_bits(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype("<u2")


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Writes the safetensors format by hand (independent of the loader under test)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, (dtype, arr) in tensors.items():
        if dtype == "F32":
            raw = arr.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = arr.astype("<f2").tobytes()
        else:
            raw = _to_bf16_bits(arr).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_safetensors_dtypes(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    c = rng.standard_normal((2, 2, 2)).astype(np.float32)
    p = tmp_path / "t.safetensors"
    write_safetensors(p, {"a": ("F32", a), "b": ("F16", b), "c": ("BF16", c)})
    out = load_safetensors(p)
    assert set(out) == {"a", "b", "c"} and all(v.dtype == np.float32 for v in out.values())
    assert np.array_equal(out["a"], a)
    assert np.array_equal(out["b"], b.astype(np.float16).astype(np.float32))
    bf16 = (_to_bf16_bits(c).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(out["c"], bf16)
    assert np.allclose(out["c"], c, rtol=2**-7)


def test_safetensors_errors(tmp_path: Path) -> None:
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(ConfigError, match="short.safetensors: not a valid safetensors file"):
        load_safetensors(p)
    p.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ConfigError, match="not a valid safetensors file"):
        load_safetensors(p)
    p.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(ConfigError, match="not a valid safetensors file"):
        load_safetensors(p)
    hdr = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(16))
    with pytest.raises(ConfigError, match="not a valid safetensors file"):
        load_safetensors(p)
    hdr = json.dumps({"x": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + bytes(4))
    with pytest.raises(ConfigError, match="dtype I8; weights must be one of F32, F16, BF16"):
        load_safetensors(p)
    with pytest.raises(ConfigError, match="cannot read safetensors file"):
        load_safetensors(tmp_path / "missing.safetensors")


def hf_state_dict(c: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """The synthetic weights of ``c`` under their Hugging Face names."""
    w = SyntheticWeights(c, seed=seed)
    out: dict[str, np.ndarray] = {}
    for spec in c.tensors():
        leaf = spec.name.rsplit(".", 1)[-1]
        if leaf == "v_b_proj":
            continue
        if leaf == "k_b_proj":
            layer = spec.name.rsplit(".", 1)[0]
            k = w.tensor(spec.name).reshape(c.num_heads, -1, c.kv_lora_rank)
            v = w.tensor(layer + ".v_b_proj").reshape(c.num_heads, -1, c.kv_lora_rank)
            out[hf_tensor_name(spec.name)] = np.concatenate([k, v], axis=1).reshape(
                -1, c.kv_lora_rank
            )
        else:
            out[hf_tensor_name(spec.name)] = w.tensor(spec.name)
    return out


def test_hf_names() -> None:
    assert hf_tensor_name("layers.3.k_bias") == "model.layers.3.self_attn.k_proj.bias"
    assert (
        hf_tensor_name("layers.0.kv_a_proj") == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    )
    assert (
        hf_tensor_name("layers.1.experts.5.up_proj")
        == "model.layers.1.mlp.experts.5.up_proj.weight"
    )
    assert (
        hf_tensor_name("layers.1.shared.down_proj")
        == "model.layers.1.mlp.shared_experts.down_proj.weight"
    )
    assert hf_tensor_name("layers.1.router") == "model.layers.1.mlp.gate.weight"
    assert hf_tensor_name("layers.0.gate_proj") == "model.layers.0.mlp.gate_proj.weight"
    assert hf_tensor_name("final_norm") == "model.norm.weight"
    with pytest.raises(ConfigError, match="'norm' is not a kvsim tensor name"):
        hf_tensor_name("norm")


@pytest.mark.parametrize("preset", ["tiny", "tiny-mla"])
def test_safetensors_weights_map_hf_names(tmp_path: Path, preset: str) -> None:
    c = load_preset(preset)
    state = hf_state_dict(c, seed=5)
    names = sorted(state)
    half = len(names) // 2  # two shards, as HF checkpoints are split
    write_safetensors(
        tmp_path / "model-00001.safetensors", {n: ("F32", state[n]) for n in names[:half]}
    )
    write_safetensors(
        tmp_path / "model-00002.safetensors", {n: ("F32", state[n]) for n in names[half:]}
    )
    real = SafetensorsWeights(c, tmp_path)
    synth = SyntheticWeights(c, seed=5)
    for spec in c.tensors():
        assert np.array_equal(real.tensor(spec.name), synth.tensor(spec.name)), spec.name


def test_safetensors_weights_errors(tmp_path: Path) -> None:
    c = load_preset("tiny")
    state = hf_state_dict(c, seed=1)
    p = tmp_path / "m.safetensors"
    write_safetensors(p, {**{n: ("F32", a) for n, a in state.items()},
                          "model.norm.weight": ("F32", np.ones(32, np.float32))})
    with pytest.raises(  # checked when opened, before any tensor is used
        ConfigError, match="has shape \\(32,\\); model expects \\(64,\\) for 'final_norm'"
    ):
        SafetensorsWeights(c, p)
    del state["model.embed_tokens.weight"]
    write_safetensors(p, {n: ("F32", a) for n, a in state.items()})
    with pytest.raises(ConfigError, match="no tensor 'model.embed_tokens.weight'"):
        SafetensorsWeights(c, p)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no \\*.safetensors files"):
        SafetensorsWeights(c, empty)
