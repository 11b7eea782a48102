"""KV regions: the bytes of a region against a reference placed by the layout
description, writes in any chunks and after truncations, traffic, and the KV instructions'
semantics on regions."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa import kvformats as kf
from isa.errors import FormatError
from tests.isa.kvref import format_and_values, ref_quant_end, ref_region

SETTINGS = settings(max_examples=60, deadline=None)


@settings(max_examples=150, deadline=None)
@given(format_and_values(), st.integers(0, 12))
def test_region_matches_the_reference(case, extra: int) -> None:
    """A region written at once holds the reference's bytes, and reads back full-precision
    tokens exactly and quantized ones as the codec gives them back."""
    f, x = case
    t, w = x.shape
    cap = t + extra
    region = f.region_encode(x, cap)
    assert region.size == f.region_bytes(cap, w)
    assert region.tolist() == ref_region(f, x, cap)
    back = f.region_read(region, cap, w, 0, t)
    s, qe = (0 if f.bits == 16 else min(f.sink, t)), ref_quant_end(f, t)
    expect = x.copy()
    if qe > s and f.axis != "none" and f.bits != 16:
        expect[s:qe] = f.decode(f.encode(x[s:qe]), qe - s, w)
    assert np.array_equal(back, expect)
    assert np.array_equal(f.round_trip(x), back)


# --- DRAM regions ----------------------------------------------------------------------------


@st.composite
def region_cases(draw):
    f, x = draw(format_and_values())
    cap = x.shape[0] + draw(st.integers(0, 12))
    chunks = []
    t = 0
    while t < x.shape[0]:
        n = draw(st.integers(1, max(1, x.shape[0] - t)))
        chunks.append((t, n))
        t += n
    return f, x, cap, chunks


@settings(max_examples=120, deadline=None)
@given(region_cases())
def test_region_writes_in_any_chunks(case) -> None:
    f, x, cap, chunks = case
    t, w = x.shape
    whole = f.region_encode(x, cap)
    assert whole.size == f.region_bytes(cap, w)
    pieces = np.zeros_like(whole)
    for pos, n in chunks:
        f.region_write(pieces, cap, pos, x[pos:pos + n])
    assert np.array_equal(pieces, whole)
    if f.stateful:
        assert f.region_length(whole) == t


@SETTINGS
@given(region_cases(), st.data())
def test_region_sub_reads(case, data) -> None:
    f, x, cap, _ = case
    t, w = x.shape
    region = f.region_encode(x, cap)
    full = f.region_read(region, cap, w, 0, t)
    pos = data.draw(st.integers(0, t))
    n = data.draw(st.integers(0, t - pos))
    assert np.array_equal(f.region_read(region, cap, w, pos, n), full[pos:pos + n])


def check_truncate_then_append(f: kf.KVFormat, x: np.ndarray, cap: int, pos: int,
                               new: np.ndarray) -> None:
    """Write ``new`` at ``pos`` into the region of ``x`` (``pos < len(x)``, no longer than
    ``x``): the tokens from ``pos`` on are dropped. The kept tokens read back as before,
    except those of a per-channel block the truncation splits and the write completes again:
    that block is re-quantized from what its kept tokens read and the new tokens. Tokens in
    full precision hold exactly what was read before (or written); the quantized records and
    blocks the write builds are quantized from those values."""
    t, w = x.shape
    n = new.shape[0]
    assert 0 <= pos < t and 1 <= n and pos + n <= t
    region = f.region_encode(x, cap)
    before = f.region_read(region, cap, w, 0, t)
    f.region_write(region, cap, pos, new)
    assert f.region_length(region) == pos + n
    after = f.region_read(region, cap, w)
    expect = np.concatenate([before[:pos], new])
    s, qe = min(f.sink, pos + n), ref_quant_end(f, pos + n)
    first = max(s, pos)  # the first token of the records and blocks the write builds
    if f.axis == "channel" and first < qe:
        first = s + (first - s) // f.group * f.group  # the block pos falls in
    kept = min(first, pos)
    assert np.array_equal(after[:kept], before[:kept])
    if first < qe:
        expect[first:qe] = f.decode(f.encode(expect[first:qe]), qe - first, w)
    assert np.array_equal(after, expect)


@SETTINGS
@given(region_cases(), st.data())
def test_region_truncate_then_append(case, data) -> None:
    """Writing at pos < length drops the tokens from pos on; the rest reads back as before
    (but for a per-channel block the truncation splits and the write completes again)."""
    f, x, cap, _ = case
    t, w = x.shape
    if not f.stateful or t == 0:
        return
    pos = data.draw(st.integers(0, t - 1))
    n = data.draw(st.integers(1, t - pos))
    new = data.draw(hnp.arrays(np.int8, (n, w), elements=st.integers(-128, 127)))
    check_truncate_then_append(f, x, cap, pos, new)


@pytest.mark.parametrize(("spec", "x", "pos", "new", "reads"), [
    # found by the fuzz profile: block [1, 3) (sink 1, G 2) split at 2 and completed by the
    # new token: re-quantized from [22, -1], so token 1 reads 21, not 22
    ("b4.channel.g2.asym.scale-fp16.zero-uint8.fp-fp16.sink1", [[22], [22], [22]], 2, [[-1]],
     [[22], [21], [-2]]),
    # the new token gets the block's new range, not the old block's (all 22: scale 0)
    ("b4.channel.g2.asym.fp-fp16.sink1", [[22], [22], [22]], 2, [[-100]],
     [[22], [22], [-100]]),
    # with a window: block [1, 4) split at 2 and completed by new tokens 2 and 3 (of six)
    ("b4.channel.g3.asym.window2.sink1", [[v, -v] for v in range(10, 90, 10)], 2,
     [[-128, 127], [0, 0], [5, 5], [6, 6], [7, 7], [8, 8]], None),
])
def test_region_truncation_requantizes_a_split_channel_block(spec, x, pos, new, reads) -> None:
    f = kf.parse(spec)
    x, new = np.array(x, np.int8), np.array(new, np.int8)
    t, w = x.shape
    check_truncate_then_append(f, x, t, pos, new)
    if reads is not None:
        region = f.region_encode(x, t)
        f.region_write(region, t, pos, new)
        assert f.region_read(region, t, w).tolist() == reads


def named_formats() -> list[kf.KVFormat]:
    """Every format a registry name stands for (both of a pair with different K and V)."""
    out: list[kf.KVFormat] = []
    for name in kf.names():
        for f in kf.pair(name):
            if f not in out:
                out.append(f)
    return out


def stable_prefix(f: kf.KVFormat, pos: int) -> int:
    """Tokens below this keep reading back as before after a write at ``pos`` (and any
    later appends): all of them but a per-channel block that ``pos`` splits."""
    s = min(f.sink, pos)
    if f.axis == "channel" and f.bits != 16 and pos > s:
        return s + (pos - s) // f.group * f.group
    return pos


@pytest.mark.parametrize("f", named_formats(), ids=str)
def test_truncate_then_append_in_chunks_or_at_once_is_the_same(f: kf.KVFormat) -> None:
    """After a truncation, appending in chunks (the first one truncates; on-device
    eviction writes this way) leaves the same region, byte for byte, as one write: tokens
    that come back into the full-precision tail and leave it again keep their records.
    For integer zero points (QuantMLA) re-quantizing what such a token reads would not
    give its codes back, so the test would fail if the write re-quantized them."""
    w = f.rope_width + 64
    cap = 640
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (500, w), dtype=np.int8)
    base = f.region_encode(x, cap)
    before = f.region_read(base, cap, w, 0, 500)
    for pos, n in ((300, 250), (300, 40), (137, 9), (500 - f.window // 2, 3)):
        new = rng.integers(-128, 128, (n, w), dtype=np.int8)
        once = base.copy()
        f.region_write(once, cap, pos, new)
        after = f.region_read(once, cap, w, 0, pos + n)
        kept = stable_prefix(f, pos)
        assert np.array_equal(after[:kept], before[:kept])
        for chunk in (1, 8, 37):
            if chunk == 1 and n > 40:
                continue
            parts = base.copy()
            for a in range(0, n, chunk):
                f.region_write(parts, cap, pos + a, new[a:a + chunk])
            assert np.array_equal(f.region_read(parts, cap, w, 0, pos + n), after)
            assert np.array_equal(parts, once)
    if f.stateful and f.zero_dtype in ("uint8", "int8"):
        # the tokens that the first chunk of 8 (pos 300) sends back into the tail: their
        # re-quantized values differ from what they read, so keeping records matters
        a, b = f.quant_end(308), f.quant_end(500)
        assert a < b
        seg = before[a:b]
        assert not np.array_equal(f.decode(f.encode(seg), b - a, w), seg)


@st.composite
def write_sequences(draw):
    """A region, then writes (at any position up to the cached length, truncating there),
    each with a random split into chunks."""
    f, x = draw(format_and_values())
    if draw(st.booleans()):  # often a window and integer zero points (not idempotent)
        f = dataclasses.replace(f, symmetric=False, page=0, window=draw(st.integers(1, 7)),
                                zero_dtype=draw(st.sampled_from(["uint8", "int8"])))
    t, w = x.shape
    cap = t + draw(st.integers(1, 12))
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, min(t, cap - 1)))
        n = draw(st.integers(1, cap - pos))
        new = draw(hnp.arrays(np.int8, (n, w), elements=st.integers(-128, 127)))
        cuts = draw(st.sets(st.integers(1, n - 1), max_size=4)) if n > 1 else set()
        if n > 1 and draw(st.booleans()):
            cuts.add(1)  # a short first chunk sends kept tokens back into the tail
        ops.append((pos, new, [0, *sorted(cuts), n]))
        t = pos + n
    return f, x, cap, ops


@settings(max_examples=150, deadline=None)
@given(write_sequences())
def test_region_writes_after_truncations_in_any_chunks(case) -> None:
    """Any sequence of writes, truncating or not, leaves the same region whether each write
    is split into chunks or not; and a token reads back the same from the moment it is
    quantized (or written, for sink tokens and 16-bit formats) until a write at or below it
    drops it, or a write splits the per-channel block it is in."""
    f, x, cap, ops = case
    w = x.shape[1]
    whole = f.region_encode(x, cap)
    pieces = whole.copy()
    t = x.shape[0]
    final = np.zeros(cap, bool)  # tokens whose read values may no longer change
    ref = np.zeros((cap, w), np.int8)
    for pos, new, cuts in ops:
        f.region_write(whole, cap, pos, new)
        for a, b in itertools.pairwise(cuts):
            f.region_write(pieces, cap, pos + a, new[a:b])
        assert np.array_equal(pieces, whole)
        t = pos + new.shape[0]
        final[stable_prefix(f, pos):] = False
        got = f.region_read(whole, cap, w, 0, t)
        assert np.array_equal(got[final[:t]], ref[:t][final[:t]])
        done = np.zeros(cap, bool)
        done[:t if f.bits == 16 else f.quant_end(t)] = True
        done[:min(f.sink, t)] = True
        fresh = done & ~final
        ref[fresh] = np.pad(got, ((0, cap - t), (0, 0)))[fresh]
        final |= done


def test_region_layout_by_hand() -> None:
    f = kf.parse("kivi-2.k")
    r = f.region(4096, 64)
    # header 4; (4096 - 128) // 32 = 124 blocks of 64*8 + 64*4 = 768 B; ring of 159 fp16
    assert (r.header, r.quant_slots, r.quant_slot_bytes, r.ring_slots) == (4, 124, 768, 159)
    assert r.nbytes == 4 + 124 * 768 + 159 * 128
    m = kf.parse("quantmla-c4r4").region(4096, 576)
    assert (m.header, m.sink_slots, m.quant_slots, m.ring_slots) == (16, 4, 4096 - 132, 128)
    assert m.nbytes == 16 + 4 * 1152 + (4096 - 132) * 320 + 128 * 1152
    assert kf.parse("int8").region_bytes(100, 64) == 6400
    assert kf.parse("qserve-kv4").region_bytes(100, 64) == 128 * 36


def test_region_errors() -> None:
    f = kf.parse("kivi-4.v")
    region = np.zeros(f.region_bytes(64, 32), np.uint8)
    with pytest.raises(FormatError, match="gap"):
        f.region_write(region, 64, 3, np.zeros((1, 32), np.int8))
    with pytest.raises(FormatError):
        f.region_write(region, 64, 0, np.zeros((65, 32), np.int8))
    with pytest.raises(FormatError):
        f.region_read(region, 64, 32, 0, 1)  # empty cache
    with pytest.raises(FormatError):
        f.region_write(np.zeros(10, np.uint8), 64, 0, np.zeros((1, 32), np.int8))
    region[:4] = np.array([65], "<u4").view(np.uint8)  # a corrupted length header
    with pytest.raises(FormatError, match="header"):
        f.region_read(region, 64, 32)
    with pytest.raises(FormatError, match="header"):
        f.region_write(region, 64, 0, np.zeros((1, 32), np.int8))


def test_write_traffic() -> None:
    f = kf.parse("kivi-2.k")
    w = 64
    fp = 2 * w
    # a decode step that does not complete a group: header + one fp16 record
    assert f.write_bytes(200, 1, w) == (4, 4 + fp)
    # T 191 -> 192: tokens 32..63 leave the window: read 32 fp records, write a block
    assert f.quant_end(191) == 32 and f.quant_end(192) == 64
    assert f.write_bytes(191, 1, w) == (4 + 32 * fp, 4 + f.block_bytes(w) + fp)
    assert kf.parse("int8").write_bytes(10, 1, w) == (0, w)
    assert kf.parse("int8").read_bytes(0, 100, w) == 100 * w


# --- instruction semantics on regions --------------------------------------------------------


class FlatMemory:
    """DRAM, SRAM (one core) and host as flat byte arrays (the semantics' Memory)."""

    def __init__(self, nbytes: int = 1 << 20):
        self.spaces = {s: np.zeros(nbytes, np.uint8) for s in (0, 1, 2)}

    def read(self, space, core, addr, nbytes):
        return self.spaces[int(space)][addr:addr + nbytes].copy()

    def write(self, space, core, addr, data):
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self.spaces[int(space)][addr:addr + data.size] = data


@pytest.mark.parametrize("layout", ["int8", "kivi-2", "qserve-kv4", "b4.channel.g8.asym.sink2"])
def test_kv_write_read_attn_instructions(layout: str) -> None:
    from isa import semantics
    from isa.instructions import Attn, KvRead, KvWrite, Space
    from isa.kernels.attention import attend

    kfmt, vfmt = kf.pair(layout)
    rng = np.random.default_rng(0)
    cap, hd, heads, T = 200, 64, 3, 170
    k = rng.integers(-128, 128, (T, hd), dtype=np.int8)
    v = rng.integers(-128, 128, (T, hd), dtype=np.int8)
    q = rng.integers(-128, 128, (1, heads, hd), dtype=np.int8)
    formats = (kf.to_text(kfmt), kf.to_text(vfmt))
    kreg, vreg = 0x10000, 0x40000
    mem = FlatMemory()
    mem.write(Space.SRAM, 0, 0x8000, q)
    pos = 0
    for n in (100, 1, 1, 30, 1, 37):  # a prefill, then decode steps and chunks
        for fmt_i, vals, reg in ((0, k, kreg), (1, v, vreg)):
            mem.write(Space.SRAM, 0, 0, vals[pos:pos + n])
            f = (kfmt, vfmt)[fmt_i]
            semantics.execute(KvWrite(fmt=fmt_i, tokens=n, width=hd, pos=pos, cap=cap, src=0,
                                      dst=reg, nbytes=f.max_bytes(cap, hd)), mem, formats)
        pos += n
    assert pos == T
    assert np.array_equal(mem.read(Space.DRAM, 0, kreg, kfmt.region_bytes(cap, hd)),
                          kfmt.region_encode(k, cap))
    semantics.execute(KvRead(fmt=1, tokens=5, width=hd, pos=160, cap=cap, src=vreg,
                             dst=0x4000, nbytes=vfmt.region_bytes(cap, hd)), mem, formats)
    v_back = vfmt.round_trip(v)
    assert np.array_equal(mem.read(Space.SRAM, 0, 0x4000, 5 * hd).view(np.int8).reshape(5, hd),
                          v_back[160:165])
    kw = dict(score_mult=3 << 20, score_shift=30, out_mult=1, out_shift=24)
    semantics.execute(Attn(q_len=1, ctx=T, heads=heads, kv_heads=1, head_dim=hd, pos=T - 1,
                           cap=cap, k_fmt=0, v_fmt=1, q=0x8000, k=kreg, v=vreg, out=0x9000,
                           k_nbytes=kfmt.bytes(T, hd), v_nbytes=vfmt.bytes(T, hd), **kw),
                      mem, formats)
    k_back = kfmt.round_trip(k)
    expected = attend(q, k_back[:, None], v_back[:, None], pos=T - 1, **kw)
    got = mem.read(Space.SRAM, 0, 0x9000, heads * hd).view(np.int8).reshape(1, heads, hd)
    assert np.array_equal(got, expected)


def test_kv_write_checks_the_region_size() -> None:
    from isa import semantics
    from isa.errors import IsaError
    from isa.instructions import KvWrite

    with pytest.raises(IsaError, match="region_bytes"):
        semantics.execute(KvWrite(fmt=0, tokens=1, width=64, pos=0, cap=10, src=0, dst=0,
                                  nbytes=123), FlatMemory(), ("kivi-4.k",))


def test_attn_mla_form_reads_one_latent_cache() -> None:
    from isa import semantics
    from isa.instructions import Attn, Space
    from isa.kernels.attention import attention_mla

    f = kf.parse("quantmla-c4r4")
    rng = np.random.default_rng(1)
    cap, w, T, heads = 300, 576, 260, 2
    cache = rng.integers(-128, 128, (T, w), dtype=np.int8)
    q = rng.integers(-128, 128, (1, heads, w), dtype=np.int8)
    mem = FlatMemory(1 << 21)
    mem.write(Space.DRAM, 0, 0, f.region_encode(cache, cap))
    mem.write(Space.SRAM, 0, 0, q)
    kw = dict(score_mult=1 << 20, score_shift=32, out_mult=1, out_shift=24)
    half = f.bytes(T, w) // 2  # the timing-only split of the one stream over K and V
    semantics.execute(Attn(q_len=1, ctx=T, heads=heads, kv_heads=1, head_dim=w, pos=T - 1,
                           cap=cap, k_fmt=0, v_fmt=0, q=0, k=0, v=half, out=0x8000,
                           k_nbytes=half, v_nbytes=half, **kw), mem, ("quantmla-c4r4",))
    got = mem.read(Space.SRAM, 0, 0x8000, heads * w).view(np.int8).reshape(1, heads, w)
    back = f.round_trip(cache)
    assert np.array_equal(got, attention_mla(q, back, v_dim=w, pos=T - 1, **kw))
    assert np.array_equal(got[..., :512], attention_mla(q, back, v_dim=512, pos=T - 1, **kw))


@pytest.mark.parametrize("name", ["quantmla-c2r4", "kivi-4.k", "kivi-2.v"])
def test_kv_write_instructions_after_a_truncation_match_one_write(name: str) -> None:
    """KvWrite writes back only the byte ranges region_write reports: chunked writes after a
    truncation (what on-device eviction runs) leave DRAM as one host-side write does."""
    from isa import semantics
    from isa.instructions import KvWrite, Space

    f = kf.parse(name)
    w, cap, base, pos = f.rope_width + 64, 400, 0x10000, 250
    rng = np.random.default_rng(3)
    region = f.region_encode(rng.integers(-128, 128, (360, w), dtype=np.int8), cap)
    new = rng.integers(-128, 128, (100, w), dtype=np.int8)
    mem = FlatMemory()
    mem.write(Space.DRAM, 0, base, region)
    for a in range(0, new.shape[0], 8):
        n = min(8, new.shape[0] - a)
        mem.write(Space.SRAM, 0, 0, new[a:a + n])
        semantics.execute(KvWrite(fmt=0, tokens=n, width=w, pos=pos + a, cap=cap, src=0,
                                  dst=base, nbytes=f.region_bytes(cap, w)), mem, (name,))
    f.region_write(region, cap, pos, new)
    assert np.array_equal(mem.read(Space.DRAM, 0, base, region.size), region)
