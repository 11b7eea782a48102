"""Checks of a run config beyond its schema, without running it (``kvsim check``, and every
sweep point before a sweep starts): the model, weight bits and KV format resolve, the KV
format suits the model, the core mode fits the hardware, the cache holds the workload, the
compiled model fits the DRAM. Each problem is a :class:`ConfigError` naming the field.

What only compiling finds (a model that does not fit the SRAM even one token at a time)
is left to the run: the check stays fast (no lowering).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isa import kvformats
from kvsim.errors import ConfigError, KvsimError
from models.bits import BitConfig
from models.compiler.blocks.mla import mla_kv_problem
from models.compiler.blocks.moe_calib import moe_problem
from models.compiler.compiled import CORE_MODES, build_memory_map, dram_problem
from models.config import ModelConfig
from models.source import ModelSource, load_model, resolve_model
from sim.app.config import ModelOnHardware, RunConfig, cache_length
from sim.app.spec_config import check_speculate_model

GIB = 2**30


@dataclass(frozen=True)
class Checked:
    """What a valid config resolves to, and a one-line summary of it."""

    summary: str
    dram_bytes: int = 0
    cache_length: int = 0
    #: the config as checked: a prompt text's real token count in ``workload.prompt_tokens``
    config: RunConfig | None = None
    prompt_ids: list[int] | None = None  # the prompt text's tokens (None without a text)
    tokenizer: Any = None  # the model's tokenizer, when a prompt text was tokenized


def _name(model: ModelConfig) -> str:
    return model.name or model.family


def run_source(cfg: ModelOnHardware) -> ModelSource:
    """The model of a run (or serving) config, resolved: ``model.preset`` by any name
    :func:`models.source.resolve_model` takes (a real model's files are checked here), or
    ``model.hf_config``, an architecture alone (synthetic weights)."""
    m = cfg.model
    if m.hf_config is not None:
        p = Path(m.hf_config)
        if not (p / "config.json" if p.is_dir() else p).is_file():
            from models.source import hub_id_hint

            missing = f"file {m.hf_config!r} does not exist"
            raise ConfigError(f"model.hf_config: {hub_id_hint(m.hf_config) or missing}")
        try:
            config = load_model(p, where="model.hf_config")
        except ConfigError as err:
            raise ConfigError(f"model.hf_config: {err}") from None
        return ModelSource(config.name, "config", config, None, p)
    assert m.preset is not None  # the schema asks for exactly one of them
    return resolve_model(m.preset, where="model")


def _bits(cfg: RunConfig) -> BitConfig:
    return cfg.bits.bit_config(cfg.kv)


def _check_generate(cfg: RunConfig, source: ModelSource | None) -> Checked:
    hw, w, c = cfg.hardware, cfg.workload, cfg.compile
    if cfg.model.safetensors is not None and not Path(cfg.model.safetensors).exists():
        raise ConfigError(f"model.safetensors: {cfg.model.safetensors!r} does not exist")
    model = (run_source(cfg) if source is None else source).config
    bits = _bits(cfg)
    need_cores = CORE_MODES[c.core_mode]
    if need_cores > hw.cores.num_cores:
        raise ConfigError(f"compile.core_mode: {c.core_mode!r} needs {need_cores} cores; "
                          f"{hw.name} has {hw.cores.num_cores}")
    # the last token is not fed back
    fed = w.context_tokens + w.prompt_tokens + max(w.output_tokens - 1, 0)
    ctx = f"context_tokens {w.context_tokens} + " if w.context_tokens else ""
    # a prompt text has been tokenized (check_run): prompt_tokens is its real count
    prompt = (f"the prompt text's {w.prompt_tokens} tokens" if w.prompt is not None
              else f"prompt_tokens {w.prompt_tokens}")
    feeds = f"{ctx}{prompt} + output_tokens {w.output_tokens} - 1"
    if fed > model.max_position_embeddings:
        field = ("context_tokens" if w.context_tokens else
                 "prompt" if w.prompt is not None else "prompt_tokens")
        raise ConfigError(f"workload.{field}: {feeds} = {fed} tokens exceed the "
                          f"max_position_embeddings ({model.max_position_embeddings}) of "
                          f"model {_name(model)!r}")
    cap = cache_length(cfg)
    if cap < fed:
        raise ConfigError(f"compile.cache_length: {cap} tokens cannot hold the {fed} tokens "
                          f"the workload feeds ({feeds})")
    try:
        pair = kvformats.pair(cfg.kv.format)
    except KvsimError as err:
        raise ConfigError(f"kv.format: {err}") from None
    if not model.is_mla and (pair.k.rope_width or pair.v.rope_width):
        raise ConfigError(f"kv.format: {cfg.kv.format!r} is a format for MLA models (latent "
                          f"+ RoPE key records); model {_name(model)!r} has grouped-query "
                          f"attention")
    if model.is_mla:
        problem = mla_kv_problem(model, cfg.kv.format)
        if problem:
            raise ConfigError(f"kv.format: {problem}")
    if cfg.sim.fidelity == "functional" and model.is_moe and (why := moe_problem(model)):
        raise ConfigError(f"sim.fidelity: model {_name(model)!r}: {why}")
    max_seq = min(c.max_sequence_length, cap)

    try:
        why = dram_problem(model, bits, cfg.kv.format, cap=cap, slots=c.cache_slots,
                           max_seq=max_seq, dram_bytes=hw.dram.capacity_bytes, hw_name=hw.name)
        if why is None:
            mm = build_memory_map(model, bits, cfg.kv.format, cap=cap, slots=c.cache_slots,
                                  max_seq=max_seq, m_tile=1)
    except KvsimError as err:
        raise ConfigError(f"kv.format: {err}") from None
    if why is not None:
        raise ConfigError(f"hardware.dram.capacity_bytes: model {_name(model)!r} with a cache "
                          f"of {cap} tokens x {c.cache_slots} slot(s) {why}")
    check_speculate_model(cfg, model)
    total = mm.total_bytes
    ops = len(w.cache_ops)
    summary = (
        f"{_name(model)} {cfg.bits.label} kv={cfg.kv.format} on {hw.name} ({c.core_mode}): "
        + (f"context {w.context_tokens} + " if w.context_tokens else "")
        + f"prefill {'a prompt text' if w.prompt else w.prompt_tokens} + decode "
        f"{w.output_tokens} tokens, {cfg.sim.fidelity}; "
        f"cache {cap} tokens; DRAM {total / GIB:.2f} of {hw.dram.capacity_bytes / GIB:.2f} "
        f"GiB (weights {mm.bytes_of_kind('weights') / 1e6:,.1f} MB, KV cache "
        f"{mm.bytes_of_kind('kv_cache') / 1e6:,.1f} MB)"
        + (f"; {ops} cache op{'s' if ops != 1 else ''}" if ops else "")
        + (f"; speculative decoding {cfg.speculate.spec().text()}" if cfg.speculate else "")
    )
    return Checked(summary, total, cap)


def _check_gemv(cfg: RunConfig) -> Checked:
    from models.demo import gemv_layer

    hw, w = cfg.hardware, cfg.workload
    try:
        layer = gemv_layer(k=w.k, n=w.n, w_bits=w.w_bits, num_cores=hw.cores.num_cores,
                           sram_bytes=hw.sram.bytes_per_core, dram_bytes=hw.dram.capacity_bytes,
                           host_bytes=hw.host.memory_bytes, tile_bytes=w.tile_bytes)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"workload: {err}") from None
    return Checked(f"gemv {w.n} x {w.k} at {w.w_bits} bits on {hw.name}: "
                   f"{len(layer.program):,} instructions, {cfg.sim.fidelity}")


def check_run(cfg: RunConfig, source: ModelSource | None = None) -> Checked:
    """Everything about ``cfg`` that can be known without compiling or running it
    (``source``: its model, already resolved by :func:`run_source`). A prompt text
    (``workload.prompt``) is tokenized first, so the context, cache and DRAM checks see its
    real token count; :attr:`Checked.config` is the config so resolved."""
    if cfg.workload.kind == "gemv":
        return _check_gemv(cfg)
    from sim.app.run_text import with_prompt

    # the model is resolved (an unknown or bad one named) before its tokenizer is asked for
    src = run_source(cfg) if source is None else source
    cfg, ids, tok = with_prompt(cfg, src)
    checked = _check_generate(cfg, src)
    return Checked(checked.summary, checked.dram_bytes, checked.cache_length, cfg, ids, tok)
