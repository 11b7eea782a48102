"""Host runtime API, shaped like the vendor's Python runtime (``qbruntime``) so host code
ports over by changing the import line.

Every call runs on the simulated device and advances its clock: ``launch`` loads the
weights over the host link; ``infer`` uploads the input embeddings, runs the forward
program and downloads the logits; each call also pays the runtime/driver overhead of the
hardware preset (``host.call_overhead_ns``). The host, not the runtime, tracks how many
tokens are in the cache (``cache_size``), as with the vendor runtime.

Typical use (see ``examples`` in the README)::

    acc = Accelerator(hw="aries")
    model = Model("qwen.kvm", ModelConfig(core_mode="global8"))
    model.launch(acc)
    logits = model.infer(embeddings, cache_size=0)        # prefill
    logits = model.infer(next_embedding, cache_size=n)    # one decode step
    model.dispose()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isa.errors import DeviceError, KvsimError
from isa.instructions import HostWrite, Program
from models.compiler import CompiledModel
from traces.recorder import Recorder

from .device import Device, ProgramRun
from .hw import HardwareConfig, load_hardware
from .units import ns_to_ps

#: Host-memory layout the runtime uses for its staging buffers.
HOST_IN = 0
HOST_OUT_ALIGN = 1 << 20


class RuntimeApiError(KvsimError, RuntimeError):
    """Misuse of the runtime API (wrong shapes, calls after dispose, bad cache sizes)."""


@dataclass(frozen=True)
class ModelConfig:
    """Runtime model options (the vendor's ``ModelConfig``): the core mode must match the
    compiled model's."""

    core_mode: str | None = None


@dataclass(frozen=True)
class BatchParam:
    """One sequence of a batched ``infer``: its tokens, its cache size, its cache slot."""

    sequence_length: int
    cache_size: int
    cache_id: int = 0


@dataclass(frozen=True)
class CacheInfo:
    """One KV cache of the launched model (the vendor's ``CacheInfo``)."""

    cache_type: str  # "key", "value" (GQA) or "latent" (MLA)
    name: str
    layer_hash: str
    size: int  # bytes of the cache region
    num_batches: int  # cache slots


@dataclass
class CallRecord:
    """What one runtime call cost (for metrics and reports)."""

    op: str
    start_ps: int
    end_ps: int
    stats: dict = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return (self.end_ps - self.start_ps) / 1e12


class Accelerator:
    """One simulated NPU card (the vendor's ``Accelerator(dev_no)``)."""

    def __init__(self, dev_no: int = 0, *, hw: str | HardwareConfig = "aries",
                 functional: bool = True, recorder: Recorder | None = None):
        self.dev_no = dev_no
        self.hw = load_hardware(hw) if isinstance(hw, str) else hw
        self.functional = functional
        self.recorder = recorder or Recorder(level="off")
        self.device = Device(self.hw, functional=functional, recorder=self.recorder)
        self.calls: list[CallRecord] = []
        self.model: Model | None = None
        self._validated: set[tuple] = set()

    @property
    def now_s(self) -> float:
        return self.device.env.now / 1e12

    # --- helpers used by Model ------------------------------------------------------------
    def host_work(self, ns: float, name: str) -> None:
        """Advance the clock by host-side work of ``ns`` nanoseconds (runtime, driver)."""
        ps = ns_to_ps(ns)
        if ps <= 0:
            return
        env = self.device.env
        start = env.now
        env.run(until=start + ps)
        self.recorder.span("host", "runtime", name, start, env.now)

    def run(self, program: Program, op: str, *, shape: tuple = ()) -> ProgramRun:
        """Run ``program``. Compiler-made programs of one ``shape`` (op and token count)
        differ only in positions, so only the first of each shape is validated."""
        start = self.device.env.now
        key = (op, *shape)
        run = self.device.run(program, validate=not shape or key not in self._validated)
        if shape:
            self._validated.add(key)
        self.recorder.span("runtime", "calls", op, start, run.end_ps)
        return run


class Model:
    """A compiled model on an accelerator (the vendor's ``Model(path, model_config)``)."""

    def __init__(self, path: str | Path | CompiledModel, model_config: ModelConfig | None = None):
        self.compiled = path if isinstance(path, CompiledModel) else CompiledModel.load(path)
        cfg = model_config or ModelConfig()
        if cfg.core_mode not in (None, self.compiled.core_mode):
            raise RuntimeApiError(f"ModelConfig.core_mode {cfg.core_mode!r} does not match the "
                                  f"compiled model's {self.compiled.core_mode!r}")
        self.model_config = cfg
        self.acc: Accelerator | None = None
        self._disposed = False

    # --- lifecycle ----------------------------------------------------------------------
    def launch(self, acc: Accelerator) -> None:
        """Load the model on ``acc``: its memory map, then its weights over the host link
        (one transfer per weight region; the simulated clock advances by their time)."""
        self._check_alive(launched=False)
        cm = self.compiled
        hw = acc.hw
        if cm.hw.num_cores > hw.cores.num_cores or cm.hw.sram_bytes > hw.sram.bytes_per_core:
            raise RuntimeApiError(f"the model was compiled for {cm.hw.name!r}, which this "
                                  f"accelerator ({hw.name!r}) cannot run")
        if acc.model is not None:
            raise RuntimeApiError("this accelerator already runs a model; dispose it first")
        acc.device.set_layout(cm.layout(host_bytes=hw.host.memory_bytes))
        start = acc.device.env.now
        before = acc.device.stats.snapshot()
        acc.host_work(hw.host.call_overhead_ns, "launch")
        if acc.functional:
            for addr, data in cm.weight_image():
                acc.device.host_write(HOST_IN, data)
                acc.run(Program((HostWrite(src=HOST_IN, dst=addr, nbytes=data.size),),
                                name="load weights"), "launch")
        else:
            regions = [r for r in cm.mm.regions if r.kind == "weights"]
            acc.run(Program(tuple(HostWrite(src=HOST_IN, dst=r.base, nbytes=r.size)
                                  for r in regions), name="load weights"), "launch")
        acc.calls.append(CallRecord("launch", start, acc.device.env.now,
                                    acc.device.stats.delta(acc.device.stats.snapshot(), before)))
        acc.model = self
        self.acc = acc

    def dispose(self) -> None:
        """Release the accelerator. Any later call on this model is an error."""
        self._check_alive()
        if self.acc is not None:
            self.acc.model = None
        self.acc = None
        self._disposed = True

    def _check_alive(self, *, launched: bool = True) -> None:
        if self._disposed:
            raise RuntimeApiError("the model was disposed; create and launch a new one")
        if launched and self.acc is None:
            raise RuntimeApiError("the model is not launched: call launch(acc) first")

    # --- inference ----------------------------------------------------------------------
    def infer(self, inputs: Any, outputs: list | None = None, cache_size: int = 0, *,
              cache_id: int = 0) -> list[np.ndarray | None]:
        """Run the input embeddings (float32, shape ``(seq, hidden)`` or
        ``(1, 1, seq, hidden)``) at cache positions ``cache_size .. cache_size+seq-1``.

        Returns ``[logits]`` (float32 ``(vocab,)`` of the last token; ``None`` in
        timing-only mode); when ``outputs`` is a list, the logits are also put in it.
        Cost: runtime overhead + embeddings over the host link + the forward program (weights
        and the cache streamed from DRAM) + logits back over the host link.
        """
        self._check_alive()
        acc = self.acc
        cm = self.compiled
        x = np.asarray(inputs)
        if x.ndim == 4:
            if x.shape[:2] != (1, 1):
                raise RuntimeApiError(f"inputs: shape {x.shape}, expected (1, 1, seq, hidden)")
            x = x[0, 0]
        if x.ndim != 2 or x.shape[1] != cm.model.hidden_size or x.shape[0] < 1:
            raise RuntimeApiError(f"inputs: shape {np.shape(inputs)}, expected (seq, "
                                  f"{cm.model.hidden_size}) float32 embeddings")
        seq = x.shape[0]
        if seq > cm.max_seq:
            raise RuntimeApiError(f"inputs: {seq} tokens exceed max_sequence_length "
                                  f"{cm.max_seq}; prefill in chunks with growing cache_size")
        if not 0 <= cache_size or cache_size + seq > cm.cap:
            raise RuntimeApiError(f"cache_size {cache_size} + {seq} tokens exceed the cache "
                                  f"capacity of {cm.cap} tokens")
        if not 0 <= cache_id < cm.slots:
            raise RuntimeApiError(f"cache_id {cache_id} out of range 0..{cm.slots - 1}")
        dev = acc.device
        host_out = -(-4 * seq * cm.model.hidden_size // HOST_OUT_ALIGN + 1) * HOST_OUT_ALIGN
        if acc.functional:
            dev.host_write(HOST_IN, np.ascontiguousarray(x, dtype=np.float32).view(np.uint8))
        prog = cm.program(tokens=seq, cache_size=cache_size, slot=cache_id, host_in=HOST_IN,
                          host_out=host_out)
        start = dev.env.now
        before = dev.stats.snapshot()
        acc.host_work(acc.hw.host.call_overhead_ns, "infer")
        acc.run(prog, "infer", shape=(seq, cache_id))
        acc.calls.append(CallRecord("infer", start, dev.env.now,
                                    dev.stats.delta(dev.stats.snapshot(), before)))
        logits = None
        if acc.functional:
            acc_i32 = dev.host_read(host_out, 4 * cm.model.vocab_size).view(np.int32)
            logits = (acc_i32 * cm.numerics.head_row_scale).astype(np.float32)
        if outputs is not None:
            outputs.clear()
            outputs.append(logits)
        return [logits]

    # --- caches ---------------------------------------------------------------------------
    def get_cache_infos(self) -> list[CacheInfo]:
        """The KV caches: one per layer and component (K and V; MLA: the latent), each
        ``num_batches`` slots; ``size`` is the bytes of one slot's region."""
        self._check_alive()
        out = []
        for c in self.compiled.kv_caches():
            if c["slot"] != 0:
                continue
            kind = {"k": "key", "v": "value"}.get(c["component"], "latent")
            out.append(CacheInfo(cache_type=kind, name=c["name"].split(".", 2)[2],
                                 layer_hash=f"{c['layer']:04d}{c['component']}",
                                 size=c["region"].size, num_batches=self.compiled.slots))
        return out


__all__ = ["Accelerator", "BatchParam", "CacheInfo", "CallRecord", "Model", "ModelConfig",
           "RuntimeApiError", "DeviceError"]
