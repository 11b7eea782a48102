"""One way to get a ready model: name it, compile it, load it onto a card.

:func:`ready_model` resolves a model's name (:func:`models.source.resolve_model`; a
:class:`~models.source.ModelSource` already resolved is taken as it is), compiles it for a
hardware preset (:func:`models.compiler.compile_model`; the compiled model is kept, so the
same build asked for again is not compiled again) and returns a :class:`ReadyModel`, whose
:meth:`~ReadyModel.launch` loads it onto a simulated card (weights over the host link) and
whose :meth:`~ReadyModel.embed` is the host's embedding lookup. Runs, quality, text
generation, serving, calibration, the command line and :func:`sim.runtime.load` all get
their models here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from models.bits import BitConfig, default_numerics
from models.compiler import CORE_MODES, CompiledModel, HardwareTarget, compile_model
from models.config import ModelConfig as Architecture
from models.reference import embed_rows
from models.source import ModelSource, resolve_model
from sim.device.hw import HardwareConfig, load_hardware
from sim.runtime.accelerator import Accelerator
from sim.runtime.model import Model
from sim.runtime.types import ModelConfig
from traces.recorder import Recorder

#: How many compiled models :func:`ready_model` keeps (the newest; each holds its integer
#: parameters and its lowering memo: a few MB for the tiny models, tens for Qwen2.5-0.5B).
COMPILED_KEPT = 2
#: build key -> compiled model, oldest first.
_COMPILED: dict[tuple, CompiledModel] = {}


def source_of(model: str | Path | ModelSource | Architecture, *,
              where: str = "model") -> ModelSource:
    """``model`` resolved (:func:`models.source.resolve_model`), as it is when it is a
    :class:`ModelSource` already, or an architecture alone (a
    :class:`models.config.ModelConfig`: synthetic weights)."""
    if isinstance(model, ModelSource):
        return model
    if isinstance(model, Architecture):
        return ModelSource(model.name, "config", model)
    return resolve_model(model, where=where)


def hardware_of(hw: str | HardwareConfig) -> HardwareConfig:
    """A hardware preset by name, or the config as it is."""
    return load_hardware(hw) if isinstance(hw, str) else hw


def widest_core_mode(hw: HardwareConfig) -> str:
    """The core mode that uses the most of ``hw``'s cores."""
    return max((m for m, n in CORE_MODES.items() if n <= hw.cores.num_cores),
               key=CORE_MODES.__getitem__)


def weights_key(spec: dict[str, Any]) -> tuple:
    """What a model's weights are, for a cache key: the spec and each weight file's size
    and modification time (a file rewritten in place is another model)."""
    files = [spec["path"]] if "path" in spec else list(spec.get("paths", ()))
    stamps = tuple((str(f), Path(f).stat().st_size, Path(f).stat().st_mtime_ns)
                   for f in files)
    return json.dumps(spec, sort_keys=True, default=str), stamps


@dataclass(frozen=True)
class ReadyModel:
    """A resolved, compiled model and the hardware it was compiled for."""

    source: ModelSource
    hw: HardwareConfig
    compiled: CompiledModel
    functional: bool  # integer parameters calibrated: the card computes every result

    def launch(self, config: ModelConfig | None = None, *, acc: Accelerator | None = None,
               recorder: Recorder | None = None) -> Model:
        """The model loaded onto ``acc`` (default: a new card of :attr:`hw`, functional
        when the model was compiled so, recording to ``recorder``): its memory map, then
        its weights over the host link."""
        if acc is None:
            acc = Accelerator(hw=self.hw, functional=self.functional, recorder=recorder)
        model = Model(self.compiled, config)
        model.launch(acc)
        return model

    @cached_property
    def embedding_table(self) -> np.ndarray:
        """The embedding matrix as the host holds it (the device's basis: rotated when the
        numerics rotate the residual stream), read once."""
        return self.compiled.weight_source().tensor("embed")

    def embed(self, tokens: np.ndarray | list[int]) -> np.ndarray:
        """The host's float32 embeddings of ``tokens``, what ``infer`` takes
        (:func:`models.reference.embed_rows`: with the model's embedding scale)."""
        return embed_rows(self.compiled.model, self.embedding_table, tokens)


def ready_model(model: str | Path | ModelSource | Architecture,
                hw: str | HardwareConfig = "aries", *,
                bits: BitConfig | None = None, kv: str = "int8", core_mode: str | None = None,
                max_seq: int = 512, cap: int = 4096, slots: int = 1,
                tile_bytes: int | None = None, functional: bool = True, seed: int = 0,
                weights: dict[str, Any] | None = None,
                store_programs: bool = False) -> ReadyModel:
    """``model`` (a name :func:`models.source.resolve_model` takes, a source, or an
    architecture with synthetic weights: :func:`source_of`) compiled
    for ``hw``: weight bits and numerics ``bits`` (default: W8 with the numerics of its
    weights, :func:`models.bits.default_numerics`), KV layout ``kv``, ``core_mode``
    (default: every core of ``hw``), calls of up to ``max_seq`` tokens, ``slots`` caches of
    ``cap`` tokens, weight tiles of ``tile_bytes`` (default: the compiler's), integer
    parameters calibrated when ``functional``; the weights are the source's (synthetic
    ones seeded by ``seed``) unless ``weights`` names others (a weight spec).
    ``store_programs``: keep the prefill and decode programs of the compiled sizes (what a
    ``.kvm`` file shows); a run lowers its own calls and leaves them out.

    The compiled model is kept (the last :data:`COMPILED_KEPT`), keyed on everything it
    depends on: the model's config and weight files, the bits, the build's sizes and the
    hardware *target* (cores, SRAM, DRAM capacity), so hardware that differs elsewhere
    (DRAM timing, link, fixed costs) shares one compile."""
    src = source_of(model)
    hwc = hardware_of(hw)
    spec = weights if weights is not None else src.weight_spec(seed)
    if bits is None:
        bits = BitConfig(numerics=default_numerics(spec.get("kind") != "synthetic"))
    target = HardwareTarget.from_hw(hwc)
    mode = core_mode or widest_core_mode(hwc)
    key = (src.config.model_dump_json(), weights_key(spec), bits.model_dump_json(), kv, target,
           mode, max_seq, cap, slots, tile_bytes, functional, store_programs)
    cm = _COMPILED.pop(key, None)
    if cm is None:
        cm = compile_model(src.config, bits, target, kv=kv, core_mode=mode, max_seq=max_seq,
                           cap=cap, slots=slots, tile_bytes=tile_bytes, functional=functional,
                           weights=spec, store_programs=store_programs)
    _COMPILED[key] = cm  # the newest last
    while len(_COMPILED) > COMPILED_KEPT:
        del _COMPILED[next(iter(_COMPILED))]
    return ReadyModel(src, hwc, cm, functional)


__all__ = ["COMPILED_KEPT", "ReadyModel", "hardware_of", "ready_model", "source_of",
           "weights_key", "widest_core_mode"]
