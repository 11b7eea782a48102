"""Argument checks of the runtime calls: every call checks all of its arguments before it
does any work, so a refused call changes nothing (no device time, no cache bytes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sim.runtime.cacheops import CacheOpError
from sim.runtime.errors import RuntimeApiError, index, is_index
from sim.runtime.types import BatchParam

#: The vendor's filter_cache_tail handles at most this many tail tokens (FACTS.md).
FILTER_TAIL_MAX = 32


def folder(directory: Any, where: str) -> Path:
    if not isinstance(directory, str | os.PathLike):
        raise CacheOpError(f"{where}: directory must be a path (str or os.PathLike), got "
                           f"{type(directory).__name__} {directory!r}")
    return Path(directory)


class Request(NamedTuple):
    """One sequence of an ``infer`` call: its embeddings, cache size and cache slot;
    ``position``: the RoPE position of its first token when not the cache size."""

    x: np.ndarray  # float32 (tokens, hidden)
    cache_size: int
    cache_id: int
    position: int | None = None

    @property
    def shift(self) -> int:
        """How far its RoPE positions lie beyond its cache positions."""
        return 0 if self.position is None else self.position - self.cache_size


class InferCall(NamedTuple):
    """A checked ``infer`` call: its sequences and the shape its results take."""

    requests: list[Request]
    vendor: bool  # vendor-shaped logits (1, 1, n, vocab) rather than kvsim's (vocab,)


def _embeddings(inputs: Any) -> tuple[np.ndarray, bool, str, tuple[int, ...]]:
    """The float32 ``(tokens, hidden)`` embeddings of ``inputs``, whether they came in
    the vendor's form (a list of one array, or a 3-/4-D array), and what the caller gave:
    its name in messages (``inputs[0]`` for the array in a list) and its shape."""
    vendor = isinstance(inputs, list | tuple)
    name = "inputs[0]" if vendor else "inputs"
    if vendor:
        if len(inputs) != 1:
            raise RuntimeApiError(f"inputs: the model has 1 input (the embeddings), got a "
                                    f"list of {len(inputs)} arrays")
        inputs = inputs[0]
    try:
        raw = np.asarray(inputs)
        if raw.dtype.kind == "c":
            raise RuntimeApiError("inputs: complex values; expected real float32 "
                                    "embeddings")
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as err:
        if isinstance(err, RuntimeApiError):
            raise
        raise RuntimeApiError(f"{name}: not float32 embeddings ({err})") from None
    given = tuple(x.shape)
    if x.ndim == 4:
        if x.shape[:2] != (1, 1):
            raise RuntimeApiError(f"{name}: shape {x.shape}, expected (1, 1, seq, hidden) "
                                    f"(batch 1: a batch of requests goes on the sequence "
                                    f"axis, with batch_params)")
        x = x[0, 0]
        vendor = True
    elif x.ndim == 3:
        if x.shape[0] != 1:
            raise RuntimeApiError(f"{name}: shape {x.shape}, expected (1, seq, hidden)")
        x = x[0]
        vendor = True
    return x, vendor, name, given


def check_infer(cm: Any, inputs: Any, cache_size: Any, cache_id: Any, batch_params: Any,
                batch_param: Any, position: Any = None) -> InferCall:
    """Check an ``infer`` call against the compiled model ``cm``."""
    if batch_params is not None and batch_param is not None:
        raise RuntimeApiError("infer: give batch_params (a list, one per request) or "
                              "batch_param (one), not both")
    seq_len = None
    if batch_param is not None:
        if not isinstance(batch_param, BatchParam):
            raise RuntimeApiError(f"batch_param must be a BatchParam(sequence_length, "
                                  f"cache_size, cache_id) or None, got "
                                  f"{type(batch_param).__name__} {batch_param!r}")
        cache_size, cache_id = batch_param.cache_size, batch_param.cache_id
        seq_len = index(batch_param.sequence_length, "batch_param.sequence_length")
    x, vendor, name, given = _embeddings(inputs)
    h = cm.model.hidden_size
    if x.ndim != 2 or x.shape[1] != h or x.shape[0] < 1:
        # the shape the caller gave, against the form of the same rank
        want = {4: f"(1, 1, seq, {h})", 3: f"(1, seq, {h})"}.get(len(given), f"(seq, {h})")
        raise RuntimeApiError(f"{name}: shape {given}, expected {want} float32 embeddings "
                              f"(seq >= 1; or a list of one (1, 1, seq, {h}) array)")
    if not np.isfinite(x).all():
        raise RuntimeApiError("inputs: contain NaN or inf (as float32: finite float64 "
                              "values beyond about 3.4e38 overflow to inf)")
    if batch_params is None:
        if seq_len is not None and seq_len != x.shape[0]:
            raise RuntimeApiError(f"batch_param.sequence_length {seq_len} "
                                  f"does not match the {x.shape[0]} input tokens")
        req = Request(x, index(cache_size, "cache_size"), index(cache_id, "cache_id"))
        _check_request(cm, req, "")
        if position is not None:
            req = req._replace(position=_position(cm, req, position))
        return InferCall([req], vendor)
    if position is not None:
        raise RuntimeApiError("infer: position takes one request, not batch_params")
    return InferCall(_batch(cm, x, cache_size, batch_params), True)


def _position(cm: Any, r: Request, position: Any) -> int:
    """``infer(position=...)``: the RoPE position of the first token, from the cache size
    on (kvsim's: after an eviction the tokens may keep the text's positions)."""
    pos = index(position, "position")
    seq = r.x.shape[0]
    if pos < r.cache_size:
        raise RuntimeApiError(f"infer: position {pos} is below cache_size {r.cache_size} (the "
                              f"RoPE position of the first token: the cache size or beyond)")
    if pos + seq > cm.cap:
        raise RuntimeApiError(f"infer: position {pos} + {seq} tokens exceed the {cm.cap} "
                              f"positions of the model's RoPE tables (its cache capacity)")
    if pos != r.cache_size and cm.model.is_mla:
        raise RuntimeApiError(f"infer: position {pos} beyond cache_size {r.cache_size}: MLA "
                              f"models take none (their RoPE key is cached with its position)")
    return pos


def _batch(cm: Any, x: np.ndarray, cache_size: Any, batch_params: Any) -> list[Request]:
    if not isinstance(batch_params, list | tuple) or not batch_params:
        raise RuntimeApiError(f"batch_params must be a non-empty list of BatchParam, got "
                              f"{batch_params!r}")
    if index(cache_size, "cache_size") != 0:
        raise RuntimeApiError(f"cache_size {cache_size} with batch_params: pass 0 (each "
                              f"BatchParam carries its request's cache size)")
    out, start, slots = [], 0, set()
    for i, bp in enumerate(batch_params):
        where = f"batch_params[{i}]"
        if not isinstance(bp, BatchParam):
            raise RuntimeApiError(f"{where} must be a BatchParam(sequence_length, cache_size, "
                                  f"cache_id), got {type(bp).__name__} {bp!r}")
        n = index(bp.sequence_length, f"{where}.sequence_length")
        if n < 1:
            raise RuntimeApiError(f"{where}.sequence_length {n} must be >= 1")
        req = Request(x[start:start + n], index(bp.cache_size, f"{where}.cache_size"),
                      index(bp.cache_id, f"{where}.cache_id"))
        if req.cache_id in slots:
            raise RuntimeApiError(f"{where}.cache_id {req.cache_id}: two requests of one "
                                  f"batch use the same cache slot")
        slots.add(req.cache_id)
        start += n
        if start <= x.shape[0]:
            _check_request(cm, req, f"{where}.")
        out.append(req)
    if start > cm.max_seq:
        raise RuntimeApiError(f"batch_params: a batch of {start} tokens exceeds "
                              f"max_sequence_length {cm.max_seq} (the input buffer of one "
                              f"call)")
    if start != x.shape[0]:
        raise RuntimeApiError(f"batch_params: sequence lengths add up to {start} tokens, the "
                              f"inputs hold {x.shape[0]} (requests go one after another on "
                              f"the sequence axis)")
    return out


def _check_request(cm: Any, r: Request, where: str) -> None:
    seq = r.x.shape[0]
    if seq > cm.max_seq:
        raise RuntimeApiError(f"inputs: {seq} tokens exceed max_sequence_length "
                              f"{cm.max_seq}; prefill in chunks with growing cache_size")
    if r.cache_size < 0:
        raise RuntimeApiError(f"{where}cache_size must be an integer >= 0, got {r.cache_size} "
                              f"(the tokens already in the cache)")
    if r.cache_size + seq > cm.cap:
        raise RuntimeApiError(f"{where}cache_size {r.cache_size} + {seq} tokens exceed the "
                              f"cache capacity of {cm.cap} tokens")
    if not 0 <= r.cache_id < cm.slots:
        raise RuntimeApiError(f"{where}cache_id {r.cache_id} out of range 0..{cm.slots - 1}")


def check_all_logits(all_logits: Any, reserved: bool, requests: int) -> None:
    """``infer(..., all_logits=True)``: a bool, one request, regions reserved at launch."""
    if not isinstance(all_logits, bool):
        raise RuntimeApiError(f"infer: all_logits must be True or False, got {all_logits!r}")
    if all_logits and requests != 1:
        raise RuntimeApiError(f"infer: all_logits takes one request, got {requests}")
    if all_logits and not reserved:
        raise RuntimeApiError("infer: all_logits needs the model launched with "
                              "ModelConfig(all_logits=True)")


def check_outputs(outputs: Any, shape: tuple[int, ...] | None) -> None:
    """``outputs``: None, a list to fill (empty), or the vendor's preallocated list of one
    float32 array of ``shape`` (written in place)."""
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise RuntimeApiError(f"outputs must be a list (the logits are put in it) or None, "
                              f"got {type(outputs).__name__}")
    if not outputs or shape is None:  # filled by the call (kvsim style: replaced)
        return
    if len(outputs) != 1:
        raise RuntimeApiError(f"outputs: the model has 1 output (the logits), got a list "
                                f"of {len(outputs)}")
    out = outputs[0]
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise RuntimeApiError(f"outputs[0]: expected a float32 array, got "
                                f"{getattr(out, 'dtype', type(out).__name__)}")
    if out.shape != shape:
        raise RuntimeApiError(f"outputs[0]: shape {out.shape}, expected {shape}")


def check_size(cm: Any, cache_size: Any, cache_id: Any) -> tuple[int, int]:
    """``(cache_size, cache_id)`` as Python ints, checked against the compiled model."""
    if not is_index(cache_size) or not 0 <= cache_size <= cm.cap:
        raise CacheOpError(f"cache_size {cache_size!r} must be an integer in 0..{cm.cap}")
    return int(cache_size), check_slot(cm, cache_id)


def check_slot(cm: Any, cache_id: Any) -> int:
    if not is_index(cache_id) or not 0 <= cache_id < cm.slots:
        raise CacheOpError(f"cache_id {cache_id} out of range 0..{cm.slots - 1}")
    return int(cache_id)


def check_mask(mask: Any, tail_size: int) -> list[bool]:
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


def check_tail_size(tail_size: Any) -> int:
    if not is_index(tail_size):
        raise CacheOpError(f"filter_cache_tail: tail_size must be an integer 1.."
                           f"{FILTER_TAIL_MAX}, got {tail_size!r}")
    tail_size = int(tail_size)
    if not 1 <= tail_size <= FILTER_TAIL_MAX:
        raise CacheOpError(f"filter_cache_tail: tail_size {tail_size} must be 1.."
                           f"{FILTER_TAIL_MAX}")
    return tail_size


class TailFilter(NamedTuple):
    """A checked ``filter_cache_tail``: the cache, and the positions it keeps from
    ``first`` on (the tail starts there; the kept tokens move up to it)."""

    cache_size: int
    cache_id: int
    first: int
    keep: list[int]


def check_filter_tail(cm: Any, cache_size: Any, tail_size: Any, mask: Any,
                      cache_id: Any) -> TailFilter:
    """The arguments of ``filter_cache_tail``: a tail of 1..32 tokens, a mask of one bool
    per tail token, a cache size and slot of the model, a tail no longer than the cache."""
    tail_size = check_tail_size(tail_size)
    m = check_mask(mask, tail_size)
    cache_size, cache_id = check_size(cm, cache_size, cache_id)
    if tail_size > cache_size:
        raise CacheOpError(f"filter_cache_tail: tail_size {tail_size} exceeds cache_size "
                           f"{cache_size}")
    first = cache_size - tail_size
    return TailFilter(cache_size, cache_id, first, [first + i for i, k in enumerate(m) if k])


def check_move_tail(cm: Any, num_head: Any, num_tail: Any, cache_size: Any,
                    cache_id: Any) -> tuple[int, int, int, int]:
    """The arguments of ``move_cache_tail``: ``(num_head, num_tail, cache_size,
    cache_id)``, integers >= 0 whose head and tail fit in the cache."""
    cache_size, cache_id = check_size(cm, cache_size, cache_id)
    for name, v in (("num_head", num_head), ("num_tail", num_tail)):
        if not is_index(v) or v < 0:
            raise CacheOpError(f"move_cache_tail: {name} must be an integer >= 0, got {v!r}")
    num_head, num_tail = int(num_head), int(num_tail)
    if num_head + num_tail > cache_size:
        raise CacheOpError(f"move_cache_tail: num_head {num_head} + num_tail {num_tail} "
                           f"exceed cache_size {cache_size}")
    return num_head, num_tail, cache_size, cache_id


def check_bufs(bufs: Any, infos: list, slot: int | None) -> list[bytes]:
    """The buffers of a ``load_cache_memory``: one per cache, each of one slot's bytes
    (``slot`` given) or of every slot's."""
    if not isinstance(bufs, list | tuple):
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
        want = info.size * (1 if slot is not None else info.num_batches)
        if len(data) != want:
            what = f"slot {slot} of the cache" if slot is not None else "the cache"
            raise CacheOpError(f"load_cache_memory: buffer {i} ({info.name}) has "
                               f"{len(data)} bytes, {what} takes {want}")
        out.append(data)
    return out


__all__ = ["FILTER_TAIL_MAX", "InferCall", "Request", "check_bufs", "check_infer",
           "check_mask", "check_outputs", "check_size", "check_slot", "check_tail_size",
           "folder"]
