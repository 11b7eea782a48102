"""Writers of small model files for the loader tests: GGUF files (``gguf.GGUFWriter``) and
Hugging Face folders (``safetensors.numpy.save_file``), written from any weight source.

They write what llama.cpp's converter and ``transformers`` write: GGUF matrices ``(out,
in)`` with the llama Q/K rows permuted to the interleaved RoPE pairing, metadata under
``llama.*``; HF tensors under their ``model.layers.<i>...`` names, ``config.json`` with the
``LlamaConfig`` keys, optionally sharded with ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file

from models.config import ModelConfig, build_model
from models.gguf import gguf_tensor_name, permute_rope_rows
from models.weights import WeightSource, hf_tensor_name

#: A tiny llama model: GQA (4 query heads, 2 KV heads), tied embeddings, a byte vocabulary.
TINY_LLAMA = build_model({
    "name": "tiny-llama", "family": "llama", "num_layers": 2, "hidden_size": 64,
    "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 128,
    "vocab_size": 256, "rope_theta": 10000.0, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
})


def byte_tokens() -> list[str]:
    """The 256 byte-level BPE symbols (GPT-2's bytes-to-unicode map), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(
        range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write_gguf(path: Path, config: ModelConfig, weights: WeightSource, *,
               matrix_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q8_0,
               arch: str = "llama", skip: Iterable[str] = (),
               replace: dict[str, np.ndarray] | None = None,
               types: dict[str, gguf.GGMLQuantizationType] | None = None,
               tokens: list[str] | None = None, token_types: list[int] | None = None,
               meta: dict[str, Any] | None = None,
               edit: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    """A GGUF file of ``weights`` (kvsim names in; GGUF names and layout out).

    ``skip``/``replace``/``types`` act on GGUF tensor names (leave out, replace the array,
    force a type); ``token_types`` gives llama.cpp's type of each token (3: control);
    ``meta`` adds or overrides ``llama.*``-style keys (``None`` drops one)."""
    w = gguf.GGUFWriter(path, arch)
    c = config
    keys: dict[str, Any] = {
        f"{arch}.block_count": c.num_layers, f"{arch}.context_length": c.max_position_embeddings,
        f"{arch}.embedding_length": c.hidden_size,
        f"{arch}.feed_forward_length": c.intermediate_size,
        f"{arch}.attention.head_count": c.num_heads,
        f"{arch}.attention.head_count_kv": c.num_kv_heads,
        f"{arch}.rope.freq_base": float(c.rope_theta),
        f"{arch}.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
    }
    keys.update(meta or {})
    for k, v in keys.items():
        if v is None:
            continue
        if isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, int(v))
    toks = tokens if tokens is not None else byte_tokens()[: c.vocab_size]
    if toks:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(toks)
        w.add_token_types(token_types or [1] * len(toks))
        w.add_token_merges([])
    skip, replace, types = set(skip), replace or {}, types or {}
    for spec in c.tensors():
        name = gguf_tensor_name(spec.name)
        if name in skip:
            continue
        arr = replace.get(name, weights.tensor(spec.name)).astype(np.float32)
        leaf = spec.name.rsplit(".", 1)[-1]
        if arch == "llama" and leaf == "q_proj":
            arr = permute_rope_rows(arr, c.num_heads)
        elif arch == "llama" and leaf == "k_proj":
            arr = permute_rope_rows(arr, c.num_kv_heads)
        qtype = types.get(name, matrix_type if arr.ndim == 2 else gguf.GGMLQuantizationType.F32)
        if qtype == gguf.GGMLQuantizationType.I32:
            w.add_tensor(name, arr.astype(np.int32))
        elif qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, gguf.quants.quantize(arr, qtype))
        else:
            q = gguf.quants.quantize(arr, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
    if edit is not None:
        edit(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_config_json(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` of a llama ``config`` (``LlamaConfig`` keys)."""
    c = config
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
        "vocab_size": c.vocab_size, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings, "hidden_act": "silu",
    }


def write_hf_folder(folder: Path, config: ModelConfig, weights: WeightSource, *,
                    shards: int = 1, config_json: dict[str, Any] | None = None,
                    skip: Iterable[str] = ()) -> Path:
    """A HF folder of ``weights`` as float32 safetensors; ``shards > 1`` splits the tensors
    by layer over that many files with a ``model.safetensors.index.json``. Tensors are
    written one shard at a time (a 135M model is never held whole)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json or hf_config_json(config)))
    skip = set(skip)
    groups: list[list[str]] = [[] for _ in range(shards)]
    for spec in config.tensors():
        layer = int(spec.name.split(".")[1]) if spec.name.startswith("layers.") else -1
        groups[(layer + 1) % shards].append(spec.name)
    wmap: dict[str, str] = {}
    for i, names in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}" \
            ".safetensors"
        tensors = {hf_tensor_name(n): np.ascontiguousarray(weights.tensor(n)) for n in names}
        tensors = {k: v for k, v in tensors.items() if k not in skip}
        save_file(tensors, str(folder / file))
        wmap.update({k: file for k in tensors})
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": wmap}))
    return folder
