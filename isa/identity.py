"""Object identities in bulk: the ``id`` of every object of a sequence as an ``int64``
array, the keys by which validation remembers checked instructions
(:func:`isa.validate.validate_program`) and the row cache finds an instruction's row
(:class:`sim.device.engine.rows.RowCache`).

On CPython an object's ``id`` is its address, which is what a numpy object array holds
for each element, so the ids are read from the array's memory instead of calling ``id``
per object (about 8 times faster on the 22,570 instructions of a decode step: 0.4 ms
against 3.0 ms). Whether that holds is probed once at import; elsewhere the ids come from
``id`` itself. The objects must stay alive while their ids are used as keys: callers hold
them (the object array, or the instructions themselves)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

__all__ = ["IDS_ARE_ADDRESSES", "object_array", "object_ids"]


def object_array(objs: Sequence[object] | np.ndarray) -> np.ndarray:
    """``objs`` as a one-dimensional, contiguous numpy object array (the array itself when
    it already is one)."""
    if isinstance(objs, np.ndarray) and objs.dtype == object:
        return np.ascontiguousarray(objs)
    return np.fromiter(objs, object, len(objs))


def _held(objs: np.ndarray) -> np.ndarray:
    """The references a contiguous object array holds, as integers: a read-only view of
    its memory, which keeps the array (and so the objects) alive and cannot write to its
    references. A view, not a copy: a Llama-3.1-8B prefill holds 13.6 million
    instructions, whose ids take 109 MB."""
    if not len(objs):
        return np.zeros(0, np.int64)
    ids = np.frombuffer(objs, np.int64)
    ids.flags.writeable = False
    return ids


def _ids_are_addresses() -> bool:
    probe = [object(), 1.5, "kvsim", (), _held]
    a = object_array(probe)
    return (sys.implementation.name == "cpython" and a.itemsize == 8
            and _held(a).tolist() == list(map(id, probe)))


#: Whether an object's ``id`` is the reference an object array holds (CPython's): then
#: :func:`object_ids` reads the ids from the array.
IDS_ARE_ADDRESSES = _ids_are_addresses()


def object_ids(objs: Sequence[object] | np.ndarray) -> np.ndarray:
    """``id(o)`` of each object ``o`` of ``objs`` (a sequence, or an object array), as
    ``int64`` (read-only)."""
    held = object_array(objs)
    if IDS_ARE_ADDRESSES:
        return _held(held)
    ids = np.fromiter(map(id, held), np.int64, len(held))
    ids.flags.writeable = False
    return ids
