"""``Model``: a kvsim compiled model (``.kvm``) on a simulated card, with the vendor
runtime's ``Model`` surface (``qbruntime/model.py`` of mobilint-qb-runtime 1.5.0).

Where the vendor passes an ``.mxq``, kvsim takes the compiled model ``kvsim compile`` (or
``kvsim vendor folder``) writes. Every call runs on :class:`sim.runtime.Model` (the
runtime the rest of kvsim uses) and costs simulated time as it does there; the calls kvsim
does not simulate raise :class:`NotSimulatedError` saying why (:data:`NOT_SIMULATED`).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np

from sim.runtime.vendor import io
from sim.runtime.vendor.accelerator import Accelerator
from sim.runtime.vendor.calltrace import traced, traced_class
from sim.runtime.vendor.config import ModelConfig
from sim.runtime.vendor.enums import (
    CLUSTERS,
    CORE_MODE_OF,
    LOCAL_CORES,
    CacheType,
    CoreMode,
    DataType,
)
from sim.runtime.vendor.errors import NotSimulatedError, QbRuntimeError, runtime_errors
from sim.runtime.vendor.future import Future
from sim.runtime.vendor.model_variant_handle import ModelVariantHandle
from sim.runtime.vendor.npu_data import NPUData
from sim.runtime.vendor.pinned_memory import PinnedMemory
from sim.runtime.vendor.structs import BatchParam, Buffer, BufferInfo, CacheInfo, CoreId, Scale
from sim.runtime.vendor.system import system

#: why each call kvsim's card does not simulate is not simulated (README's table)
NOT_SIMULATED = {
    "infer_to_float": "int8 inputs quantized by the host: kvsim's card takes float32 "
                      "embeddings and quantizes them itself (its upload is 4 bytes a value)",
    "infer_buffer": "the buffer API hands the NPU's internal data layout to the host; "
                    "kvsim models no host-side repositioning of NPU buffers",
    "npu_data": "NPUData (tensors kept on the NPU between models) is beta in 1.5.0 and "
                "needs a relocatable single-bundle MXQ; kvsim has no device-resident "
                "host tensors",
    "pinned_memory": "zero-copy pinned memory is a REGULUS-only experimental API; kvsim's "
                     "regulus preset models host transfers as DRAM copies, not pinned "
                     "buffers",
    "several_models": "several models on one card (a multi-slot backend, N > 1): kvsim "
                      "runs one model per simulated card; compile the model with more cache "
                      "slots (kvsim compile --cache-slots K) and batch with BatchParam",
}
_ids = itertools.count()


def _infer_note(self: Any, inputs: Any, outputs: Any = None, cache_size: int = 0,
                params: Any = None, *args: Any) -> str:
    arr = inputs[0] if isinstance(inputs, list) and inputs else inputs
    seq = int(np.shape(arr)[-2]) if np.ndim(arr) >= 3 else 0
    if params:
        return f"batch of {len(params)} requests, {seq} tokens"
    return f"{seq} token{'s' * (seq != 1)} at cache_size {'0' if not cache_size else '> 0'}"


def _path_note(self: Any, path: Any = None, *args: Any) -> str:
    return Path(str(path)).suffix or "?"


@traced_class({"infer": _infer_note, "infer_hwc": _infer_note, "infer_chw": _infer_note,
               "__init__": _path_note})
class Model:
    """A compiled model and, once launched, the card it runs on."""

    def __init__(self, path: str, model_config: ModelConfig | None = None):
        from models.compiler import CompiledModel
        from sim.runtime import Model as KvsimModel
        from sim.runtime import ModelConfig as KvsimConfig

        if not isinstance(path, str | os.PathLike):
            raise QbRuntimeError(f"Model: path must be a file path, got {type(path).__name__}",
                                 "Model_InvalidPath")
        cfg = model_config if model_config is not None else ModelConfig()
        if not isinstance(cfg, ModelConfig):
            raise QbRuntimeError(f"Model: model_config must be a ModelConfig, got "
                                 f"{type(cfg).__name__}", "Model_InvalidConfig")
        p = Path(path)
        if p.suffix == ".mxq":
            raise QbRuntimeError(f"{p}: an .mxq is the vendor compiler's; kvsim runs its own "
                                 f"compiled models (.kvm: kvsim compile, or kvsim vendor "
                                 f"folder)", "Model_InvalidFile")
        if not p.is_file():
            raise QbRuntimeError(f"{p}: no such file", "Model_InvalidPath")
        with runtime_errors("Model"):
            cm = CompiledModel.load(p)
        self._core_mode = _resolve_core_mode(cfg, cm.core_mode)
        if cfg.get_forced_npu_bundle_index() > 0:
            raise QbRuntimeError(f"force_single_npu_bundle({cfg.get_forced_npu_bundle_index()}"
                                 f"): the model has one NPU bundle (index 0) and no CPU "
                                 f"offload", "Model_InvalidBundle")
        self._target = _target_cores(cfg, self._core_mode)
        # instances that run calls in parallel on the real card: one per core in
        # single-core mode, one per cluster in global4 mode (kvsim runs them one at a time)
        self._instances = (len(self._target) if self._core_mode is CoreMode.Single
                           else len(self._target) // len(LOCAL_CORES)
                           if self._core_mode is CoreMode.Global4 else 1)
        self._model = KvsimModel(cm, KvsimConfig(core_mode=cm.core_mode))
        self._path = str(path)
        self._config = cfg
        self._identifier = next(_ids)
        self._card: Any = None
        self._input_shape = self.get_model_input_shape()
        self._output_shape = self.get_model_output_shape()

    # --- lifecycle --------------------------------------------------------------------------
    def launch(self, acc: Accelerator) -> None:
        """Load the model on the card of ``acc``: weights over the host link (simulated)."""
        if not isinstance(acc, Accelerator):
            raise QbRuntimeError(f"launch: expected an Accelerator, got {type(acc).__name__}",
                                 "Model_InvalidAccelerator")
        card = acc._card
        if card.acc is not None and card.acc.model is not None:
            raise NotSimulatedError("Model.launch", NOT_SIMULATED["several_models"])
        cm = self._model.compiled
        with runtime_errors("Model.launch"):
            kacc = card.accelerator(cm.numerics.functional)  # made before the call: the
        # call first brings a new card's clock up to the host's (other cards ran before it)
        with system().call(card, "Model.launch"), runtime_errors("Model.launch"):
            self._model.launch(kacc)
        self._card = card
        self._acc = acc

    def dispose(self) -> None:
        """Release the card (any later call on this model is an error)."""
        with runtime_errors("Model.dispose"):
            self._model.dispose()
        self._acc = None

    def _rt(self, what: str) -> Any:
        if self._card is None or self._model.acc is None:
            raise QbRuntimeError(f"{what}: the model is not launched (or was disposed)",
                                 "Model_NotLaunched")
        return self._model

    # --- what the model is ------------------------------------------------------------------
    def is_target(self, core_id: CoreId) -> bool:
        return any(core_id == c for c in self._target)

    def get_core_mode(self) -> CoreMode:
        return self._core_mode

    def get_device_names(self) -> list[str]:
        from sim.runtime.vendor.system import device_name_of

        return [device_name_of(self._model.compiled.hw.name)]

    def get_target_cores(self) -> list[CoreId]:
        return [CoreId(c.cluster, c.core) for c in self._target]

    @property
    def target_cores(self) -> list[CoreId]:
        """Deprecated: :meth:`get_target_cores`."""
        return self.get_target_cores()

    def get_num_model_variants(self) -> int:
        return 1

    def get_model_variant_handle(self, variant_idx: int) -> ModelVariantHandle:
        if variant_idx != 0:
            raise QbRuntimeError(f"variant index {variant_idx!r}: the model has 1 variant",
                                 "Model_InvalidVariantIdx")
        return ModelVariantHandle(self)

    def get_model_input_shape(self) -> list[tuple[int, ...]]:
        """``[(1, -1, hidden)]``: one row of a variable number of token embeddings."""
        return [(1, -1, self._model.compiled.model.hidden_size)]

    def get_model_output_shape(self) -> list[tuple[int, ...]]:
        """``[(1, 1, vocab)]``: the last token's logits per request."""
        return [(1, 1, self._model.compiled.model.vocab_size)]

    def get_input_scale(self) -> list[Scale]:
        """The real value of one integer step of the embeddings the card quantizes."""
        n = self._calibrated("get_input_scale")
        return [Scale(float(n.input_scale), True, [])]

    def get_output_scale(self) -> list[Scale]:
        """The logits' per-row scales (logit = int32 accumulator x scale of its row)."""
        n = self._calibrated("get_output_scale")
        return [Scale(1.0, False, [float(v) for v in n.head_row_scale])]

    def _calibrated(self, what: str) -> Any:
        n = self._model.compiled.numerics
        if not n.functional:
            raise NotSimulatedError(f"Model.{what}", "a timing-only compiled model has no "
                                    "calibrated scales")
        return n

    def get_input_buffer_info(self) -> list[BufferInfo]:
        cm = self._model.compiled
        dims = (1, cm.max_seq, cm.model.hidden_size)
        return [BufferInfo(*dims, *dims, *dims, 1, cm.max_seq, cm.model.hidden_size, cm.cap)]

    def get_output_buffer_info(self) -> list[BufferInfo]:
        dims = (1, 1, self._model.compiled.model.vocab_size)
        return [BufferInfo(*dims, *dims, *dims, *dims, 0)]

    def get_model_input_data_type(self) -> DataType:
        return DataType.Float32

    def get_model_output_data_type(self) -> DataType:
        return DataType.Float32

    def get_identifier(self) -> int:
        return self._identifier

    def get_model_path(self) -> str:
        return self._path

    def get_cache_infos(self) -> list[CacheInfo]:
        """One per layer and component; ``Batch`` caches when the model has several slots,
        ``FixedTailCache`` for a sliding-window layer's ring."""
        cm = self._model.compiled
        windowed = {f"{c.layer:04d}{c.component}" for c in cm.kv_caches(0)
                    if c.window is not None}
        out = []
        for c in _infos(cm):
            kind = (CacheType.FixedTailCache if c.layer_hash in windowed
                    else CacheType.Batch if cm.slots > 1 else CacheType.Default)
            out.append(CacheInfo(kind, c.name, c.layer_hash, c.size, c.num_batches))
        return out

    # --- inference ----------------------------------------------------------------------------
    def infer(self, inputs: np.ndarray | list[np.ndarray], outputs: list | None = None,
              cache_size: int = 0, params: list[BatchParam] | None = None
              ) -> list[np.ndarray] | None:
        """Run token embeddings at cache positions ``cache_size..`` (or a batch of requests,
        one ``BatchParam`` each, their tokens one after another) and return the logits
        (:mod:`.io` for the forms)."""
        return self._infer(inputs, outputs, cache_size, params, None)

    def infer_hwc(self, inputs: np.ndarray | list[np.ndarray], outputs: list | None = None,
                  cache_size: int = 0, params: list[BatchParam] | None = None
                  ) -> list[np.ndarray] | None:
        return self._infer(inputs, outputs, cache_size, params, "hwc")

    def infer_chw(self, inputs: np.ndarray | list[np.ndarray], outputs: list | None = None,
                  cache_size: int = 0, params: list[BatchParam] | None = None
                  ) -> list[np.ndarray] | None:
        return self._infer(inputs, outputs, cache_size, params, "chw")

    def _infer(self, inputs: Any, outputs: Any, cache_size: Any, params: Any,
               layout: str | None) -> list[np.ndarray] | None:
        from sim.runtime import BatchParam as KvsimBatchParam

        rt = self._rt("Model.infer")
        cm = rt.compiled
        inp = io.parse_inputs(inputs, cm.model.hidden_size, layout)
        kparams = None
        if params is not None:
            if not isinstance(params, list | tuple) or not all(isinstance(p, BatchParam)
                                                               for p in params):
                raise QbRuntimeError("infer: params must be a list of BatchParam",
                                     "Model_InvalidParam")
            kparams = [KvsimBatchParam(p.sequence_length, p.cache_size, p.cache_id)
                       for p in params]
            cache_size = 0  # the vendor's: with params, cache_size is ignored
        reqs = kparams or [KvsimBatchParam(inp.x.shape[2], cache_size, 0)]
        for r in reqs:
            if isinstance(r.cache_size, int | np.integer) and isinstance(
                    r.sequence_length, int | np.integer) and (
                    r.cache_size + r.sequence_length > cm.cap):
                raise QbRuntimeError(f"infer: cache_size {r.cache_size} + {r.sequence_length} "
                                     f"tokens exceed the KV cache's {cm.cap} tokens",
                                     "Model_CacheOverflow")
        io.check_outputs(outputs, inp, len(reqs), cm.model.vocab_size)
        card = self._card
        with system().call(card, "Model.infer", instances=self._instances), \
                runtime_errors("Model.infer"):
            [logits] = rt.infer([inp.x], None, cache_size, kparams)
        if logits is None:  # a timing-only card computes no values
            system().timing_only_note(card)
            logits = np.zeros((1, 1, len(reqs), cm.model.vocab_size), np.float32)
        return io.deliver(outputs, logits, inp)

    def infer_to_float(self, inputs: np.ndarray | list[np.ndarray],
                       cache_size: int = 0) -> list[np.ndarray]:
        raise NotSimulatedError("Model.infer_to_float", NOT_SIMULATED["infer_to_float"])

    def infer_hwc_to_float(self, inputs: np.ndarray | list[np.ndarray],
                           cache_size: int = 0) -> list[np.ndarray]:
        raise NotSimulatedError("Model.infer_hwc_to_float", NOT_SIMULATED["infer_to_float"])

    def infer_chw_to_float(self, inputs: np.ndarray | list[np.ndarray],
                           cache_size: int = 0) -> list[np.ndarray]:
        raise NotSimulatedError("Model.infer_chw_to_float", NOT_SIMULATED["infer_to_float"])

    def infer_buffer(self, inputs: list[Buffer], outputs: list[Buffer],
                     shape: list[list[int]] = (), cache_size: int = 0) -> None:
        raise NotSimulatedError("Model.infer_buffer", NOT_SIMULATED["infer_buffer"])

    def infer_speedrun(self) -> None:
        """Development only: the NPU time of the latest ``infer``'s program without the
        upload of its inputs or the download of its outputs (simulated; the cache is left
        as it was)."""
        rt = self._rt("Model.infer_speedrun")
        with system().call(self._card, "Model.infer_speedrun"), \
                runtime_errors("Model.infer_speedrun"):
            rt.infer_speedrun()

    def infer_pinned_memory(self, inputs: list[PinnedMemory],
                            outputs: list[PinnedMemory] | None = None,
                            cache_size: int = 0) -> list[PinnedMemory] | None:
        raise NotSimulatedError("Model.infer_pinned_memory", NOT_SIMULATED["pinned_memory"])

    def acquire_input_npu_data(self, shape: list[int], idx: int = 0, upload: bool = False,
                               dtype: DataType | None = None) -> NPUData:
        raise NotSimulatedError("Model.acquire_input_npu_data", NOT_SIMULATED["npu_data"])

    def acquire_output_npu_data(self, shape: list[int], idx: int = 0, upload: bool = False,
                                dtype: DataType | None = None) -> NPUData:
        raise NotSimulatedError("Model.acquire_output_npu_data", NOT_SIMULATED["npu_data"])

    def infer_npu_data(self, inputs: list[NPUData], outputs: list[NPUData] | None = None,
                       cache_size: int = 0) -> list[NPUData] | None:
        raise NotSimulatedError("Model.infer_npu_data", NOT_SIMULATED["npu_data"])

    def infer_npu_data_chw(self, inputs: list[NPUData], outputs: list[NPUData] | None = None,
                           cache_size: int = 0) -> list[NPUData] | None:
        raise NotSimulatedError("Model.infer_npu_data_chw", NOT_SIMULATED["npu_data"])

    def infer_async(self, inputs: np.ndarray | list[np.ndarray]) -> Future:
        """Refused for an LLM, as by the vendor's runtime (asynchronous inference is for
        CNN models; every kvsim model is an LLM)."""
        raise QbRuntimeError("infer_async: LLM models are not supported by asynchronous "
                             "inference (the vendor's documented limitation)",
                             "Model_AsyncNotSupported")

    def infer_async_to_float(self, inputs: np.ndarray | list[np.ndarray]) -> Future:
        raise QbRuntimeError("infer_async_to_float: LLM models are not supported by "
                             "asynchronous inference", "Model_AsyncNotSupported")

    def reposition_inputs(self, inputs: list[np.ndarray], input_bufs: list[Buffer],
                          seqlens: list[list[int]] = ()) -> None:
        raise NotSimulatedError("Model.reposition_inputs", NOT_SIMULATED["infer_buffer"])

    def reposition_outputs(self, output_bufs: list[Buffer], outputs: list[np.ndarray],
                           seqlens: list[list[int]] = ()) -> None:
        raise NotSimulatedError("Model.reposition_outputs", NOT_SIMULATED["infer_buffer"])

    def acquire_input_buffer(self, seqlens: list[list[int]] = ()) -> list[Buffer]:
        raise NotSimulatedError("Model.acquire_input_buffer", NOT_SIMULATED["infer_buffer"])

    def acquire_output_buffer(self, seqlens: list[list[int]] = ()) -> list[Buffer]:
        raise NotSimulatedError("Model.acquire_output_buffer", NOT_SIMULATED["infer_buffer"])

    def release_buffer(self, buffer: list[Buffer]) -> None:
        raise NotSimulatedError("Model.release_buffer", NOT_SIMULATED["infer_buffer"])

    # --- KV caches ----------------------------------------------------------------------------
    def _cache_call(self, what: str, fn: str, *args: Any, **kwargs: Any) -> Any:
        rt = self._rt(f"Model.{what}")
        with system().call(self._card, f"Model.{what}"), runtime_errors(f"Model.{what}"):
            return getattr(rt, fn)(*args, **kwargs)

    def dump_cache_memory(self, cache_id: int = 0) -> list[bytes]:
        return self._cache_call("dump_cache_memory", "dump_cache_memory", cache_id)

    def load_cache_memory(self, bufs: list[bytes], cache_id: int = 0) -> None:
        self._cache_call("load_cache_memory", "load_cache_memory", bufs, cache_id)

    def dump_cache_memory_to(self, cache_dir: str, cache_id: int = 0) -> None:
        self._cache_call("dump_cache_memory_to", "dump_cache_memory_to", cache_dir, cache_id)

    def load_cache_memory_from(self, cache_dir: str, cache_id: int = 0) -> None:
        self._cache_call("load_cache_memory_from", "load_cache_memory_from", cache_dir,
                         cache_id)

    def dump_cache_memory_by_name(self, name: str, cache_id: int = 0) -> bytes:
        return self._cache_call("dump_cache_memory_by_name", "dump_cache_memory_by_name",
                                name, cache_id)

    def dump_cache_memory_by_layer_hash(self, layer_hash: str, cache_id: int = 0) -> bytes:
        return self._cache_call("dump_cache_memory_by_layer_hash",
                                "dump_cache_memory_by_layer_hash", layer_hash, cache_id)

    def load_cache_memory_by_name(self, buf: bytes, name: str, cache_id: int = 0) -> None:
        self._cache_call("load_cache_memory_by_name", "load_cache_memory_by_name", buf, name,
                         cache_id)

    def load_cache_memory_by_layer_hash(self, buf: bytes, layer_hash: str,
                                        cache_id: int = 0) -> None:
        self._cache_call("load_cache_memory_by_layer_hash", "load_cache_memory_by_layer_hash",
                         buf, layer_hash, cache_id)

    def reset_fixed_tail_cache_memory(self, cache_id: int = 0) -> None:
        self._cache_call("reset_fixed_tail_cache_memory", "reset_fixed_tail_cache_memory",
                         cache_id)

    def filter_cache_tail(self, cache_size: int, tail_size: int, mask: list[bool]) -> int:
        return self._cache_call("filter_cache_tail", "filter_cache_tail", cache_size,
                                tail_size, mask)

    def move_cache_tail(self, num_head: int, num_tail: int, cache_size: int) -> int:
        return self._cache_call("move_cache_tail", "move_cache_tail", num_head, num_tail,
                                cache_size)


