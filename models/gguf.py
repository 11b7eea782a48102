"""GGUF files (the llama.cpp ecosystem): architecture, float weights and tokenizer.

A GGUF file holds metadata (``general.architecture``, ``<arch>.block_count``, ...,
``tokenizer.ggml.*``) and tensors, quantized or not, named ``token_embd.weight``,
``blk.<i>.attn_q.weight`` and so on. It is read with the ``gguf`` package (the llama.cpp
project's own reader, memory-mapped: a tensor's bytes are read when it is asked for) and
every tensor is dequantized to float32 with ``gguf.quants.dequantize``.

Layout facts (llama.cpp's ``convert_hf_to_gguf.py``):

- matrices keep PyTorch's ``(out, in)`` row order; GGUF lists dimensions innermost first,
  so the reader's reversed shape is ``(out, in)``;
- for the ``llama`` architecture the converter permutes the rows of ``attn_q`` and
  ``attn_k`` within every head from Hugging Face's half-split RoPE pairing ``(i, i + d/2)``
  to the interleaved pairing ``(2i, 2i + 1)``: rows ``[h, s, j]`` (``s`` in {0, 1}, ``j`` <
  ``d/2``) are stored at ``[h, j, s]``. kvsim's reference rotates halves, as HF does, so
  :class:`GGUFWeights` undoes the permutation (:func:`unpermute_rope_rows`);
- a model with tied embeddings has no ``output.weight``.

:func:`open_gguf` checks the whole file before anything is used: metadata, every tensor's
name, type, shape and that its bytes lie inside the file, so a bad file is refused with one
:class:`~kvsim.errors.ConfigError` naming it, and nothing is half-loaded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import ConfigError

from .config import ModelConfig, build_model

#: GGUF architectures kvsim maps to a model family (``general.architecture``).
GGUF_ARCHITECTURES: dict[str, str] = {"llama": "llama", "qwen2": "qwen2"}
#: Tensor types read as weights; each is dequantized by ``gguf.quants.dequantize``.
GGUF_TENSOR_TYPES: tuple[str, ...] = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip
#: Architectures whose converter permutes the Q/K rows (``LlamaModel.permute``).
_PERMUTED_ARCHS = ("llama",)

_GLOBAL = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
           "lm_head": "output.weight"}  # fmt: skip
_LAYER = {
    "attn_norm": "attn_norm.weight",
    "q_proj": "attn_q.weight",
    "q_bias": "attn_q.bias",
    "k_proj": "attn_k.weight",
    "k_bias": "attn_k.bias",
    "v_proj": "attn_v.weight",
    "v_bias": "attn_v.bias",
    "o_proj": "attn_output.weight",
    "o_bias": "attn_output.bias",
    "mlp_norm": "ffn_norm.weight",
    "gate_proj": "ffn_gate.weight",
    "up_proj": "ffn_up.weight",
    "down_proj": "ffn_down.weight",
}


def gguf_tensor_name(name: str) -> str:
    """The GGUF tensor holding kvsim tensor ``name`` (``layers.3.q_proj`` ->
    ``blk.3.attn_q.weight``)."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in _LAYER:
        return f"blk.{parts[1]}.{_LAYER[parts[2]]}"
    raise ConfigError(f"{name!r}: no GGUF tensor for this kvsim tensor")


