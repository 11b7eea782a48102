"""2/4/8-bit packing and int4 weight packing against a bit-string reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import pack

SETTINGS = settings(max_examples=150, deadline=None)
BITS = st.sampled_from([2, 4, 8])


def ref_pack(codes: list[int], bits: int) -> list[int]:
    """Concatenate b-bit fields LSB-first into one integer, cut it into bytes."""
    stream = 0
    for i, c in enumerate(codes):
        stream |= (c % (1 << bits)) << (i * bits)
    nbytes = (len(codes) * bits + 7) // 8
    return [(stream >> (8 * j)) & 0xFF for j in range(nbytes)]


def ref_unpack(buf: list[int], bits: int, n: int) -> list[int]:
    stream = sum(b << (8 * j) for j, b in enumerate(buf))
    return [(stream >> (i * bits)) % (1 << bits) for i in range(n)]


@st.composite
def code_rows(draw):
    bits = draw(BITS)
    r = draw(st.integers(1, 4))
    n = draw(st.integers(0, 37))
    codes = draw(hnp.arrays(np.uint8, (r, n), elements=st.integers(0, 255)))
    return bits, codes


@SETTINGS
@given(code_rows())
def test_pack_rows_matches_reference(case) -> None:
    bits, codes = case
    r, n = codes.shape
    out = np.full((r, pack.packed_bytes(n, bits)), 0xAA, np.uint8)
    pack.pack_rows(codes, bits, out)
    for i in range(r):
        assert out[i].tolist() == ref_pack(codes[i].tolist(), bits)


@SETTINGS
@given(BITS, st.integers(0, 37), st.data())
def test_unpack_rows_matches_reference(bits: int, n: int, data) -> None:
    nb = pack.packed_bytes(n, bits)
    buf = data.draw(hnp.arrays(np.uint8, (3, nb), elements=st.integers(0, 255)))
    out = np.zeros((3, n), np.uint8)
    pack.unpack_rows(buf, bits, n, out)
    for i in range(3):
        assert out[i].tolist() == ref_unpack(buf[i].tolist(), bits, n)


@SETTINGS
@given(code_rows())
def test_roundtrip_masks_high_bits(case) -> None:
    bits, codes = case
    r, n = codes.shape
    buf = np.zeros((r, pack.packed_bytes(n, bits)), np.uint8)
    pack.pack_rows(codes, bits, buf)
    back = np.zeros_like(codes)
    pack.unpack_rows(buf, bits, n, back)
    assert np.array_equal(back, codes & ((1 << bits) - 1))


def test_layout_examples() -> None:
    out = np.zeros(2, np.uint8)
    pack.pack_row(np.array([1, 2, 3], np.uint8), 4, out)
    assert out.tolist() == [0x21, 0x03]  # element 0 low nibble, 1 high nibble, odd tail
    out = np.zeros(2, np.uint8)
    pack.pack_row(np.array([1, 2, 3, 0, 3], np.uint8), 2, out)
    assert out.tolist() == [0b00111001, 0b11]  # LSB first, 4 per byte
    words = np.zeros(8, np.uint8)
    pack.pack_row(np.arange(16, dtype=np.uint8) % 4, 2, words[:4])
    # read as a little-endian int32: code i in bits 2i..2i+1 (KIVI "16 codes per int32")
    w = int(words[:4].view("<u4")[0])
    assert [(w >> (2 * i)) & 3 for i in range(16)] == [i % 4 for i in range(16)]


@st.composite
def int4_rows(draw):
    r = draw(st.integers(1, 4))
    k = draw(st.integers(0, 41))
    return draw(hnp.arrays(np.int8, (r, k), elements=st.integers(-8, 7)))


@SETTINGS
@given(int4_rows())
def test_pack_int4_matches_reference(vals: np.ndarray) -> None:
    r, k = vals.shape
    out = np.zeros((r, (k + 1) // 2), np.uint8)
    pack.pack_int4(vals, out)
    for i in range(r):
        assert out[i].tolist() == ref_pack([v & 15 for v in vals[i].tolist()], 4)
    back = np.zeros((r, k), np.int8)
    pack.unpack_int4(out, k, back)
    assert np.array_equal(back, vals)


@SETTINGS
@given(st.integers(0, 41), st.data())
def test_unpack_int4_any_bytes(k: int, data) -> None:
    buf = data.draw(hnp.arrays(np.uint8, (2, (k + 1) // 2), elements=st.integers(0, 255)))
    out = np.zeros((2, k), np.int8)
    pack.unpack_int4(buf, k, out)
    for i in range(2):
        nib = ref_unpack(buf[i].tolist(), 4, k)
        assert out[i].tolist() == [v - 16 if v >= 8 else v for v in nib]


def test_int4_edges() -> None:
    vals = np.array([[-8, 7, -1, 0, -8]], np.int8)
    out = np.zeros((1, 3), np.uint8)
    pack.pack_int4(vals, out)
    assert out.tolist() == [[0x78, 0x0F, 0x08]]