def _infos(cm: Any) -> list[Any]:
    """kvsim's cache descriptions of a model not launched yet (no device needed)."""
    from sim.runtime.types import CacheInfo as KvsimInfo

    return [KvsimInfo(cache_type="", name=c.name.split(".", 2)[2],
                      layer_hash=f"{c.layer:04d}{c.component}", size=c.region.size,
                      num_batches=cm.slots) for c in cm.kv_caches(0)]


def _resolve_core_mode(cfg: ModelConfig, compiled: str) -> CoreMode:
    """The model's core mode: the config's, which must be the compiled one's (auto: it)."""
    want, have = cfg.get_core_mode(), CORE_MODE_OF[compiled]
    if want is CoreMode.Global:  # the deprecated name of global4
        want = CoreMode.Global4
    if want in (CoreMode.Auto, have):
        return have
    raise QbRuntimeError(f"ModelConfig core mode {want.name}: the model was compiled for "
                         f"{have.name} (kvsim compile --core-mode), and has no bundle for "
                         f"{want.name}", "Model_CoreModeNotSupported")


def _target_cores(cfg: ModelConfig, mode: CoreMode) -> list[CoreId]:
    """The cores the model uses: those the config lists, else the first that fit."""
    every = [CoreId(cl, co) for cl in CLUSTERS for co in LOCAL_CORES]
    if mode is CoreMode.Single:
        ids = cfg.get_core_ids() if cfg.get_core_mode() is CoreMode.Single else []
        n = cfg.get_num_cores() if cfg.get_core_mode() is CoreMode.Single else 1
        return ids or every[:n]
    if mode is CoreMode.Global4:
        clusters = cfg.get_clusters() or [CLUSTERS[0]]
        return [CoreId(cl, co) for cl in clusters for co in LOCAL_CORES]
    return every


@traced("load")
def load(path: str, model_config: ModelConfig | None = None) -> Model:
    """``Accelerator()``, ``Model(path, model_config)`` and its launch, in one call."""
    acc = Accelerator()
    model = Model(path, model_config)
    model.launch(acc)
    return model


__all__ = ["NOT_SIMULATED", "Model", "load"]
