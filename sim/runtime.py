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

import operator
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isa.errors import DeviceError, KvsimError
from isa.instructions import HostRead, HostWrite, Program
from models.compiler import CompiledModel
from traces.recorder import Recorder

from .cacheops import (
    CacheOpError,
    CacheView,
    EditFn,
    EditResult,
    as_format,
    check_positions,
    measure,
    model_identity,
    pack_file,
    rearrange_program,
    requantize_program,
    unpack_file,
)
from .device import Device, ProgramRun
from .hw import HardwareConfig, load_hardware
from .units import ns_to_ps

#: Host-memory layout the runtime uses for its staging buffers.
HOST_IN = 0
HOST_OUT_ALIGN = 1 << 20
#: The vendor's filter_cache_tail handles at most this many tail tokens (FACTS.md).
FILTER_TAIL_MAX = 32


def _is_index(v: Any) -> bool:
    """An integer argument (numpy integers too; not bool, not a whole float)."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


class RuntimeApiError(KvsimError, RuntimeError):
    """Misuse of the runtime API (wrong shapes, calls after dispose, bad cache sizes)."""


def _index(v: Any, what: str, exc: type[KvsimError] = RuntimeApiError) -> int:
    """``v`` as a Python int (numpy integers converted, so range checks cannot wrap), or
    ``exc("<what> must be an integer, got ...")``."""
    if not _is_index(v):
        raise exc(f"{what} must be an integer, got {v!r}")
    return int(operator.index(v))


def _folder(directory: Any, where: str) -> Path:
    if not isinstance(directory, str | os.PathLike):
        raise CacheOpError(f"{where}: directory must be a path (str or os.PathLike), got "
                           f"{type(directory).__name__} {directory!r}")
    return Path(directory)


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

    #: Call records kept by default: enough for any one run's bookkeeping, while a serving
    #: loop of millions of calls keeps its memory flat (a record is about 3 KiB).
    KEEP_CALLS = 10_000

    def __init__(self, dev_no: int = 0, *, hw: str | HardwareConfig = "aries",
                 functional: bool = True, recorder: Recorder | None = None,
                 keep_calls: int | None = KEEP_CALLS):
        if not isinstance(hw, str | HardwareConfig):
            raise RuntimeApiError(f"Accelerator: hw must be a hardware preset name (str) or a "
                                  f"HardwareConfig, got {type(hw).__name__} {hw!r}")
        if keep_calls is not None:
            if not _is_index(keep_calls) or keep_calls < 0:
                raise RuntimeApiError(f"Accelerator: keep_calls must be an integer >= 0 or "
                                      f"None, got {keep_calls!r}")
            keep_calls = int(keep_calls)
        self.dev_no = dev_no
        self.hw = load_hardware(hw) if isinstance(hw, str) else hw
        self.functional = functional
        self.recorder = recorder or Recorder(level="off")
        self.device = Device(self.hw, functional=functional, recorder=self.recorder)
        #: The latest runtime calls (at most ``keep_calls``; None keeps them all), oldest
        #: first; ``num_calls`` counts every call made.
        self.calls: deque[CallRecord] = deque(maxlen=keep_calls)
        self.num_calls = 0
        self.model: Model | None = None
        self._validated: set[tuple] = set()

    @property
    def now_s(self) -> float:
        return self.device.env.now / 1e12

    def record(self, rec: CallRecord) -> CallRecord:
        """Keep ``rec`` as the latest call."""
        self.calls.append(rec)
        self.num_calls += 1
        return rec

    def calls_since(self, count: int) -> list[CallRecord]:
        """The records of the calls made since ``num_calls`` was ``count``."""
        count = _index(count, "calls_since: count")
        n = self.num_calls - count
        if not 0 <= n <= len(self.calls):
            raise RuntimeApiError(f"calls_since({count}): {n} calls were made since, "
                                  f"{len(self.calls)} are kept (keep_calls)")
        return list(self.calls)[len(self.calls) - n:]

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
        if not isinstance(path, str | os.PathLike | CompiledModel):
            raise RuntimeApiError(f"Model: path must be a compiled-model file (str or "
                                  f"os.PathLike) or a CompiledModel, got {type(path).__name__}")
        if model_config is not None and not isinstance(model_config, ModelConfig):
            raise RuntimeApiError(f"Model: model_config must be a ModelConfig or None, got "
                                  f"{type(model_config).__name__} {model_config!r}")
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
        if self.acc is not None:
            raise RuntimeApiError("the model is already launched on an accelerator; "
                                  "dispose it and create a new Model to launch elsewhere")
        if not isinstance(acc, Accelerator):
            raise RuntimeApiError(f"launch: expected an Accelerator, got {type(acc).__name__}")
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
        acc.record(CallRecord("launch", start, acc.device.env.now,
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
              cache_id: int = 0,
              batch_param: BatchParam | None = None) -> list[np.ndarray | None]:
        """Run the input embeddings (float32, shape ``(seq, hidden)`` or
        ``(1, 1, seq, hidden)``) at cache positions ``cache_size .. cache_size+seq-1``.

        Returns ``[logits]`` (float32 ``(vocab,)`` of the last token; ``None`` in
        timing-only mode); when ``outputs`` is a list, the logits are also put in it.
        ``batch_param`` (``BatchParam(sequence_length, cache_size, cache_id)``) selects
        the cache slot, as with the vendor's batch LLM models.
        Cost: runtime overhead + embeddings over the host link + the forward program (weights
        and the cache streamed from DRAM) + logits back over the host link.
        """
        self._check_alive()
        acc = self.acc
        cm = self.compiled
        if outputs is not None and not isinstance(outputs, list):
            raise RuntimeApiError(f"outputs must be a list (the logits are put in it) or None, "
                                  f"got {type(outputs).__name__}")
        if batch_param is not None:
            if not isinstance(batch_param, BatchParam):
                raise RuntimeApiError(f"batch_param must be a BatchParam(sequence_length, "
                                      f"cache_size, cache_id) or None, got "
                                      f"{type(batch_param).__name__} {batch_param!r}")
            cache_size, cache_id = batch_param.cache_size, batch_param.cache_id
            seq_len = _index(batch_param.sequence_length, "batch_param.sequence_length")
        cache_size = _index(cache_size, "cache_size")
        cache_id = _index(cache_id, "cache_id")
        try:
            raw = np.asarray(inputs)
            if raw.dtype.kind == "c":
                raise RuntimeApiError("inputs: complex values; expected real float32 "
                                      "embeddings")
            with np.errstate(over="ignore", invalid="ignore"):
                x = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise RuntimeApiError(f"inputs: not float32 embeddings ({err})") from None
        if x.ndim == 4:
            if x.shape[:2] != (1, 1):
                raise RuntimeApiError(f"inputs: shape {x.shape}, expected (1, 1, seq, hidden)")
            x = x[0, 0]
        if x.ndim != 2 or x.shape[1] != cm.model.hidden_size or x.shape[0] < 1:
            raise RuntimeApiError(f"inputs: shape {np.shape(inputs)}, expected (seq, "
                                  f"{cm.model.hidden_size}) float32 embeddings")
        seq = x.shape[0]
        if batch_param is not None and seq_len != seq:
            raise RuntimeApiError(f"batch_param.sequence_length {seq_len} "
                                  f"does not match the {seq} input tokens")
        if not np.isfinite(x).all():
            raise RuntimeApiError("inputs: contain NaN or inf (as float32: finite float64 "
                                  "values beyond about 3.4e38 overflow to inf)")
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
            dev.host_write(HOST_IN, np.ascontiguousarray(x).view(np.uint8))
        prog = cm.program(tokens=seq, cache_size=cache_size, slot=cache_id, host_in=HOST_IN,
                          host_out=host_out)
        start = dev.env.now
        before = dev.stats.snapshot()
        acc.host_work(acc.hw.host.call_overhead_ns, "infer")
        acc.run(prog, "infer", shape=(seq, cache_id))
        acc.record(CallRecord("infer", start, dev.env.now,
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
    def _begin(self) -> tuple[int, dict]:
        dev = self.acc.device
        return dev.env.now, dev.stats.snapshot()

    def _end(self, op: str, start: int, before: dict) -> CallRecord:
        dev = self.acc.device
        rec = CallRecord(op, start, dev.env.now, dev.stats.delta(dev.stats.snapshot(), before))
        return self.acc.record(rec)

    def _cache_groups(self) -> list[list[dict]]:
        """Per cache (get_cache_infos order): its regions, one per slot."""
        groups: dict[tuple[int, str], list[dict]] = {}
        for c in self.compiled.kv_caches():
            groups.setdefault((c.layer, c.component), []).append(c)
        return [sorted(v, key=lambda c: c.slot) for _, v in sorted(groups.items())]

    def dump_cache_memory(self) -> list[bytes]:
        """The bytes of every cache (``get_cache_infos`` order; all slots of a cache
        concatenated). Cost: the runtime call, then every cache region crosses the host
        link device-to-host (``sum(size * num_batches)`` bytes). In timing-only mode the
        bytes are zeros (their transfer is still simulated)."""
        self._check_alive()
        acc, dev = self.acc, self.acc.device
        start, before = self._begin()
        acc.host_work(acc.hw.host.call_overhead_ns, "dump_cache_memory")
        addr = HOST_IN
        reads, spans = [], []
        for group in self._cache_groups():
            for c in group:
                r = c.region
                reads.append(HostRead(src=r.base, dst=addr, nbytes=r.size))
                spans.append((addr, r.size))
                addr += r.size
        acc.run(Program(tuple(reads), name="dump caches"), "dump_cache_memory")
        self._end("dump_cache_memory", start, before)
        out, i = [], 0
        for group in self._cache_groups():
            parts = []
            for _ in group:
                a, n = spans[i]
                i += 1
                parts.append(dev.host_read(a, n).tobytes() if acc.functional else bytes(n))
            out.append(b"".join(parts))
        return out

    def _check_bufs(self, bufs) -> list[bytes]:
        infos = self.get_cache_infos()
        if not isinstance(bufs, (list, tuple)):
            raise CacheOpError(f"load_cache_memory: expected a list of {len(infos)} buffers, "
                               f"got {type(bufs).__name__}")
        if len(bufs) != len(infos):
            raise CacheOpError(f"load_cache_memory: got {len(bufs)} buffers, the model has "
                               f"{len(infos)} caches")
        out = []
        for i, (b, info) in enumerate(zip(bufs, infos, strict=True)):
            try:
                data = bytes(memoryview(b).cast("B"))
            except TypeError:
                raise CacheOpError(f"load_cache_memory: buffer {i} ({info.name}) is not "
                                   f"bytes-like") from None
            want = info.size * info.num_batches
            if len(data) != want:
                raise CacheOpError(f"load_cache_memory: buffer {i} ({info.name}) has "
                                   f"{len(data)} bytes, the cache takes {want}")
            out.append(data)
        return out

    def load_cache_memory(self, bufs) -> None:
        """Overwrite every cache with ``bufs`` (as ``dump_cache_memory`` returns them).
        Every buffer is checked first (count, sizes): a refused load changes nothing.
        Cost: the runtime call, then every byte crosses the host link host-to-device."""
        self._check_alive()
        data = self._check_bufs(bufs)
        acc, dev = self.acc, self.acc.device
        start, before = self._begin()
        acc.host_work(acc.hw.host.call_overhead_ns, "load_cache_memory")
        writes = []
        addr = HOST_IN
        for group, blob in zip(self._cache_groups(), data, strict=True):
            off = 0
            for c in group:
                r = c.region
                if acc.functional:
                    dev.host_write(addr, np.frombuffer(blob, np.uint8, r.size, off))
                writes.append(HostWrite(src=addr, dst=r.base, nbytes=r.size))
                addr += r.size
                off += r.size
        acc.run(Program(tuple(writes), name="load caches"), "load_cache_memory")
        self._end("load_cache_memory", start, before)

    def dump_cache_memory_to(self, directory: str | Path) -> list[Path]:
        """``dump_cache_memory`` into one file per cache, ``cache_<layer_hash>.bin``, each
        with a header (format version, model and KV-format identity, cache name, size,
        CRC-32 of the bytes). Files are written atomically."""
        from traces.io import atomic_write_bytes

        self._check_alive()
        d = _folder(directory, "dump_cache_memory_to")
        try:  # before the dump: a path that cannot be a folder costs no device time
            d.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CacheOpError(f"dump_cache_memory_to: cannot make the folder {str(d)!r} "
                               f"({err.strerror or err})") from None
        if not os.access(d, os.W_OK | os.X_OK):  # nor does a folder it cannot write
            raise CacheOpError(f"dump_cache_memory_to: cannot write into the folder "
                               f"{str(d)!r} (permission denied)")
        bufs = self.dump_cache_memory()
        ident = model_identity(self.compiled)
        paths = []
        for info, blob in zip(self.get_cache_infos(), bufs, strict=True):
            meta = {"model": ident, "name": info.name, "cache_type": info.cache_type,
                    "layer_hash": info.layer_hash, "size": len(blob),
                    "num_batches": info.num_batches}
            p = d / f"cache_{info.layer_hash}.bin"
            try:
                atomic_write_bytes(p, pack_file(meta, blob))
            except OSError as err:
                raise CacheOpError(f"dump_cache_memory_to: cannot write {str(p)!r} "
                                   f"({err.strerror or err})") from None
            paths.append(p)
        return paths

    def load_cache_memory_from(self, directory: str | Path) -> None:
        """Load the files ``dump_cache_memory_to`` wrote. Every file is checked first
        (present, header, model and format identity, name, size, checksum); any problem
        refuses the whole load and leaves the device cache as it was."""
        self._check_alive()
        d = _folder(directory, "load_cache_memory_from")
        if not d.is_dir():
            raise CacheOpError(f"load_cache_memory_from: {str(d)!r} is not a directory")
        ident = model_identity(self.compiled)
        bufs = []
        for info in self.get_cache_infos():
            p = d / f"cache_{info.layer_hash}.bin"
            if not p.is_file():
                raise CacheOpError(f"load_cache_memory_from: {p.name} is missing")
            meta, payload = unpack_file(p.read_bytes(), p.name)
            if meta.get("model") != ident:
                raise CacheOpError(f"{p.name}: dumped from another model or KV format "
                                   f"({meta.get('model')!r}; this model is {ident!r})")
            if meta.get("name") != info.name:
                raise CacheOpError(f"{p.name}: holds cache {meta.get('name')!r}, expected "
                                   f"{info.name!r}")
            bufs.append(payload)
        self.load_cache_memory(bufs)

    def reset_cache_memory(self) -> None:
        """Clear every cache (the host's ``cache_size`` goes back to 0). Cost: the runtime
        call; the driver clears the caches' length headers, which is not timed further."""
        self._check_alive()
        acc, dev = self.acc, self.acc.device
        start, before = self._begin()
        acc.host_work(acc.hw.host.call_overhead_ns, "reset_cache_memory")
        if acc.functional:
            for c in self.compiled.kv_caches():
                r = c.region
                dev.mem.dram.write(r.base, np.zeros(r.size, np.uint8))
        self._end("reset_cache_memory", start, before)

    def _rearrange(self, op: str, keep: list[int], dst: int, cache_id: int) -> None:
        acc = self.acc
        start, before = self._begin()
        acc.host_work(acc.hw.host.call_overhead_ns, op)
        prog = rearrange_program(self.compiled, slot=cache_id, keep=keep, dst=dst, name=op)
        if prog.instructions:
            acc.run(prog, op)
        self._end(op, start, before)

    def filter_cache_tail(self, cache_size: int, tail_size: int, mask, *,
                          cache_id: int = 0) -> int:
        """Keep the last ``tail_size`` (<= 32) tokens whose ``mask`` entry is true, drop
        the others and shift the kept ones forward; returns the new cache size. Cost: the
        runtime call and an on-device DRAM-to-DRAM program over every cache (KvRead of the
        kept tokens, KvWrite at their new positions)."""
        self._check_alive()
        if not _is_index(tail_size):
            raise CacheOpError(f"filter_cache_tail: tail_size must be an integer 1.."
                               f"{FILTER_TAIL_MAX}, got {tail_size!r}")
        tail_size = int(tail_size)
        if not 1 <= tail_size <= FILTER_TAIL_MAX:
            raise CacheOpError(f"filter_cache_tail: tail_size {tail_size} must be 1.."
                               f"{FILTER_TAIL_MAX}")
        m = self._check_mask(mask, tail_size)
        cache_size, cache_id = self._check_size(cache_size, cache_id)
        if tail_size > cache_size:
            raise CacheOpError(f"filter_cache_tail: tail_size {tail_size} exceeds cache_size "
                               f"{cache_size}")
        first = cache_size - tail_size
        keep = [first + i for i, k in enumerate(m) if k]
        self._rearrange("filter_cache_tail", keep, first, cache_id)
        return first + len(keep)

    def move_cache_tail(self, num_head: int, num_tail: int, cache_size: int, *,
                        cache_id: int = 0) -> int:
        """Move the last ``num_tail`` tokens to position ``num_head`` (dropping the tokens
        between); returns the new cache size ``num_head + num_tail``. Cost: as
        ``filter_cache_tail``."""
        self._check_alive()
        cache_size, cache_id = self._check_size(cache_size, cache_id)
        for name, v in (("num_head", num_head), ("num_tail", num_tail)):
            if not _is_index(v) or v < 0:
                raise CacheOpError(f"move_cache_tail: {name} must be an integer >= 0, got {v!r}")
        num_head, num_tail = int(num_head), int(num_tail)
        if num_head + num_tail > cache_size:
            raise CacheOpError(f"move_cache_tail: num_head {num_head} + num_tail {num_tail} "
                               f"exceed cache_size {cache_size}")
        keep = list(range(cache_size - num_tail, cache_size))
        self._rearrange("move_cache_tail", keep, num_head, cache_id)
        return num_head + num_tail

    def _check_size(self, cache_size: int, cache_id: int) -> tuple[int, int]:
        """``(cache_size, cache_id)`` as Python ints, checked against the compiled model."""
        cap = self.compiled.cap
        if not _is_index(cache_size) or not 0 <= cache_size <= cap:
            raise CacheOpError(f"cache_size {cache_size!r} must be an integer in 0.."
                               f"{self.compiled.cap}")
        if not _is_index(cache_id) or not 0 <= cache_id < self.compiled.slots:
            raise CacheOpError(f"cache_id {cache_id} out of range 0..{self.compiled.slots - 1}")
        return int(cache_size), int(cache_id)

    @staticmethod
    def _check_mask(mask, tail_size: int) -> list[bool]:
        try:
            arr = np.asarray(mask)
        except (TypeError, ValueError):
            raise CacheOpError(f"filter_cache_tail: mask must be a 1-D sequence of "
                               f"{tail_size} booleans (or 0/1), got {mask!r}") from None
        if arr.ndim != 1 or arr.shape[0] != tail_size:
            raise CacheOpError(f"filter_cache_tail: mask has shape {arr.shape}, expected "
                               f"({tail_size},)")
        if arr.dtype != bool and not (np.issubdtype(arr.dtype, np.integer)
                                      and np.isin(arr, (0, 1)).all()):
            raise CacheOpError("filter_cache_tail: mask must hold booleans (or 0/1)")
        return [bool(x) for x in arr]

    # --- host-side and on-device edits ------------------------------------------------
    def _views(self, bufs: list[bytes], cache_size: int, cache_id: int) -> list[CacheView]:
        cm = self.compiled
        views = []
        for group, blob in zip(self._cache_groups(), bufs, strict=True):
            c = group[cache_id]
            region = np.frombuffer(blob, np.uint8, c.region.size,
                                   cache_id * c.region.size)
            fmt, w, hb = c.format, c.width, c.head_bytes
            heads = [fmt.region_read(region[h * hb:(h + 1) * hb], cm.cap, w, 0, cache_size)
                     for h in range(c.heads)]
            views.append(CacheView(c.name, c.layer, c.component,
                                   np.stack(heads, axis=1), blob, fmt))
        return views

    def edit_cache_on_host(self, fn: EditFn, *, cache_size: int, cache_id: int = 0,
                           mode: str = "model", op: str = "host_edit") -> EditResult:
        """Dump every cache over PCIe, decode cache ``cache_id`` into views (tokens x heads
        x width int8, plus the raw bytes), run ``fn(views)`` (it returns new values per
        view, or None to keep them; edits made in place to ``view.values`` are applied
        either way), encode the changes, and load everything back over PCIe. Host time: the
        hardware's host cost model (``mode="model"``, the default, deterministic) or the
        measured wall time of ``fn`` (``mode="in_the_loop"``); both are reported. Returns
        the cost and the new cache size. ``fn`` must be callable (checked before the dump);
        what it returns must be None or a list of one int8 array (tokens, heads, width) per
        view, else :class:`CacheOpError` (after the dump: the time is spent, the cache is
        left as it was)."""
        self._check_alive()
        cache_size, cache_id = self._check_size(cache_size, cache_id)
        if not callable(fn):
            raise CacheOpError(f"edit_cache_on_host: fn must be callable (views -> list of "
                               f"arrays or None), got {type(fn).__name__} {fn!r}")
        if mode not in ("model", "in_the_loop"):
            raise CacheOpError(f"mode must be 'model' or 'in_the_loop', got {mode!r}")
        acc, cm = self.acc, self.compiled
        start, before = self._begin()
        bufs = self.dump_cache_memory()
        nbytes = sum(len(b) for b in bufs)
        host = acc.hw.host
        # decode and re-encode pass over every dumped byte once each
        modelled = (host.edit_overhead_ns * 1e-9 + 2 * nbytes / host.edit_bytes_per_s)
        if not acc.functional:
            # timing-only: the bytes are not real, only the costs are simulated
            if mode == "in_the_loop":
                raise CacheOpError("in-the-loop host time needs functional mode (real bytes "
                                   "for the user's function)")
            acc.host_work(modelled * 1e9, op)
            self.load_cache_memory(bufs)
            rec = self._end(op, start, before)
            t = rec.stats.get("traffic", {})
            return EditResult(op, "host", rec.time_s,
                              t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                              t.get("dram_read", 0) + t.get("dram_write", 0),
                              host_model_s=modelled, new_cache_size=cache_size)
        views = self._views(bufs, cache_size, cache_id)
        # the decoded values as they were: the edit may change view.values in place
        olds = [v.values.copy() for v in views]
        new, measured = measure(fn, views)
        out = []
        if new is None:
            new = [v.values for v in views]
        new = _check_edit(new, views)
        sizes = {x.shape[0] for x in new}
        if len(sizes) != 1:
            raise CacheOpError(f"the edit left caches of different lengths {sorted(sizes)}")
        new_size = sizes.pop()
        for group, blob, view, old_vals, vals in zip(self._cache_groups(), bufs, views, olds,
                                                     new, strict=True):
            c = group[cache_id]
            if vals.dtype != np.int8 or vals.shape[1:] != old_vals.shape[1:]:
                raise CacheOpError(f"{view.name}: the edit returned {vals.dtype} "
                                   f"{vals.shape}, expected int8 (tokens,"
                                   f" {old_vals.shape[1]}, {old_vals.shape[2]})")
            if new_size > cm.cap:
                raise CacheOpError(f"{view.name}: {new_size} tokens exceed the capacity "
                                   f"{cm.cap}")
            region = bytearray(blob)
            base = cache_id * c.region.size
            fmt, hb = c.format, c.head_bytes
            for h in range(c.heads):
                old, nv = old_vals[:, h], vals[:, h]
                same = min(len(old), len(nv))
                diff = np.nonzero((old[:same] != nv[:same]).any(axis=1))[0]
                dst = int(diff[0]) if diff.size else same
                if dst == len(nv) and len(nv) == len(old):
                    continue
                sub = np.frombuffer(region, np.uint8, hb, base + h * hb).copy()
                if dst < len(nv):
                    fmt.region_write(sub, cm.cap, dst, nv[dst:])
                region[base + h * hb: base + (h + 1) * hb] = sub.tobytes()
            out.append(bytes(region))
        acc.host_work((modelled if mode == "model" else measured) * 1e9, op)
        self.load_cache_memory(out)
        rec = self._end(op, start, before)
        t = rec.stats.get("traffic", {})
        return EditResult(op, "host", rec.time_s, t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                          t.get("dram_read", 0) + t.get("dram_write", 0),
                          host_model_s=modelled, host_measured_s=measured,
                          new_cache_size=new_size)

    def evict_on_device(self, drop, *, cache_size: int, cache_id: int = 0,
                        op: str = "device_evict") -> EditResult:
        """Remove the tokens at positions ``drop`` from every cache with an on-device
        program (compaction by KvRead/KvWrite through DRAM scratch): no PCIe traffic.
        ``drop``: a sequence (or 1-D integer array) of integer positions in
        ``0 .. cache_size-1``; bools and floats are refused, and so is a boolean mask (pass
        ``np.flatnonzero(mask)``)."""
        self._check_alive()
        cache_size, cache_id = self._check_size(cache_size, cache_id)
        drop_set = set(check_positions(drop, cache_size, where="evict"))
        if not drop_set:
            raise CacheOpError("evict: no positions to drop")
        first = min(drop_set)
        keep = [p for p in range(first, cache_size) if p not in drop_set]
        start, before = self._begin()
        self._rearrange(op, keep, first, cache_id)
        rec = self.acc.calls[-1]
        rec = self.acc.calls[-1] = CallRecord(op, start, rec.end_ps, rec.stats)
        t = rec.stats.get("traffic", {})
        return EditResult(op, "device", rec.time_s, t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                          t.get("dram_read", 0) + t.get("dram_write", 0),
                          new_cache_size=first + len(keep))

    def requantize_on_device(self, via, *, cache_size: int, cache_id: int = 0,
                             op: str = "device_requantize") -> EditResult:
        """Pass every cached value through KV format ``via`` (a ``KVFormat``, or a name or
        spec ``isa.kvformats.parse`` accepts) and back, on the device. With
        ``cache_size=0`` there is nothing to requantize: only the call is paid."""
        self._check_alive()
        cache_size, cache_id = self._check_size(cache_size, cache_id)
        via = as_format(via, "requantize_on_device: via")
        acc = self.acc
        # built before any work: a format the scratch area or SRAM cannot hold is refused
        prog = requantize_program(self.compiled, slot=cache_id, tokens=cache_size, via=via,
                                  name=op)
        start, before = self._begin()
        acc.host_work(acc.hw.host.call_overhead_ns, op)
        if cache_size:  # an empty cache: only the call
            acc.run(prog, op)
        rec = self._end(op, start, before)
        t = rec.stats.get("traffic", {})
        return EditResult(op, "device", rec.time_s, t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                          t.get("dram_read", 0) + t.get("dram_write", 0),
                          new_cache_size=cache_size)

    def get_cache_infos(self) -> list[CacheInfo]:
        """The KV caches: one per layer and component (K and V; MLA: the latent), each
        ``num_batches`` slots; ``size`` is the bytes of one slot's region."""
        self._check_alive()
        out = []
        for c in self.compiled.kv_caches():
            if c.slot != 0:
                continue
            kind = {"k": "key", "v": "value"}.get(c.component, "latent")
            out.append(CacheInfo(cache_type=kind, name=c.name.split(".", 2)[2],
                                 layer_hash=f"{c.layer:04d}{c.component}",
                                 size=c.region.size, num_batches=self.compiled.slots))
        return out


def _check_edit(new: Any, views: list[CacheView]) -> list[np.ndarray]:
    """What a host edit returned, as one 3-D array per view, or :class:`CacheOpError`."""
    want = (f"expected a list of {len(views)} int8 arrays (tokens, heads, width) or None")
    if not isinstance(new, list | tuple):
        raise CacheOpError(f"edit_cache_on_host: the edit returned {type(new).__name__}; "
                           f"{want}")
    if len(new) != len(views):
        raise CacheOpError(f"edit_cache_on_host: the edit returned {len(new)} caches, "
                           f"expected {len(views)}")
    out = []
    for view, x in zip(views, new, strict=True):
        what = type(x).__name__
        try:
            a = np.asarray(x) if isinstance(x, np.ndarray | list | tuple) else None
        except (TypeError, ValueError):
            a, what = None, f"ragged {what}"
        if a is None or a.ndim != 3 or a.dtype == object:
            if a is not None:
                what = f"{what} {a.dtype} {a.shape}"
            raise CacheOpError(f"{view.name}: the edit returned {what}; {want}")
        out.append(a)
    return out


__all__ = ["Accelerator", "BatchParam", "CacheInfo", "CallRecord", "Model", "ModelConfig",
           "RuntimeApiError", "DeviceError"]
