"""Model weights: deterministic synthetic float weights, real weights from safetensors, and
their quantization into the byte layout of the ISA's ``Gemm`` ``w`` operand.

Every source implements :class:`WeightSource`: ``tensor(name)`` returns one float32 tensor
by its kvsim name (see :meth:`models.config.ModelConfig.layer_tensors`), built on demand,
so a 500M-parameter model is never held whole.

Synthetic weights (:class:`SyntheticWeights`) draw each tensor from its own random stream,
seeded by ``(seed, layer, tensor name)``: any tensor can be regenerated alone and is the
same whatever else was generated before. Statistics are chosen to look like a trained
LLM's where it matters to kvsim (quantization ranges, attention patterns):

- projections: normal, std ``1/sqrt(fan_in)`` (variance-preserving); the projections that
  write the residual stream (``o_proj``, ``down_proj``) are scaled by ``1/sqrt(2 L)`` as in
  GPT-2's initialisation, so the residual stream does not grow with depth;
- RMSNorm gammas: ``1 + N(0, 0.1)``; biases ``N(0, 0.1)``;
- embeddings (and an untied LM head): ``N(0, 0.02)``, the ``initializer_range`` of all
  three shared HF configs;
- keys have outlier channels: in each KV head one RoPE channel pair of ``k_proj`` (for MLA,
  two latent channels and one RoPE pair of ``kv_a_proj``) is scaled up by
  :data:`KEY_OUTLIER_GAIN`, because real LLM keys have a few fixed channels of much larger
  magnitude than the rest (reported by KIVI, Liu et al. 2024, and KVQuant, Hooper et al.
  2024), which is what makes per-channel key quantization matter.

Quantization (:func:`quantize_weight`) is symmetric per output channel: ``scale[n] =
max|w[n, :]| / (2**(b-1) - 1)``, ``code = round_half_even(w / scale)``. A matrix of shape
``(n, k)`` is stored output-channel-major, ``n`` rows of ``k`` codes: int8 one byte each,
int4 two per byte with element ``2i`` in the low nibble and ``2i+1`` in the high nibble of
byte ``i``, each row padded to whole bytes (the ``Gemm`` ``w`` operand, isa/instructions.py).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvsim.errors import ConfigError

from .bits import WeightBits
from .config import ModelConfig, TensorSpec
from .hf_gemma import FAMILY as GEMMA_FAMILY
from .hf_gemma import HF_NORMS as GEMMA_HF_NORMS

#: Std of embedding entries: ``initializer_range`` = 0.02 in the Qwen2.5, Llama-3.2 and
#: DeepSeek-V2 config.json files.
EMBED_STD = 0.02
#: Std of RMSNorm gammas around 1 and of projection biases (assumption: trained gammas
#: spread around 1; the value only needs to make them not all equal).
NORM_GAMMA_STD = 0.1
BIAS_STD = 0.1
#: Gain of the key outlier channels over the others (assumption: an order of magnitude,
#: the scale of the outlier key channels KIVI and KVQuant plot; not fitted to a model).
KEY_OUTLIER_GAIN = 8.0
#: RoPE channel pairs per KV head made outliers in ``k_proj`` (GQA).
KEY_OUTLIER_PAIRS_PER_HEAD = 1
#: Latent channels made outliers in MLA's ``kv_a_proj`` (plus one RoPE pair).
LATENT_OUTLIER_CHANNELS = 2


class WeightSource(Protocol):
    """Anything that returns a model's float32 tensors by kvsim name."""

    config: ModelConfig

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32, shape ``config.tensor_spec(name).shape``."""
        ...


class CachedWeights:
    """``source`` with every tensor kept after its first read, up to ``budget_bytes`` in
    all (tensors past the budget are read again each time). Compiling a real model reads
    each matrix several times (calibration, integer parameters, the weight image), and a
    GGUF tensor is dequantized, a rotated one multiplied, on every read. The arrays handed
    out are read-only: a caller that wants to change one copies it."""

    #: Default budget: a 135M-parameter model's float32 weights twice over (an assumption
    #: that keeps a laptop's memory safe for larger models, which simply re-read).
    BUDGET_BYTES = 1536 * 2**20

    def __init__(self, source: WeightSource, budget_bytes: int = BUDGET_BYTES):
        self.source = source
        self.config = source.config
        self.budget_bytes = budget_bytes
        self.held_bytes = 0
        self._kept: dict[str, np.ndarray] = {}

    def tensor(self, name: str) -> np.ndarray:
        arr = self._kept.get(name)
        if arr is not None:
            return arr
        arr = self.source.tensor(name)
        if self.held_bytes + arr.nbytes <= self.budget_bytes:
            arr = np.array(arr, copy=True) if arr.flags.writeable is False else arr
            arr.flags.writeable = False
            self._kept[name] = arr
            self.held_bytes += arr.nbytes
        return arr

    def __getattr__(self, name: str):  # e.g. RotatedWeights.head
        return getattr(self.source, name)


def _layer_of(name: str) -> int:
    """Layer index of a ``layers.<i>.`` name, -1 for global tensors."""
    if name.startswith("layers."):
        return int(name.split(".", 2)[1])
    return -1


def tensor_seed(seed: int, name: str) -> np.random.SeedSequence:
    """The seed sequence of tensor ``name``: from ``(seed, layer + 1, crc32(name))``."""
    return np.random.SeedSequence([seed, _layer_of(name) + 1, zlib.crc32(name.encode())])


class SyntheticWeights:
    """Deterministic synthetic weights for ``config`` (float32, generated per request).

    Nothing is cached: each :meth:`tensor` call draws the tensor again from its own seed.
    """

    def __init__(self, config: ModelConfig, *, seed: int = 0):
        if seed < 0:
            raise ConfigError(f"weights.seed: must be >= 0, got {seed}")
        self.config = config
        self.seed = seed

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name``: float32 of its spec's shape (matrices ``(out, in)``)."""
        spec = self.config.tensor_spec(name)
        rng = np.random.default_rng(tensor_seed(self.seed, name))
        shape = spec.shape
        if spec.role == "norm":
            return (1.0 + NORM_GAMMA_STD * rng.standard_normal(shape, dtype=np.float32)).astype(
                np.float32
            )
        if spec.role == "bias":
            return (BIAS_STD * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if name in ("embed", "lm_head"):
            return (EMBED_STD * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        std = 1.0 / math.sqrt(shape[1])
        if spec.role in ("output", "down"):
            std /= math.sqrt(2 * self.config.num_layers)
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(std)
        rows = self._outlier_rows(spec, rng)
        if rows.size:
            w[rows] *= np.float32(KEY_OUTLIER_GAIN)
        return w

    def _outlier_rows(self, spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
        c = self.config
        leaf = spec.name.rsplit(".", 1)[-1]
        if leaf == "k_proj":
            d = c.head_dim
            rows = []
            for h in range(c.num_kv_heads):
                # rotate-half RoPE pairs channel j with j + d/2; pick low-frequency pairs.
                js = rng.choice(
                    np.arange(d // 4, d // 2), KEY_OUTLIER_PAIRS_PER_HEAD, replace=False
                )
                for j in js:
                    rows += [h * d + int(j), h * d + int(j) + d // 2]
            return np.array(sorted(rows), dtype=np.int64)
        if leaf == "kv_a_proj":
            assert c.kv_lora_rank is not None and c.qk_rope_head_dim is not None
            latent = rng.choice(c.kv_lora_rank, LATENT_OUTLIER_CHANNELS, replace=False)
            # DeepSeek-V2 stores its RoPE key interleaved: pair i is channels (2i, 2i+1).
            half = c.qk_rope_head_dim // 2
            i = int(rng.integers(half // 2, half)) if half > 1 else 0
            rope = [c.kv_lora_rank + 2 * i, c.kv_lora_rank + 2 * i + 1]
            return np.array(sorted([int(x) for x in latent] + rope), dtype=np.int64)
        return np.zeros(0, dtype=np.int64)

    def layer(self, layer: int) -> dict[str, np.ndarray]:
        """All tensors of block ``layer`` by name. For MoE layers this includes every
        routed expert (DeepSeek-V2-Lite: ~2.2 GB of float32); prefer :meth:`tensor`."""
        return {s.name: self.tensor(s.name) for s in self.config.layer_tensors(layer)}


# --- quantization ---------------------------------------------------------------------------


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """int8 codes in [-8, 7], shape ``(n, k)`` -> uint8 ``(n, ceil(k/2))``: element ``2i``
    in the low nibble of byte ``i``, ``2i+1`` in the high nibble; an odd row ends in a
    zero high nibble."""
    c = np.asarray(codes)
    if c.ndim != 2:
        raise ValueError(f"pack_int4: codes must be 2-D (n, k), got shape {c.shape}")
    if c.size and (c.min() < -8 or c.max() > 7):
        raise ValueError("pack_int4: codes must lie in [-8, 7]")
    n, k = c.shape
    nib = (c.astype(np.int16) & 0x0F).astype(np.uint8)
    if k % 2:
        nib = np.concatenate([nib, np.zeros((n, 1), dtype=np.uint8)], axis=1)
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, k: int) -> np.ndarray:
    """Inverse of :func:`pack_int4`: uint8 ``(n, ceil(k/2))`` -> int8 ``(n, k)``."""
    p = np.asarray(packed, dtype=np.uint8)
    if p.ndim != 2 or p.shape[1] != (k + 1) // 2:
        raise ValueError(f"unpack_int4: packed shape {p.shape} does not hold rows of {k} codes")
    out = np.empty((p.shape[0], 2 * p.shape[1]), dtype=np.int8)
    out[:, 0::2] = (p & 0x0F).astype(np.int8)
    out[:, 1::2] = (p >> 4).astype(np.int8)
    out[out > 7] -= 16
    return out[:, :k]


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A matrix quantized symmetrically per output channel.

    ``data`` holds the bytes of the ``Gemm`` ``w`` operand, uint8 ``(n, row_bytes)``;
    ``scales`` (float32 ``(n,)``) gives ``w[n, :] ~= codes[n, :] * scales[n]``.
    """

    bits: int
    n: int
    k: int
    data: np.ndarray
    scales: np.ndarray

    @property
    def row_bytes(self) -> int:
        """Bytes of one output channel's row: ``ceil(k * bits / 8)``."""
        return (self.k * self.bits + 7) // 8

    @property
    def nbytes(self) -> int:
        """Bytes of the packed codes (``Gemm.w_nbytes``), scales not included."""
        return self.n * self.row_bytes

    def codes(self) -> np.ndarray:
        """The integer codes, int8 ``(n, k)``."""
        if self.bits == 8:
            return self.data.view(np.int8).reshape(self.n, self.k)
        return unpack_int4(self.data, self.k)

    def integer_weights(self) -> np.ndarray:
        """The integers the row scales multiply: the codes (as group-wise weights name
        theirs)."""
        return self.codes()

    def dequantize(self) -> np.ndarray:
        """``codes * scales[:, None]`` as float32 ``(n, k)``."""
        return self.codes().astype(np.float32) * self.scales[:, None]


def quantize_weight(w: np.ndarray, bits: int) -> QuantizedWeight:
    """Quantize a float matrix ``(n, k)`` (output-channel-major) to int8 or int4.

    Symmetric per output channel with ``qmax = 2**(bits-1) - 1`` (127 or 7; the code -8 of
    int4 is never produced). An all-zero row gets scale 1.0 and zero codes.
    """
    if bits not in (4, 8):
        raise ConfigError(f"weight bits must be 4 or 8, got {bits}")
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_weight: expected a 2-D (n, k) matrix, got shape {w.shape}")
    qmax = (1 << (bits - 1)) - 1
    absmax = np.max(np.abs(w), axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    scales = np.where(absmax > 0, absmax / np.float32(qmax), np.float32(1.0)).astype(np.float32)
    codes = np.clip(np.rint(w / scales[:, None]), -qmax, qmax).astype(np.int8)
    data = codes.view(np.uint8) if bits == 8 else pack_int4(codes)
    return QuantizedWeight(bits, w.shape[0], w.shape[1], np.ascontiguousarray(data), scales)


def quantize_tensor(source: WeightSource, name: str, weight_bits: WeightBits) -> QuantizedWeight:
    """Tensor ``name`` of ``source`` quantized at the bits its role gets in ``weight_bits``
    (:meth:`WeightBits.bits_for`); the LM head is ``config.lm_head_tensor``."""
    spec = source.config.tensor_spec(name)
    if spec.kind != "matrix":
        raise ConfigError(f"tensor {name!r} is a vector ({spec.role}); only matrices are quantized")
    return quantize_weight(source.tensor(name), weight_bits.bits_for(spec.role))


# --- safetensors ----------------------------------------------------------------------------

#: safetensors dtypes read as weights (widened to float32; BF16 through ``ml_dtypes``).
SAFETENSORS_FLOAT_DTYPES = ("F32", "F16", "BF16")


def _safe_open(path: Path):
    """A ``safetensors`` handle (memory-mapped, header checked by the library: offsets,
    sizes, a truncated file); :class:`ConfigError` naming the file."""
    import ml_dtypes  # noqa: F401  (registers numpy's 'bfloat16' for BF16 tensors)
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="numpy")
    except FileNotFoundError:
        raise ConfigError(f"{path}: cannot read safetensors file: no such file") from None
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a valid safetensors file: {err}") from None


def _read_float(handle, path: Path, name: str) -> np.ndarray:
    dtype = handle.get_slice(name).get_dtype()
    if dtype not in SAFETENSORS_FLOAT_DTYPES:
        raise ConfigError(f"{path}: tensor {name!r} has dtype {dtype}; weights must be one of "
                          f"{', '.join(SAFETENSORS_FLOAT_DTYPES)}")
    return np.asarray(handle.get_tensor(name), dtype=np.float32)


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file, by its name in the file, as float32."""
    p = Path(path)
    h = _safe_open(p)
    return {name: _read_float(h, p, name) for name in h.keys()}


_ATTN_HF = {
    "q_proj": "self_attn.q_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_proj": "self_attn.k_proj.weight",
    "k_bias": "self_attn.k_proj.bias",
    "v_proj": "self_attn.v_proj.weight",
    "v_bias": "self_attn.v_proj.bias",
    "o_proj": "self_attn.o_proj.weight",
    "o_bias": "self_attn.o_proj.bias",
    "q_a_proj": "self_attn.q_a_proj.weight",
    "q_a_norm": "self_attn.q_a_layernorm.weight",
    "q_b_proj": "self_attn.q_b_proj.weight",
    "kv_a_proj": "self_attn.kv_a_proj_with_mqa.weight",
    "kv_a_norm": "self_attn.kv_a_layernorm.weight",
    "k_b_proj": "self_attn.kv_b_proj.weight",
    "v_b_proj": "self_attn.kv_b_proj.weight",
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "router": "mlp.gate.weight",
}
_GLOBAL_HF = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
              "lm_head": "lm_head.weight"}  # fmt: skip


#: Mixtral's names of an expert's SwiGLU matrices (``MixtralBlockSparseTop2MLP``: w1 gate,
#: w3 up, w2 down).
_MIXTRAL_EXPERT_HF = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def hf_tensor_name(name: str, *, family: str = "deepseek_v2") -> str:
    """The Hugging Face tensor holding kvsim tensor ``name`` (MLA's ``k_b_proj`` and
    ``v_b_proj`` are the two halves of each head's rows of ``kv_b_proj``). ``family``
    picks the MoE names: DeepSeek-V2 ``mlp.shared_experts``, Qwen2-MoE
    ``mlp.shared_expert`` and ``mlp.shared_expert_gate``, Mixtral ``block_sparse_moe``."""
    if name in _GLOBAL_HF:
        return _GLOBAL_HF[name]
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "layers" or not parts[1].isdigit():
        raise ConfigError(f"{name!r} is not a kvsim tensor name")
    _, layer, rest = parts
    prefix = f"model.layers.{layer}."
    if family == "mixtral" and (rest == "router" or rest.startswith("experts.")):
        if rest == "router":
            return prefix + "block_sparse_moe.gate.weight"
        _, e, mat = rest.split(".")
        return f"{prefix}block_sparse_moe.experts.{e}.{_MIXTRAL_EXPERT_HF[mat]}.weight"
    if family == GEMMA_FAMILY and rest in GEMMA_HF_NORMS:
        return prefix + GEMMA_HF_NORMS[rest]
    if rest in _ATTN_HF:
        return prefix + _ATTN_HF[rest]
    if rest.startswith("experts."):
        return prefix + "mlp." + rest + ".weight"
    if rest == "shared_gate":
        return prefix + "mlp.shared_expert_gate.weight"
    if rest.startswith("shared."):
        shared = "shared_expert." if family == "qwen2_moe" else "shared_experts."
        return prefix + "mlp." + shared + rest.split(".", 1)[1] + ".weight"
    return prefix + "mlp." + rest + ".weight"  # gate_proj, up_proj, down_proj


class SafetensorsWeights:
    """Real weights from one or more safetensors files (HF names), served by kvsim name.

    ``paths`` is a file, a directory (all its ``*.safetensors`` files, as sharded
    checkpoints are), or a list of files. Files are opened with the ``safetensors`` library
    (memory-mapped); every tensor ``config`` needs is checked up front (present, a float
    dtype, the right shape), then read on request and widened to float32.
    """

    def __init__(self, config: ModelConfig, paths: str | Path | Iterable[str | Path]):
        self.config = config
        if isinstance(paths, str | Path):
            p = Path(paths)
            files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
            if p.is_dir() and not files:
                raise ConfigError(f"{p}: no *.safetensors files in this directory")
        else:
            files = [Path(x) for x in paths]
        self._where: dict[str, tuple[Path, Any]] = {}
        for f in files:
            h = _safe_open(f)
            for name in h.keys():
                self._where[name] = (f, h)
        for spec in config.tensors():
            self._check(spec)

    def _check(self, spec: TensorSpec) -> None:
        hf = hf_tensor_name(spec.name, family=self.config.family)
        if hf not in self._where:
            raise ConfigError(f"weights: no tensor {hf!r} (for {spec.name!r}) in the "
                              f"safetensors files")
        path, h = self._where[hf]
        sl = h.get_slice(hf)
        if sl.get_dtype() not in SAFETENSORS_FLOAT_DTYPES:
            raise ConfigError(f"{path}: tensor {hf!r} has dtype {sl.get_dtype()}; weights must "
                              f"be one of {', '.join(SAFETENSORS_FLOAT_DTYPES)}")
        shape = tuple(sl.get_shape())
        want = self._file_shape(spec)
        if shape != want:
            raise ConfigError(f"{path}: tensor {hf!r} has shape {shape}; model expects {want} "
                              f"for {spec.name!r}")

    def _file_shape(self, spec: TensorSpec) -> tuple[int, ...]:
        leaf = spec.name.rsplit(".", 1)[-1]
        if leaf in ("k_b_proj", "v_b_proj"):
            c = self.config
            assert c.qk_nope_head_dim is not None and c.v_head_dim is not None
            assert c.kv_lora_rank is not None
            return (c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
        return spec.shape

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 of its spec's shape."""
        spec = self.config.tensor_spec(name)
        hf = hf_tensor_name(name, family=self.config.family)
        path, h = self._where[hf]
        arr = _read_float(h, path, hf)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("k_b_proj", "v_b_proj"):
            c = self.config
            assert c.qk_nope_head_dim is not None and c.v_head_dim is not None
            heads = arr.reshape(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, arr.shape[1])
            part = (
                heads[:, : c.qk_nope_head_dim]
                if leaf == "k_b_proj"
                else heads[:, c.qk_nope_head_dim :]
            )
            arr = np.ascontiguousarray(part.reshape(-1, arr.shape[1]))
        if spec.role == "norm" and self.config.norm_unit_offset:  # the gain is 1 + w
            arr = (arr + np.float32(1)).astype(np.float32)
        return arr.reshape(spec.shape)
