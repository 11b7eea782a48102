"""Host edits and cache operations: what valid input does (in-place edits are applied,
format names work, numpy positions work), and refusals that need more than the bad-input
table's harness (timing-only mode, an unwritable folder)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from isa import kvformats
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model
from sim.runtime.cacheops import CacheOpError, requantize_through

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")


def _cm(**kw):
    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(TINY_HW), kv="int8",
                         core_mode="single", max_seq=16, cap=64, **kw)


@pytest.fixture(scope="module")
def cm():
    return _cm()


@pytest.fixture(scope="module")
def emb():
    return np.random.default_rng(0).standard_normal((48, TINY.hidden_size)).astype(np.float32)


def _launched(cm, emb, tokens=32, **acc_kw):
    acc = Accelerator(hw=TINY_HW, **acc_kw)
    model = Model(cm)
    model.launch(acc)
    for a in range(0, tokens, 16):
        model.infer(emb[a:a + 16], cache_size=a)
    return acc, model


def _bump(values: np.ndarray) -> None:
    """An in-place change: token 5 of every head set to a constant."""
    values[5] = 7


def test_in_place_edits_returning_none_are_applied(cm, emb):
    _, inplace = _launched(cm, emb)
    _, returned = _launched(cm, emb)
    _, plain = _launched(cm, emb)

    def edit_in_place(views):
        for v in views:
            _bump(v.values)

    def edit_returning(views):
        out = []
        for v in views:
            new = v.values.copy()
            _bump(new)
            out.append(new)
        return out

    r = inplace.edit_cache_on_host(edit_in_place, cache_size=32)
    returned.edit_cache_on_host(edit_returning, cache_size=32)
    assert r.new_cache_size == 32
    assert inplace.dump_cache_memory() == returned.dump_cache_memory()
    assert inplace.dump_cache_memory() != plain.dump_cache_memory()


def test_in_place_edits_of_returned_views_are_applied(cm, emb):
    """Returning the (edited) view arrays themselves also counts as a change."""
    _, m = _launched(cm, emb)
    _, plain = _launched(cm, emb)

    def edit(views):
        for v in views:
            _bump(v.values)
        return [v.values for v in views]

    m.edit_cache_on_host(edit, cache_size=32)
    assert m.dump_cache_memory() != plain.dump_cache_memory()


def test_a_noop_edit_keeps_the_cache(cm, emb):
    _, m = _launched(cm, emb)
    before = m.dump_cache_memory()
    m.edit_cache_on_host(lambda views: None, cache_size=32)
    assert m.dump_cache_memory() == before


def test_edit_fn_is_checked_before_the_dump_in_timing_only_mode():
    acc, m = _launched(_cm(functional=False), None, tokens=0, functional=False)
    now, calls = acc.device.env.now, acc.num_calls
    with pytest.raises(CacheOpError, match="fn must be callable"):
        m.edit_cache_on_host(5, cache_size=0)
    assert acc.device.env.now == now and acc.num_calls == calls


@pytest.mark.parametrize("name", ["b4.token.g16.asym.scale-fp16.zero-fp16", "kivi-4.k"])
def test_requantize_accepts_format_names(cm, emb, name):
    _, by_name = _launched(cm, emb)
    _, by_fmt = _launched(cm, emb)
    _, host = _launched(cm, emb)
    by_name.requantize_on_device(name, cache_size=32)
    by_fmt.requantize_on_device(kvformats.parse(name), cache_size=32)
    host.edit_cache_on_host(requantize_through(name), cache_size=32)
    assert by_name.dump_cache_memory() == by_fmt.dump_cache_memory() == host.dump_cache_memory()


def test_requantize_an_empty_cache_pays_only_the_call(cm, emb):
    acc, m = _launched(cm, emb, tokens=0)
    before = m.dump_cache_memory()
    r = m.requantize_on_device("int8", cache_size=0)
    assert r.new_cache_size == 0 and r.dram_bytes == 0
    assert m.dump_cache_memory() == before


def test_evict_takes_numpy_integer_positions(cm, emb):
    _, a = _launched(cm, emb)
    _, b = _launched(cm, emb)
    ra = a.evict_on_device(np.array([3, 10, 31], np.uint8), cache_size=np.int64(32))
    rb = b.evict_on_device([3, 10, 31], cache_size=32)
    assert ra.new_cache_size == rb.new_cache_size == 29
    assert a.dump_cache_memory() == b.dump_cache_memory()


def test_evict_positions_past_the_cache_are_refused(cm, emb):
    from sim.runtime.cacheops import evict_positions

    _, m = _launched(cm, emb)
    before = m.dump_cache_memory()
    with pytest.raises(CacheOpError, match=r"evict_positions: positions must lie in 0\.\.31"):
        m.edit_cache_on_host(evict_positions([40]), cache_size=32)
    assert m.dump_cache_memory() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_dump_into_an_unwritable_folder_is_refused_before_the_dump(cm, emb):
    acc, m = _launched(cm, emb)
    # /proc takes no new file, whoever asks (root may write anywhere else, and os.access
    # says yes to root even here: the folder is tested by writing in it)
    now, calls = acc.device.env.now, acc.num_calls
    with pytest.raises(CacheOpError, match="cannot write into the folder '/proc'"):
        m.dump_cache_memory_to("/proc")
    assert acc.device.env.now == now and acc.num_calls == calls
