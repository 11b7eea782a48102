"""Sliding-window caches: a ring region keeps a layer's last ``ring`` tokens; chunked
writes, truncations, sizes and traffic; Attn over a ring sees each query's window only."""

from __future__ import annotations

import numpy as np
import pytest

from isa import kvformats as kf
from isa.errors import FormatError
from tests.isa.test_kv_region import FlatMemory

INT8 = kf.parse("int8")


def _vals(n: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, (n, w), dtype=np.int8)


@pytest.mark.parametrize("base", ["int8", "bf16", "b4.token.g8.asym.scale-fp16.zero-fp16"])
def test_ring_keeps_the_last_tokens_whatever_the_chunks(base: str) -> None:
    f = kf.parse(base).sliding(ring=6, slide=4)
    cap, w = 64, 16
    x = _vals(20, w)
    one = np.zeros(f.region_bytes(cap, w), np.uint8)
    f.region_write(one, cap, 0, x)
    steps = np.zeros_like(one)
    pos = 0
    for n in (3, 1, 5, 1, 1, 9):
        f.region_write(steps, cap, pos, x[pos:pos + n])
        pos += n
    assert np.array_equal(one, steps)
    assert f.region_length(one) == 20
    back = f.region_read(one, cap, w, 14, 6)
    assert np.array_equal(back, kf.parse(base).round_trip(x)[14:20])
    with pytest.raises(FormatError, match=r"tokens 13\.\.13 are no longer in the sliding-window "
                                          r"cache \(it holds 14\.\.19\)"):
        f.region_read(one, cap, w, 13, 1)


def test_ring_region_sizes_and_traffic() -> None:
    f = INT8.sliding(ring=6, slide=4)
    w = 16
    # header: token count and first position (uint32 each), then min(cap, ring) records
    assert f.region_bytes(64, w) == 8 + 6 * w
    assert f.region_bytes(4, w) == 8 + 4 * w
    assert f.bytes(3, w) == 3 * w and f.bytes(100, w) == 6 * w  # the records it holds
    assert f.read_bytes(96, 4, w) == 8 + 4 * w  # the last window: header + 4 records
    assert f.write_bytes(99, 1, w) == (8, 8 + w)


def test_truncating_a_ring_keeps_what_it_held_below() -> None:
    f = INT8.sliding(ring=4, slide=4)
    cap, w = 32, 8
    x = _vals(10, w)
    buf = np.zeros(f.region_bytes(cap, w), np.uint8)
    f.region_write(buf, cap, 0, x)  # holds 6..9
    new = _vals(1, w, seed=1)
    f.region_write(buf, cap, 8, new)  # truncates to 8, appends one: holds 6, 7, 8
    assert np.array_equal(f.region_read(buf, cap, w, 6, 3), np.concatenate([x[6:8], new]))
    with pytest.raises(FormatError, match="no longer in the sliding-window cache"):
        f.region_read(buf, cap, w, 5, 1)  # overwritten before the truncation: lost
    f.region_write(buf, cap, 0, x[:2])  # a new sequence from 0
    assert np.array_equal(f.region_read(buf, cap, w, 0, 2), x[:2])
    assert f.region_length(buf) == 2


def test_ring_formats_spec_and_checks() -> None:
    f = INT8.sliding(ring=4607, slide=4096)
    assert kf.to_text(f) == "b8.none.fp-bf16.ring4607.slide4096"
    assert kf.parse(kf.to_text(f)) == f and f != INT8
    with pytest.raises(FormatError, match=r"needs 1 <= slide <= ring, got slide 9, ring 4"):
        INT8.sliding(ring=4, slide=9)
    with pytest.raises(FormatError, match="without windows, sinks, pages"):
        kf.parse("kivi-4.k").sliding(ring=8, slide=8)
    with pytest.raises(FormatError, match="without windows, sinks, pages"):
        kf.parse("qserve-kv4").sliding(ring=8, slide=8)


def test_attn_over_a_ring_sees_each_querys_window() -> None:
    """A prefill chunk of 5 queries at positions 10..14 over a ring of 8 slots with a window
    of 4: query p sees positions p-3..p, as attention over those keys alone computes."""
    from isa import semantics
    from isa.instructions import Attn, KvWrite, Space
    from isa.kernels.attention import attend

    W, R, cap, hd, heads, T = 4, 8, 64, 16, 2, 15
    f = INT8.sliding(ring=R, slide=W)
    formats = (kf.to_text(f), kf.to_text(f))
    k, v = _vals(T, hd, 1), _vals(T, hd, 2)
    q = _vals(5, heads * hd, 3).reshape(5, heads, hd)
    mem = FlatMemory()
    kreg, vreg = 0x10000, 0x20000
    for pos, n in ((0, 10), (10, 5)):
        for i, (vals, reg) in enumerate(((k, kreg), (v, vreg))):
            mem.write(Space.SRAM, 0, 0, vals[pos:pos + n])
            semantics.execute(KvWrite(fmt=i, tokens=n, width=hd, pos=pos, cap=cap, src=0,
                                      dst=reg, nbytes=f.region_bytes(cap, hd)), mem, formats)
    mem.write(Space.SRAM, 0, 0x8000, q)
    keys = 5 + W - 1  # the union of the 5 windows: positions 7..14
    kw = dict(score_mult=3 << 20, score_shift=30, out_mult=1, out_shift=24)
    semantics.execute(Attn(q_len=5, ctx=keys, heads=heads, kv_heads=1, head_dim=hd,
                           pos=keys - 5, cap=cap, k_fmt=0, v_fmt=1, q=0x8000, k=kreg, v=vreg,
                           out=0x9000, k_nbytes=f.read_bytes(T - keys, keys, hd),
                           v_nbytes=f.read_bytes(T - keys, keys, hd), **kw), mem, formats)
    got = mem.read(Space.SRAM, 0, 0x9000, 5 * heads * hd).view(np.int8).reshape(5, heads, hd)
    for i in range(5):
        p = 10 + i
        want = attend(q[i:i + 1], k[p - W + 1:p + 1, None], v[p - W + 1:p + 1, None],
                      pos=W - 1, **kw)
        assert np.array_equal(got[i:i + 1], want)
    # more keys than the ring holds: refused, not read stale
    with pytest.raises(FormatError, match=r"last 9 positions of a cache of 15 tokens"):
        semantics.execute(Attn(q_len=1, ctx=9, heads=heads, kv_heads=1, head_dim=hd, pos=8,
                               cap=cap, k_fmt=0, v_fmt=1, q=0x8000, k=kreg, v=vreg,
                               out=0x9000, k_nbytes=1, v_nbytes=1, **kw), mem, formats)
