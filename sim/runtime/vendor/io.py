"""The inputs and outputs of an LLM ``infer`` in the vendor runtime's forms.

An LLM's one input is its token embeddings with model input shape ``(1, -1, hidden)``
(height 1, a variable width of tokens, the hidden size as channels); a call passes an
array of that shape in HWC ``(1, seq, hidden)`` or CHW ``(hidden, 1, seq)`` order, with or
without a leading batch axis of 1 (a batch of requests goes on the sequence axis, with
``BatchParam`` s). The one output is the logits, ``(1, 1, vocab)`` per request: a call
returns ``(1, n, vocab)`` for ``n`` requests, with the batch axis when the input had one,
in the input's order (CHW: ``(vocab, 1, n)``). A list passed as ``outputs`` is filled (an
empty one) or written in place (one preallocated array of that shape and the input's
dtype), and the call returns None, as the vendor's does.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sim.runtime.errors import RuntimeApiError


class Inputs(NamedTuple):
    x: np.ndarray  # float32 (1, 1, seq, hidden): kvsim's runtime's vendor form
    batch_axis: bool  # the caller's array had the leading batch axis
    chw: bool  # the caller's array was in CHW order
    dtype: np.dtype


def parse_inputs(inputs: Any, hidden: int, layout: str | None) -> Inputs:
    """The embeddings of ``inputs`` (``layout``: ``"hwc"``, ``"chw"`` or None, either)."""
    arrays = inputs if isinstance(inputs, list) else [inputs]
    if len(arrays) != 1:
        raise RuntimeApiError(f"Input shape is invalid.: the model has 1 input (the token "
                              f"embeddings), got {len(arrays)} arrays")
    try:
        x = np.asarray(arrays[0])
    except (TypeError, ValueError) as err:
        raise RuntimeApiError(f"Input shape is invalid.: not an array ({err})") from None
    batch_axis = x.ndim == 4
    core = x.shape[1:] if batch_axis else x.shape
    if x.ndim not in (3, 4) or (batch_axis and x.shape[0] != 1):
        raise RuntimeApiError(f"Input shape is invalid.: {x.shape}; the model input is "
                              f"(1, -1, {hidden}) as HWC (1, seq, {hidden}) or CHW ({hidden}, "
                              f"1, seq), with an optional leading batch axis of 1")
    hwc = core[0] == 1 and core[2] == hidden and core[1] >= 1
    chw = core[0] == hidden and core[1] == 1 and core[2] >= 1
    if layout == "hwc" and not hwc or layout == "chw" and not chw or not (hwc or chw):
        want = {"hwc": f"(1, seq, {hidden})", "chw": f"({hidden}, 1, seq)"}.get(
            layout or "", f"(1, seq, {hidden}) or ({hidden}, 1, seq)")
        raise RuntimeApiError(f"Input shape is invalid.: {x.shape}, expected {want}")
    is_chw = not hwc if layout is None else layout == "chw"
    seq_first = x.reshape(core)
    if is_chw:
        seq_first = seq_first.transpose(1, 2, 0)  # (hidden, 1, seq) -> (1, seq, hidden)
    return Inputs(np.ascontiguousarray(seq_first, dtype=np.float32)[None], batch_axis, is_chw,
                  x.dtype)


def shaped(logits: np.ndarray, inp: Inputs) -> np.ndarray:
    """``(1, 1, n, vocab)`` logits in the caller's form."""
    out = logits[0]  # (1, n, vocab)
    if inp.chw:
        out = out.transpose(2, 0, 1)  # (vocab, 1, n)
    return np.ascontiguousarray(out[None] if inp.batch_axis else out)


def _out_dtype(inp: Inputs) -> np.dtype:
    return inp.dtype if inp.dtype.kind == "f" else np.dtype(np.float32)


def check_outputs(outputs: Any, inp: Inputs, rows: int, vocab: int) -> None:
    """Refuse, before the call runs, an ``outputs`` the call could not fill."""
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise RuntimeApiError(f"outputs must be a list or None, got {type(outputs).__name__}")
    if not outputs:
        return
    want = shaped(np.zeros((1, 1, rows, vocab), np.float32), inp).shape
    dtype = _out_dtype(inp)
    if len(outputs) != 1:
        raise RuntimeApiError("The number of outputs is different.: the model has 1 output, "
                              f"got {len(outputs)}")
    dst = outputs[0]
    if not isinstance(dst, np.ndarray) or dst.dtype != dtype:
        raise RuntimeApiError(f"Output dtype mismatch.: outputs[0] must be a {dtype} "
                              f"array, got {getattr(dst, 'dtype', type(dst).__name__)}")
    if dst.shape != want:
        raise RuntimeApiError(f"Output shape mismatch.: outputs[0] is {dst.shape}, the call "
                              f"gives {want}")


def deliver(outputs: list | None, logits: np.ndarray, inp: Inputs) -> list[np.ndarray] | None:
    """The call's return value: ``[logits]``, or None with ``outputs`` (checked by
    :func:`check_outputs`) filled."""
    out = shaped(logits, inp).astype(_out_dtype(inp))
    if outputs is None:
        return [out]
    if not outputs:
        outputs.append(out)
        return None
    dst = outputs[0]
    if not dst.flags.c_contiguous:
        outputs[0] = dst = np.ascontiguousarray(dst)
    dst[...] = out
    return None


__all__ = ["Inputs", "check_outputs", "deliver", "parse_inputs", "shaped"]
