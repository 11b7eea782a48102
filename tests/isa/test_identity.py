"""Object ids in bulk (isa.identity): read from an object array's references on CPython,
from ``id`` elsewhere; the same keys either way."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from isa import identity
from isa.identity import object_array, object_ids
from isa.instructions import DmaLoad, Gemm, Nop


@pytest.mark.parametrize("addresses", [True, False])
def test_object_ids_are_the_objects_ids(monkeypatch, addresses):
    monkeypatch.setattr(identity, "IDS_ARE_ADDRESSES", addresses and identity.IDS_ARE_ADDRESSES)
    load = DmaLoad(src=0, dst=0, nbytes=64)
    objs = [load, Gemm(m=1, k=32, n=8, w_bits=8, a=0, w=64, out=128), Nop(on=1), load, (), 7, "x"]
    want = [id(o) for o in objs]
    assert object_ids(objs).tolist() == want
    assert object_ids(tuple(objs)).tolist() == want
    held = np.fromiter(objs, object, len(objs))
    assert object_ids(held).tolist() == want
    assert object_ids(held[::-2]).tolist() == want[::-2]  # not contiguous
    assert object_ids([]).dtype == np.int64 and len(object_ids(())) == 0


@pytest.mark.parametrize("addresses", [True, False])
def test_the_ids_cannot_be_written(monkeypatch, addresses):
    # a view of the array's references on CPython: writing to it would replace objects
    monkeypatch.setattr(identity, "IDS_ARE_ADDRESSES", addresses and identity.IDS_ARE_ADDRESSES)
    held = object_array([Nop(on=1), Nop(on=2)])
    ids = object_ids(held)
    with pytest.raises(ValueError, match="read-only"):
        ids[:] = 0
    assert [type(o) for o in held] == [Nop, Nop] and held[1].on == 2


def test_an_object_array_is_kept_and_a_sequence_becomes_one():
    held = np.fromiter([1, 2, 3], object, 3)
    assert object_array(held) is held
    assert object_array((1, 2)).dtype == object and object_array([]).shape == (0,)


def test_ids_are_read_as_addresses_on_cpython():
    assert identity.IDS_ARE_ADDRESSES == (sys.implementation.name == "cpython")
