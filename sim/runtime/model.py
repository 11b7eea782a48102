"""``Model``: what a host program calls (the vendor's ``Model(path, model_config)``).

Each method checks its arguments (:mod:`.checks`) and hands the work to the parts behind
it: :mod:`.deviceops` (programs and transfers), :mod:`.cachefiles` (dump files),
:mod:`.edits` (host-side and on-device cache edits).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import sim.runtime.cachefiles as cachefiles
import sim.runtime.deviceops as deviceops
import sim.runtime.edits as edits
import sim.runtime.tracing as tracing
from models.compiler import CompiledModel
from sim.runtime.accelerator import Accelerator
from sim.runtime.cacheops import CacheOpError, CacheView, EditFn, EditResult
from sim.runtime.checks import (
    check_all_logits,
    check_bufs,
    check_filter_tail,
    check_infer,
    check_move_tail,
    check_outputs,
    check_slot,
)
from sim.runtime.errors import RuntimeApiError
from sim.runtime.types import BatchParam, BufferInfo, CacheInfo, CallRecord, ModelConfig


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
        #: The shape of the latest forward call: (tokens, cache size, slot).
        self.last_call: tuple[int, int, int] | None = None
        #: The compiled model with a batched step's regions (:func:`.deviceops.
        #: batch_compiled`; set at launch), or None: batches run request by request.
        self.batched: CompiledModel | None = None
        #: The compiled model with the regions of all-position logits (set at launch when
        #: ``ModelConfig.all_logits``), or None.
        self.wide: CompiledModel | None = None
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
        tracing.notify("launching", acc, self)
        self.wide, self.batched = deviceops.step_models(cm, hw, all_logits=bool(
            self.model_config.all_logits))
        deviceops.load_weights(self, acc)
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
    def infer(self, inputs: Any, outputs: list | None = None, cache_size: int = 0,
              batch_params: list[BatchParam] | None = None, *, cache_id: int = 0,
              batch_param: BatchParam | None = None,
              all_logits: bool = False,
              position: int | None = None) -> list[np.ndarray | None] | None:
        """Run input embeddings at cache positions ``cache_size .. cache_size+seq-1``.

        The vendor's forms: ``inputs`` a list of one float32 array of shape ``(1, 1, seq,
        hidden)`` (or the bare array); the result is ``[logits]`` of shape ``(1, 1, 1,
        vocab)``, the last token's (``out[0][0, 0, -1, :]``). With ``outputs`` the logits
        go there and the call returns None, as the vendor's does: an empty list is filled,
        a list of one preallocated ``(1, 1, 1, vocab)`` float32 array is written in place.
        Batch LLM: ``infer(inputs, None, 0, batch_params)`` with one ``BatchParam
        (sequence_length, cache_size, cache_id)`` per request, the requests' tokens one
        after another on the sequence axis, returns ``[(1, 1, n_requests, vocab)]``.

        kvsim's form (kept): a 2-D ``(seq, hidden)`` array returns ``[logits]`` of shape
        ``(vocab,)``; ``outputs``, if a list, is replaced by ``[logits]``; ``cache_id`` or
        ``batch_param`` (one ``BatchParam``) selects the slot. In timing-only mode the
        logits are None.

        ``all_logits`` (kvsim's, for teacher forcing; the model must be launched with
        ``ModelConfig(all_logits=True)``): one request's logits of every position, shape
        ``(seq, vocab)`` (vendor form ``(1, 1, seq, vocab)``); the LM head runs over every
        token and every row crosses the host link, so the call costs more.

        ``position`` (kvsim's, for cache evictions): the RoPE position of the first token,
        ``cache_size`` or beyond (default ``cache_size``, as on the vendor's runtime). After
        an eviction the next tokens may keep the text's positions, the kept keys' distances
        unchanged (H2O and SnapKV keep them so); the program loads other rows of the RoPE
        tables, nothing else changes.

        Cost: runtime overhead + embeddings over the host link + the forward program
        (weights and the cache streamed from DRAM) + logits back over the host link. A
        batch of a GQA model compiled with several cache slots is **one batched device
        program** (``models.compiler.driver.lower_step``: the weights stream once per token
        tile of the whole batch; its logits equal per-request calls bit for bit). MLA and
        MoE models (their batched stages are timing-only) run a batch **as consecutive
        per-request programs**: results exact, but no batching benefit in the time.
        """
        self._check_alive()
        cm = self.compiled
        call = check_infer(cm, inputs, cache_size, cache_id, batch_params, batch_param,
                           position)
        n, vocab = len(call.requests), cm.model.vocab_size
        if all_logits is not False:
            check_all_logits(all_logits, self.wide is not None, n)
            n = call.requests[0].x.shape[0]
        check_outputs(outputs, (1, 1, n, vocab) if call.vendor else None)
        if all_logits:
            logits = [deviceops.forward(self, call.requests[0], all_logits=True)]
            if call.vendor and logits[0] is not None:
                logits = list(logits[0])
        elif len(call.requests) > 1 and self.batched is not None:
            logits = deviceops.forward_batch(self, call.requests)
        else:
            logits = [deviceops.forward(self, r) for r in call.requests]
        if not call.vendor:
            if outputs is not None:
                outputs.clear()
                outputs.append(logits[0])
            return [logits[0]]
        arr = None if logits[0] is None else np.stack(logits)[None, None]
        if outputs is None:
            return [arr]
        if outputs and arr is not None:
            outputs[0][...] = arr
        elif not outputs:
            outputs.append(arr)
        return None

    def infer_speedrun(self) -> float:
        """Development only (as the vendor's): the NPU time of the latest ``infer``'s
        program (one token at cache size 0 before any) without the upload of inputs or the
        download of outputs; the cache is left as it was. Returns the simulated seconds
        (the vendor's returns nothing; the time is also in ``acc.calls[-1]``)."""
        self._check_alive()
        tokens, cache_size, cache_id = self.last_call or (1, 0, 0)
        return deviceops.speedrun(self, tokens, cache_size, cache_id)

    # --- what the model is ---------------------------------------------------------------
    def get_input_buffer_info(self) -> list[BufferInfo]:
        """The model's one input: ``[BufferInfo(max_height=1, max_width=max tokens per
        call, max_channel=hidden, max_cache_size=KV capacity in tokens)]``."""
        self._check_alive(launched=False)
        cm = self.compiled
        return [BufferInfo(max_height=1, max_width=cm.max_seq,
                           max_channel=cm.model.hidden_size, max_cache_size=cm.cap)]

    def get_core_mode(self) -> str:
        return self.compiled.core_mode

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

    # --- caches ---------------------------------------------------------------------------
    def _slot(self, cache_id: Any) -> int | None:
        return None if cache_id is None else check_slot(self.compiled, cache_id)

    def dump_cache_memory(self, cache_id: int | None = None) -> list[bytes]:
        """The bytes of every cache (``get_cache_infos`` order): of slot ``cache_id``
        (``size`` bytes each), or with ``cache_id=None`` of every slot concatenated
        (``size * num_batches``). Cost: the runtime call, then those bytes cross the host
        link device-to-host. In timing-only mode the bytes are zeros (their transfer is
        still simulated)."""
        self._check_alive()
        return deviceops.dump(self, self._slot(cache_id))

    def load_cache_memory(self, bufs: Any, cache_id: int | None = None) -> None:
        """Overwrite every cache (of slot ``cache_id``; None: every slot) with ``bufs`` as
        ``dump_cache_memory`` returns them. Every buffer is checked first (count, sizes): a
        refused load changes nothing. Cost: the runtime call, then every byte crosses the
        host link host-to-device."""
        self._check_alive()
        slot = self._slot(cache_id)
        deviceops.load(self, check_bufs(bufs, self.get_cache_infos(), slot), slot)

    def dump_cache_memory_to(self, directory: str | Path,
                             cache_id: int | None = None) -> list[Path]:
        """``dump_cache_memory(cache_id)`` into one file per cache, ``cache_<layer_hash>.bin``,
        each with a header (format version, model and KV-format identity, cache name, size,
        slot, CRC-32 of the bytes). Files are written atomically."""
        self._check_alive()
        return cachefiles.dump_to(self, directory, self._slot(cache_id))

    def load_cache_memory_from(self, directory: str | Path, cache_id: int | None = None) -> None:
        """Load the files ``dump_cache_memory_to`` wrote (into slot ``cache_id``; None: a
        whole-model dump into every slot). Every file is checked first (present, header,
        model and format identity, name, size, checksum); any problem refuses the whole
        load and leaves the device cache as it was."""
        self._check_alive()
        cachefiles.load_from(self, directory, self._slot(cache_id))

    def reset_cache_memory(self) -> None:
        """Clear every cache (the host's ``cache_size`` goes back to 0)."""
        self._check_alive()
        deviceops.reset(self)

    # --- one cache at a time (the vendor's 1.5 calls) --------------------------------------
    def _cache_index(self, key: str, value: Any) -> int:
        if not isinstance(value, str):
            raise CacheOpError(f"{key} must be a string, got {type(value).__name__} {value!r}")
        infos = self.get_cache_infos()
        for i, info in enumerate(infos):
            if getattr(info, key) == value:
                return i
        shown = ", ".join(repr(getattr(c, key)) for c in infos[:4])
        raise CacheOpError(f"no KV cache has {key} {value!r} (the model's {len(infos)} "
                           f"caches: {shown}, ...)")

    def dump_cache_memory_by_name(self, name: str, cache_id: int = 0) -> bytes:
        """The bytes of the one cache named ``name`` (``CacheInfo.name``), slot
        ``cache_id``. Cost: the runtime call and that cache's bytes device-to-host."""
        self._check_alive()
        i, slot = self._cache_index("name", name), check_slot(self.compiled, cache_id)
        return deviceops.dump(self, slot, [i], "dump_cache_memory_by_name")[0]

    def dump_cache_memory_by_layer_hash(self, layer_hash: str, cache_id: int = 0) -> bytes:
        """As :meth:`dump_cache_memory_by_name`, the cache picked by ``CacheInfo.layer_hash``."""
        self._check_alive()
        i, slot = self._cache_index("layer_hash", layer_hash), check_slot(self.compiled,
                                                                          cache_id)
        return deviceops.dump(self, slot, [i], "dump_cache_memory_by_layer_hash")[0]

    def load_cache_memory_by_name(self, buf: Any, name: str, cache_id: int = 0) -> None:
        """Overwrite the one cache named ``name`` (slot ``cache_id``) with ``buf`` (its
        size in bytes); the other caches are left as they are."""
        self._load_one(buf, "name", name, cache_id, "load_cache_memory_by_name")

    def load_cache_memory_by_layer_hash(self, buf: Any, layer_hash: str,
                                        cache_id: int = 0) -> None:
        """As :meth:`load_cache_memory_by_name`, the cache picked by its layer hash."""
        self._load_one(buf, "layer_hash", layer_hash, cache_id,
                       "load_cache_memory_by_layer_hash")

    def _load_one(self, buf: Any, key: str, value: str, cache_id: Any, op: str) -> None:
        self._check_alive()
        i, slot = self._cache_index(key, value), check_slot(self.compiled, cache_id)
        [data] = check_bufs([buf], [self.get_cache_infos()[i]], slot)
        deviceops.load(self, [data], slot, [i], op)

    def reset_fixed_tail_cache_memory(self, cache_id: int = 0) -> None:
        """Zero every fixed-tail cache of slot ``cache_id``, leaving the others. kvsim reads
        the vendor's fixed-tail caches as the rings of sliding-window layers (a fixed
        number of the latest tokens: ``KvCacheSpec.window``); a model without such layers
        has none, and the call then clears nothing and costs the runtime call."""
        self._check_alive()
        slot = check_slot(self.compiled, cache_id)
        fixed = [c for c in self.compiled.kv_caches(slot) if c.window is not None]
        deviceops.reset(self, fixed, "reset_fixed_tail_cache_memory")

    def filter_cache_tail(self, cache_size: int, tail_size: int, mask, *,
                          cache_id: int = 0) -> int:
        """Keep the last ``tail_size`` (<= 32) tokens whose ``mask`` entry is true, drop
        the others and shift the kept ones forward; returns the new cache size. Cost: the
        runtime call and an on-device DRAM-to-DRAM program over every cache (KvRead of the
        kept tokens, KvWrite at their new positions)."""
        self._check_alive()
        f = check_filter_tail(self.compiled, cache_size, tail_size, mask, cache_id)
        deviceops.rearrange(self, "filter_cache_tail", f.keep, f.first, f.cache_id,
                            cache_size=f.cache_size)
        return f.first + len(f.keep)

    def move_cache_tail(self, num_head: int, num_tail: int, cache_size: int, *,
                        cache_id: int = 0) -> int:
        """Move the last ``num_tail`` tokens to position ``num_head`` (dropping the tokens
        between); returns the new cache size ``num_head + num_tail``. Cost: as
        ``filter_cache_tail``."""
        self._check_alive()
        num_head, num_tail, cache_size, cache_id = check_move_tail(
            self.compiled, num_head, num_tail, cache_size, cache_id)
        keep = list(range(cache_size - num_tail, cache_size))
        deviceops.rearrange(self, "move_cache_tail", keep, num_head, cache_id,
                            cache_size=cache_size)
        return num_head + num_tail

    # --- host-side and on-device edits (kvsim's own) ------------------------------------
    def _views(self, bufs: list[bytes], cache_size: int, cache_id: int) -> list[CacheView]:
        return edits.cache_views(self, bufs, cache_size, cache_id)

    def edit_cache_on_host(self, fn: EditFn, *, cache_size: int, cache_id: int = 0,
                           mode: str = "model", op: str = "host_edit") -> EditResult:
        """See :func:`.edits.edit_on_host`: dump over PCIe, ``fn(views)``, load back."""
        self._check_alive()
        return edits.edit_on_host(self, fn, cache_size=cache_size, cache_id=cache_id,
                                  mode=mode, op=op)

    def evict_on_device(self, drop, *, cache_size: int, cache_id: int = 0,
                        op: str = "device_evict") -> EditResult:
        """See :func:`.edits.evict_on_device`: drop positions with an on-device program."""
        self._check_alive()
        return edits.evict_on_device(self, drop, cache_size=cache_size, cache_id=cache_id,
                                     op=op)

    def requantize_on_device(self, via, *, cache_size: int, cache_id: int = 0,
                             op: str = "device_requantize") -> EditResult:
        """See :func:`.edits.requantize_on_device`: pass the cache through format ``via``."""
        self._check_alive()
        return edits.requantize_on_device(self, via, cache_size=cache_size,
                                          cache_id=cache_id, op=op)


__all__ = ["CallRecord", "Model"]