def unpermute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: GGUF rows ``[h, j, s]`` back to HF ``[h, s, j]``
    (``w`` is ``(heads * head_dim, ...)``; a bias vector works too)."""
    d = w.shape[0] // heads
    return np.ascontiguousarray(
        w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation (HF ``[h, s, j]`` -> GGUF ``[h, j, s]``), the inverse of
    :func:`unpermute_rope_rows` (for writing test files)."""
    d = w.shape[0] // heads
    return np.ascontiguousarray(
        w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _f32(v: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (GGUF stores
    ``rms_norm_eps = 1e-5`` as float32 9.99999975e-06; HF's config.json says 1e-05)."""
    return float(str(np.float32(v)))


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    if len(f.types) > 1 or (f.types and f.types[0].name == "ARRAY"):
        return list(f.contents())
    return f.contents()


@dataclass(frozen=True)
class GGUFFile:
    """An opened, checked GGUF file: its reader, architecture, model config and tensors."""

    path: Path
    reader: Any  # gguf.GGUFReader (memory-mapped)
    arch: str
    config: ModelConfig
    tensors: dict[str, Any]  # GGUF name -> gguf ReaderTensor

    def metadata(self, key: str) -> Any:
        """A metadata value (scalar, string or list), ``None`` if absent."""
        return _field(self.reader, key)


def _reader(path: Path) -> Any:
    import gguf

    try:
        size = path.stat().st_size
    except OSError as err:
        raise ConfigError(f"{path}: cannot read GGUF file: {err.strerror or err}") from None
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ConfigError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError,
            MemoryError):
        # the reader's own exception is numpy's (an index, a dtype view, a reshape) and says
        # nothing about the file: say what is wrong with it instead
        raise ConfigError(f"{path}: unreadable GGUF file (truncated or corrupt): it ends or "
                          f"breaks inside its header, metadata or tensor index (the file has "
                          f"{size:,} bytes)") from None
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ConfigError(
                f"{path}: truncated: tensor {t.name!r} needs bytes up to "
                f"{t.data_offset + t.n_bytes}, the file has {size}"
            )
    return reader


def _config(reader: Any, path: Path, tensors: dict[str, Any], name: str) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ConfigError(
            f"{path}: unsupported architecture {arch!r}; supported: "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )
    keys = {
        "num_layers": "block_count",
        "hidden_size": "embedding_length",
        "num_heads": "attention.head_count",
        "intermediate_size": "feed_forward_length",
        "rms_norm_eps": "attention.layer_norm_rms_epsilon",
        "max_position_embeddings": "context_length",
    }
    vals = {k: _field(reader, f"{arch}.{v}") for k, v in keys.items()}
    missing = [f"{arch}.{keys[k]}" for k, v in vals.items() if v is None]
    if missing:
        raise ConfigError(f"{path}: metadata lacks {', '.join(missing)}")
    try:
        return _build_config(reader, path, tensors, name, arch, vals)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError) as err:  # a string where a number belongs
        raise ConfigError(f"{path}: bad {arch}.* metadata value: {err}") from None


def _build_config(reader: Any, path: Path, tensors: dict[str, Any], name: str, arch: str,
                  vals: dict[str, Any]) -> ModelConfig:
    heads = int(vals["num_heads"])
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv")
    head_dim = _field(reader, f"{arch}.attention.key_length")
    if head_dim is None and heads > 0:
        head_dim = int(vals["hidden_size"]) // heads
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ConfigError(f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported")
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise ConfigError(f"{path}: missing tensor 'token_embd.weight'")
    rows = int(embed.shape[-1])  # GGUF dims are innermost first: (hidden, vocab)
    for key, n in (("tokenizer.ggml.tokens", None), (f"{arch}.vocab_size", None)):
        f = reader.fields.get(key)
        if f is None:
            continue
        n = len(f.data) if key.endswith("tokens") else int(f.contents())
        if n != rows:
            raise ConfigError(
                f"{path}: vocabulary disagrees with the weights: {key} gives {n} tokens, "
                f"token_embd.weight has {rows} rows"
            )
    data: dict[str, Any] = {
        "name": name,
        "family": GGUF_ARCHITECTURES[arch],
        "num_layers": int(vals["num_layers"]),
        "hidden_size": int(vals["hidden_size"]),
        "num_heads": heads,
        "num_kv_heads": int(kv_heads) if kv_heads is not None else heads,
        "head_dim": int(head_dim) if head_dim is not None else 1,
        "intermediate_size": int(vals["intermediate_size"]),
        "vocab_size": rows,
        "rope_theta": _f32(_field(reader, f"{arch}.rope.freq_base") or 10000.0),
        "max_position_embeddings": int(vals["max_position_embeddings"]),
        "rms_norm_eps": _f32(vals["rms_norm_eps"]),
        "tie_word_embeddings": "output.weight" not in tensors,
        "qkv_bias": "blk.0.attn_q.bias" in tensors,
        "o_bias": "blk.0.attn_output.bias" in tensors,
    }
    return build_model(data, where=f"{path}: model")


def _check_tensors(p: Path, tensors: dict[str, Any], cfg: ModelConfig) -> None:
    for spec in cfg.tensors():
        gname = gguf_tensor_name(spec.name)
        t = tensors.get(gname)
        if t is None:
            raise ConfigError(f"{p}: missing tensor {gname!r} (for {spec.name!r})")
        if t.tensor_type.name not in GGUF_TENSOR_TYPES:
            raise ConfigError(
                f"{p}: tensor {gname!r} has unsupported type {t.tensor_type.name}; "
                f"supported: {', '.join(GGUF_TENSOR_TYPES)}"
            )
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if shape != spec.shape:
            raise ConfigError(
                f"{p}: tensor {gname!r} has shape {shape}; the model expects {spec.shape}"
            )


def open_gguf(path: str | Path, *, name: str | None = None) -> GGUFFile:
    """Open and check a GGUF file: every tensor the model needs is present, of a supported
    type and of the shape the metadata implies. :class:`ConfigError` naming the file.

    The ``gguf`` reader parses every metadata field in Python (a 49,152-token vocabulary
    takes seconds), so the last few files opened are kept, keyed by path, size and
    modification time: a file changed on disk is opened again."""
    p = Path(path)
    try:
        st = p.resolve().stat()
    except OSError as err:
        raise ConfigError(f"{p}: cannot read GGUF file: {err.strerror or err}") from None
    f = _open_cached(str(p.resolve()), st.st_size, st.st_mtime_ns)
    if name is not None and name != f.config.name:
        f = GGUFFile(f.path, f.reader, f.arch, f.config.model_copy(update={"name": name}),
                     f.tensors)
    return f


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, size: int, mtime_ns: int) -> GGUFFile:
    del size, mtime_ns  # part of the cache key only
    p = Path(path)
    reader = _reader(p)
    tensors = {t.name: t for t in reader.tensors}
    cfg = _config(reader, p, tensors, p.stem)
    _check_tensors(p, tensors, cfg)
    arch = str(_field(reader, "general.architecture"))
    return GGUFFile(p, reader, arch, cfg, tensors)


class GGUFWeights:
    """Float32 weights of a GGUF file by kvsim name, dequantized per request (HF layout:
    llama Q/K rows un-permuted). Nothing is cached; the file stays memory-mapped."""

    def __init__(self, config: ModelConfig, path: str | Path):
        self.file = open_gguf(path, name=config.name)
        if config != self.file.config:  # e.g. fewer layers: check what this config needs
            _check_tensors(self.file.path, self.file.tensors, config)
        self.config = config

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 of its spec's shape."""
        from gguf.quants import dequantize

        spec = self.config.tensor_spec(name)
        t = self.file.tensors[gguf_tensor_name(name)]
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(spec.shape)
        if self.file.arch in _PERMUTED_ARCHS:
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("q_proj", "q_bias"):
                arr = unpermute_rope_rows(arr, self.config.num_heads)
            elif leaf in ("k_proj", "k_bias"):
                arr = unpermute_rope_rows(arr, self.config.num_kv_heads)
        return np.ascontiguousarray(arr, dtype=np.float32)


def gguf_tokenizer(file: GGUFFile):  # -> models.tokenizer.Tokenizer
    """The tokenizer of an opened GGUF file (vocabulary, merges, special tokens, chat
    template)."""
    from .tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(file.metadata, file.path)
