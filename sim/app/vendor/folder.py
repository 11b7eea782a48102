"""A model folder in the vendor's format, whose ``.mxq`` is a kvsim compiled model: what
``transformers-mblt``'s ``from_pretrained`` loads and the vendor's TPS harness measures.

The vendor's model folders (``mobilint/*`` on the Hugging Face Hub; made by its
``prepare_model.py``) hold a Hugging Face ``config.json`` with the NPU fields added
(``model_type`` ``mobilint-llama``, ``architectures``, ``mxq_path`` relative to the folder,
the core mode and targets), the host's embedding table as safetensors (token embedding
runs on the host), and the tokenizer files. :func:`write_folder` writes the same with
``mxq_path`` naming a ``.kvm`` compiled here:

- ``<name>.kvm``: the compiled model (``kvsim compile``'s file);
- ``config.json``: the architecture in Hugging Face keys, the NPU fields, and ``kvsim``
  (how the model was compiled);
- ``model.safetensors``: ``embed_tokens.weight``, the embedding table the card expects
  (rotated where the numerics rotate the residual stream; float32);
- ``proxy_llama.py`` (``auto_map``): the module ``trust_remote_code=True`` loads, which takes
  the classes from the installed transformers-mblt, as the Hub folders' proxies do;
- ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``: the model's
  tokenizer (SmolLM2's: built from its GGUF by the ``tokenizers`` library) and chat
  template; ``generation_config.json``: the BOS/EOS ids.

A model with synthetic weights gets a synthetic tokenizer (token ``i`` is ``<t{i}>``, the
last one is its end-of-sequence) and, timing-only, its synthetic embedding in float16
(the card computes no values then; the file is half the size).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import ConfigError

#: kvsim model families -> the vendor's model type, its module in transformers-mblt 0.6.1
#: (``transformers_mblt.models.<module>``) and its config and model classes
VENDOR_TYPES = {"llama": ("mobilint-llama", "llama", "MobilintLlamaConfig",
                          "MobilintLlamaForCausalLM"),
                "qwen2": ("mobilint-qwen2", "qwen2", "MobilintQwen2Config",
                          "MobilintQwen2ForCausalLM")}
#: the vendor's default prefill chunk (transformers-mblt ``_DEFAULT_PREFILL_CHUNK_SIZE``)
VENDOR_CHUNK = 128


@dataclass(frozen=True)
class Folder:
    path: Path
    kvm: Path
    model: str
    real_weights: bool
    functional: bool
    max_seq: int
    cap: int
    core_mode: str


def _hf_fields(cfg: Any) -> dict[str, Any]:
    out = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
           "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
           "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"}
    if cfg.rope_scaling is not None:
        out["rope_scaling"] = cfg.rope_scaling.model_dump(exclude_none=True)
    return out


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=1) + "\n"


def _tokenizer_files(src: Any, vocab: int,
                     cap: int) -> tuple[dict[str, str], int | None, int | None]:
    """The tokenizer files by name, and (bos_id, eos_id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    if src.real:
        tok = src.tokenizer()
        backend, bos, eos, template = tok.backend, tok.bos_id, tok.eos_id, tok.chat_template
    else:  # synthetic weights: a synthetic vocabulary, one word per token id
        words = {f"<t{i}>": i for i in range(vocab)}
        backend = Tokenizer(models.WordLevel(words, unk_token=f"<t{vocab - 1}>"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        bos, eos, template = None, vocab - 1, None

    def name(i: int | None) -> str | None:
        return None if i is None else backend.id_to_token(i)

    special = {k: v for k, v in (("bos_token", name(bos)), ("eos_token", name(eos)),
                                 ("pad_token", name(eos))) if v is not None}
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
          "add_eos_token": False, "clean_up_tokenization_spaces": False,
          "model_max_length": cap, **special}
    if template:
        tc["chat_template"] = template
    files = {"tokenizer.json": backend.to_str(pretty=True),  # as Tokenizer.save writes it
             "tokenizer_config.json": _json(tc), "special_tokens_map.json": _json(special)}
    return files, bos, eos


def _proxy(module: str, config_cls: str, arch: str) -> str:
    """The folder's remote-code module (``auto_map``), as the vendor's Hub folders carry one
    for loading with ``trust_remote_code=True`` (its TPS harness loads so): it only takes
    the classes from the installed transformers-mblt."""
    return (f'"""The {config_cls} / {arch} classes of this folder\'s model type, from the\n'
            f'installed transformers-mblt (written by kvsim vendor folder)."""\n\n'
            f"from transformers_mblt.models.{module}.configuration_{module} import "
            f"{config_cls}\n"
            f"from transformers_mblt.models.{module}.modeling_{module} import {arch}\n\n"
            f'__all__ = ["{config_cls}", "{arch}"]\n')


#: Every file of a folder's set but its ``.kvm`` (named after the model): an earlier
#: folder's that the new one lacks goes.
FOLDER_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json",
                *(f"proxy_{module}.py" for _, module, _, _ in VENDOR_TYPES.values()),
                "generation_config.json", "config.json")


def _numerics_name(opts: Any) -> Any:
    from models.bits import NUMERICS_PRESETS

    return next((k for k, v in NUMERICS_PRESETS.items() if v == opts), opts.model_dump())


def write_folder(model: str, out: str | Path, *, bits: str = "W8", numerics: str | None = None,
                 kv: str = "int8", hw: str = "aries", core_mode: str | None = None,
                 max_seq: int = VENDOR_CHUNK, cap: int = 2048, slots: int = 1,
                 timing_only: bool = False, seed: int = 0) -> Folder:
    """Compile ``model`` (any name kvsim takes) and write its vendor-format folder into
    ``out`` (created; its files replaced as one set, whole or not at all: a failure is a
    :class:`kvsim.errors.OutputError`). ``max_seq`` is the prefill chunk of one request
    (``npu_prefill_chunk_size``); a model of several cache ``slots`` takes that many chunks
    in one call."""
    from safetensors.numpy import save

    from kvsim.files import check_out_folder, write_output_set
    from models.compiler.kvm import kvm_bytes
    from models.source import resolve_model
    from sim.app.quality import bit_config
    from sim.runtime.ready import hardware_of, ready_model, widest_core_mode

    check_out_folder(out, "--out")  # before the work
    src = resolve_model(model, where="--model")
    cfg = src.config
    if cfg.family not in VENDOR_TYPES:
        raise ConfigError(f"--model: {cfg.name!r} is a {cfg.family} model; the vendor "
                          f"folder is written for {', '.join(VENDOR_TYPES)} models")
    hwc = hardware_of(hw)
    mode = core_mode or widest_core_mode(hwc)
    bc = bit_config(bits, numerics=numerics, real_weights=src.real)
    # transformers-mblt sends a batch's chunks (``npu_prefill_chunk_size`` tokens per
    # request) in one call: the input buffer holds one chunk per cache slot
    cm = ready_model(src, hwc, bits=bc, kv=kv, core_mode=mode, max_seq=max_seq * slots,
                     cap=cap, slots=slots, functional=not timing_only, seed=seed).compiled
    folder = Path(out)
    stem = Path(cfg.name or "model").name.replace("/", "_")
    kvm = folder / f"{stem}.kvm"
    # the table the card expects; a timing-only card reads no values (unrotated, float16)
    if timing_only:
        table = src.open_weights(seed).tensor("embed").astype(np.float16)
    else:
        table = np.ascontiguousarray(cm.weight_source().tensor("embed"), dtype=np.float32)
    files: dict[str, str | bytes] = {
        kvm.name: kvm_bytes(cm),
        "model.safetensors": save({"embed_tokens.weight": table}, metadata={"format": "pt"})}
    tok_files, bos, eos = _tokenizer_files(src, cfg.vocab_size, cap)
    files.update(tok_files)
    model_type, module, config_cls, arch = VENDOR_TYPES[cfg.family]
    files[f"proxy_{module}.py"] = _proxy(module, config_cls, arch)
    vendor_mode = {"single": "single", "global4": "global4", "global8": "global8"}[mode]
    conf = {"architectures": [arch], "model_type": model_type, "mxq_path": kvm.name,
            "auto_map": {"AutoConfig": f"proxy_{module}.{config_cls}",
                         "AutoModel": f"proxy_{module}.{arch}",
                         "AutoModelForCausalLM": f"proxy_{module}.{arch}"},
            "target_device": "regulus-ra" if hwc.name.startswith("regulus") else "aries-rb",
            "core_mode": vendor_mode, "max_batch_size": slots,
            "npu_prefill_chunk_size": max_seq, **_hf_fields(cfg),
            "bos_token_id": bos, "eos_token_id": eos,
            "kvsim": {"model": model, "bits": bits, "numerics": _numerics_name(bc.numerics),
                      "kv": kv, "hw": hwc.name, "core_mode": mode, "max_seq": max_seq,
                      "cache_length": cap, "cache_slots": slots,
                      "functional": not timing_only, "real_weights": src.real,
                      "seed": seed}}
    if mode == "single":
        conf["target_cores"] = ["0:0:0"]
    files["generation_config.json"] = _json(
        {k: v for k, v in (("bos_token_id", bos), ("eos_token_id", eos),
                           ("pad_token_id", eos)) if v is not None})
    files["config.json"] = _json(conf)  # last: it names the others
    # one set, whole or not at all (kvsim.files.write_output_set)
    write_output_set(folder, files, flag="--out", members=FOLDER_FILES)
    return Folder(folder, kvm, model, src.real, not timing_only, max_seq, cap, mode)


__all__ = ["FOLDER_FILES", "VENDOR_CHUNK", "VENDOR_TYPES", "Folder", "write_folder"]
