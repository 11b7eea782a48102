"""Host runtime API, shaped like the vendor's Python runtime (``qbruntime``) so that host
code written for the real card runs on the simulated one. The one line to change::

    import qbruntime                      ->  import sim.runtime as qbruntime
    from qbruntime import Model, ...      ->  from sim.runtime import Model, ...

Every call runs on the simulated device and advances its clock: ``launch`` loads the
weights over the host link; ``infer`` uploads the input embeddings, runs the forward
program and downloads the logits; each call also pays the runtime/driver overhead of the
hardware preset (``host.call_overhead_ns``). The host, not the runtime, tracks how many
tokens are in the cache (``cache_size``), as with the vendor runtime.

Vendor-style use::

    acc = qbruntime.Accelerator(0)                    # or Accelerator("aries-rb", 0)
    mc = qbruntime.ModelConfig()
    mc.set_global8_core_mode()
    model = qbruntime.Model("qwen.kvm", mc)           # or: model = qbruntime.load("qwen.kvm")
    model.launch(acc)
    out = model.infer([chunk], None, cache_size)      # chunk: float32 (1, 1, seq, hidden)
    logits = out[0][0, 0, -1, :]
    model.dispose()

kvsim's own forms are kept (``Accelerator(hw="tiny", functional=False)``,
``model.infer(embeddings_2d, cache_size=n)[0]`` -> ``(vocab,)`` logits) beside kvsim's
cache edits (``edit_cache_on_host``, ``evict_on_device``, ``requantize_on_device``).

The vendor's unchanged host code (``import qbruntime``) runs on this runtime through
:mod:`.vendor`: the surface of mobilint-qb-runtime 1.5.0, which ``kvsim exec`` puts in place
of the real one.

The package: :mod:`.model` (what a user calls), :mod:`.checks` (argument checks),
:mod:`.deviceops` (programs and transfers), :mod:`.cachefiles` (dump files),
:mod:`.edits` (cache edits), :mod:`.accelerator`, :mod:`.tracing`, :mod:`.types`,
:mod:`.ready` (a model by name, compiled and ready to launch: :func:`ready_model`).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvsim.errors import DeviceError
from sim.runtime.accelerator import DEVICE_TYPES, Accelerator
from sim.runtime.checks import FILTER_TAIL_MAX
from sim.runtime.deviceops import HOST_IN
from sim.runtime.errors import RuntimeApiError
from sim.runtime.model import Model
from sim.runtime.ready import ReadyModel, ready_model
from sim.runtime.tracing import start_tracing_events, stop_tracing_events
from sim.runtime.types import BatchParam, BufferInfo, CacheInfo, CallRecord, ModelConfig


def load(path: str | os.PathLike, model_config: ModelConfig | None = None, *,
         hw: str | None = None, functional: bool = True, max_seq: int = 512,
         cap: int = 4096) -> Model:
    """The vendor's ``qbruntime.load(path, model_config=None)``: an ``Accelerator(0)``, the
    ``Model`` and its ``launch``, in one call. The card is the hardware preset the model
    was compiled for (or ``hw``).

    kvsim's addition: ``path`` may also name a model as a run config does (a preset,
    ``smollm2-135m``, a GGUF file, a Hugging Face folder or a ``config.json``); it is then
    compiled here (W8 weights, INT8 KV, every core of ``hw``, default ``aries``; calls of
    up to ``max_seq`` tokens, a cache of ``cap``). A ``.kvm`` file loads as before."""
    if not isinstance(path, str | os.PathLike):
        raise RuntimeApiError(f"load: path must be a compiled-model file (str or "
                              f"os.PathLike), got {type(path).__name__} {path!r}")
    if Path(path).suffix != ".kvm":
        ready = ready_model(path, hw or "aries", kv="int8", max_seq=max_seq, cap=cap,
                            functional=functional)
        return ready.launch(model_config, acc=Accelerator(0, hw=ready.hw,
                                                          functional=functional))
    model = Model(Path(path), model_config)
    acc = Accelerator(0, hw=hw or model.compiled.hw.name, functional=functional)
    model.launch(acc)
    return model


__all__ = ["DEVICE_TYPES", "FILTER_TAIL_MAX", "HOST_IN", "Accelerator", "BatchParam",
           "BufferInfo", "CacheInfo", "CallRecord", "DeviceError", "Model", "ModelConfig",
           "ReadyModel", "RuntimeApiError", "load", "ready_model",
           "start_tracing_events", "stop_tracing_events"]
