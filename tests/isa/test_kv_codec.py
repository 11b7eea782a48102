"""KV codec: records against a slow reference encoder written from the record
descriptions, and quantize / pack / unpack / dequantize round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from isa import kvformats as kf
from isa.errors import FormatError
from tests.isa.kvref import format_and_values, ref_block, ref_fp_record, ref_token_record

SETTINGS = settings(max_examples=60, deadline=None)


@settings(max_examples=150, deadline=None)
@given(format_and_values())
def test_runs_match_the_reference_records(case) -> None:
    f, x = case
    t, w = x.shape
    rows = [[int(v) for v in r] for r in x]
    assert f.encode(x, kind="fp").tolist() == [b for r in rows for b in ref_fp_record(f, r)]
    if f.axis == "channel" and f.bits != 16:
        t -= t % f.group
        want = [b for g in range(0, t, f.group) for b in ref_block(f, rows[g:g + f.group])]
    else:
        want = [b for r in rows for b in ref_token_record(f, r)]
    data = f.encode(x[:t])
    assert data.size == f.run_bytes("quant", t, w)
    assert data.tolist() == want


@SETTINGS
@given(format_and_values())
def test_quantize_pack_unpack_dequantize(case) -> None:
    f, x = case
    t, w = x.shape
    if f.axis == "channel":
        t -= t % f.group
        x = x[:t]
    q = f.quantize(x)
    data = f.pack(q)
    q2 = f.unpack(data, t, w)
    if q.kind == "quant":
        assert np.array_equal(q.codes & ((1 << 8) - 1), q2.codes)
        assert np.array_equal(q.scales, q2.scales)
        if q.zeros is not None:
            assert np.array_equal(q.zeros, q2.zeros)
    assert np.array_equal(f.dequantize(q2), f.dequantize(q))
    assert np.array_equal(f.decode(data, t, w), f.dequantize(q))


def test_decode_rejects_wrong_sizes() -> None:
    f = kf.parse("kivi-4.v")
    with pytest.raises(FormatError):
        f.decode(np.zeros(10, np.uint8), 5, 32)
    with pytest.raises(FormatError):
        f.region_read(np.zeros(10, np.uint8), 5, 32, 0, 1)
    with pytest.raises(FormatError):
        kf.parse("kivi-4.k").quantize(np.zeros((33, 8), np.int8))  # not whole groups


def test_bf16_stores_int8_exactly_and_reads_edits_rounded() -> None:
    f = kf.parse("bf16")
    x = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    data = f.region_encode(x, 16)
    assert np.array_equal(data.view("<u2").reshape(16, 16),
                          (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
    edited = np.array([1.5, -2.5, 300.0, -1e9, np.nan, 0.49], np.float32)
    bits = (edited.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    assert f.region_read(bits, 1, 6, 0, 1).tolist() == [[2, -2, 127, -128, 0, 0]]
