"""KV formats through the ``isa.kvformats`` names: registry and text, exact byte counts
by hand and against the reference counts, the one byte layout (the region) it derives them
from."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa import kv
from isa import kvformats as kf
from isa.errors import FormatError
from tests.isa.kvref import formats, ref_cache_bytes, ref_sizes

SETTINGS = settings(max_examples=60, deadline=None)


def test_facade_gathers_the_package() -> None:
    modules = [kv.codec, kv.format, kv.grammar, kv.region]
    for name in kf.__all__:
        assert any(getattr(m, name, None) is getattr(kf, name) for m in modules), name
    assert {"parse", "pair", "to_text", "KVFormat"} <= set(kf.__all__)


def test_named_layouts_of_facts() -> None:
    for name in ("int8", "kivi-2", "kivi-4", "qserve-kv4", "quantmla-c4r4", "quantmla-c2r4",
                 "bf16"):
        p = kf.pair(name)
        assert isinstance(p.k, kf.KVFormat) and isinstance(p.v, kf.KVFormat)
    k, v = kf.pair("kivi-4")
    assert (k.axis, k.group, k.window, k.bits) == ("channel", 32, 128, 4)
    assert (v.axis, v.group, v.window, v.bits) == ("token", 32, 128, 4)
    assert k.scale_dtype == k.zero_dtype == k.fp_dtype == "fp16"
    m = kf.parse("quantmla-c2r4")
    assert (m.bits, m.rope_width, m.rope_bits, m.group, m.zero_dtype, m.sink, m.window,
            m.pad) == (2, 64, 4, 64, "uint8", 4, 128, 16)
    q = kf.parse("qserve-kv4")
    assert (q.bits, q.symmetric, q.zero_dtype, q.page) == (4, False, "fp16", 64)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(FormatError) as e:
        kf.parse("kivi-3")
    for name in ("int8", "kivi-4", "qserve-kv4", "quantmla-c4r4", "bf16"):
        assert name in str(e.value)


def test_pair_name_needs_a_role() -> None:
    with pytest.raises(FormatError, match="kivi-4.k"):
        kf.parse("kivi-4")
    assert kf.parse("kivi-4", "k") == kf.parse("kivi-4.k")
    assert kf.parse("kivi-4", "v").axis == "token"
    assert kf.parse("int8.v") == kf.parse("int8")


@pytest.mark.parametrize("bad", ["b3", "b4.token.g0", "b4.bogus", "b4.g8.g8", "token.g8",
                                 "b4.none", "b4.channel.rope8b4", "b4.scale-fp32",
                                 "b4.token.page64.window8"])
def test_bad_specs(bad: str) -> None:
    with pytest.raises(FormatError):
        kf.parse(bad)


@SETTINGS
@given(formats())
def test_text_round_trip(f: kf.KVFormat) -> None:
    assert kf.parse(kf.to_text(f)) == f
    assert kf.parse(f.spec()) == f


def test_registered_formats_print_their_names() -> None:
    for name, f in kf.FORMATS.items():
        assert kf.to_text(f) == name and str(f) == name
        assert kf.to_text(kf.parse(f.spec())) == name  # a spec equal to a named format
    custom = kf.parse("b2.token.g16.sym.scale-bf16.fp-fp16.window4")
    assert kf.to_text(custom) == "b2.token.g16.sym.scale-bf16.fp-fp16.window4"


# --- byte counts ---------------------------------------------------------------------------


def test_bytes_of_named_formats_by_hand() -> None:
    # bf16 / int8: 2 and 1 bytes per value
    assert kf.parse("bf16").bytes(1000, 64) == 1000 * 128
    assert kf.parse("int8").bytes(1000, 64) == 64000
    # kivi-4 K, W=128, T=1000: q_end = 32*floor(872/32) = 864 quantized (27 blocks),
    # block = 128 ch * 16 B codes + 128 * (2 + 2) B = 2560; 136 fp16 tokens * 256 B
    assert kf.parse("kivi-4.k").bytes(1000, 128) == 27 * 2560 + 136 * 256
    # kivi-2 V: 872 token records of 128*2/8 = 32 B codes + 4 groups * 4 B = 48; 128 fp16
    assert kf.parse("kivi-2.v").bytes(1000, 128) == 872 * 48 + 128 * 256
    # qserve-kv4, W=64 (one head): record 32 + 2 + 2 = 36 B; 1000 tokens -> 16 pages of 64
    assert kf.parse("qserve-kv4").bytes(1000, 64) == 1024 * 36
    # quantmla-c4r4, W=576: 512/2 + 64/2 = 288 B codes + 9 groups * 3 B = 315 -> 320 B;
    # 4 sink + 128 window BF16 records of 1152 B
    assert kf.parse("quantmla-c4r4").bytes(1000, 576) == (1000 - 132) * 320 + 132 * 1152
    # quantmla-c2r4: 128 + 32 + 27 = 187 -> 192 B
    assert kf.parse("quantmla-c2r4").bytes(1000, 576) == (1000 - 132) * 192 + 132 * 1152
    # short caches are all full precision
    assert kf.parse("kivi-2.k").bytes(100, 128) == 100 * 256
    assert kf.parse("kivi-2.k").bytes(0, 128) == 0

def test_channel_tail_between_window_and_window_plus_group() -> None:
    f = kf.parse("kivi-2.k")
    for t in range(160, 600):
        assert 128 <= t - f.quant_end(t) <= 128 + 31
    sizes = [f.bytes(t, 128) for t in range(0, 600)]
    assert sizes[192] < sizes[191]  # 32 fp16 tokens collapse into one 2-bit block
    # the region for 599 tokens holds every length up to 599
    assert f.max_bytes(599, 128) == f.region_bytes(599, 128) >= 4 + max(sizes)


@SETTINGS
@given(formats(), st.integers(0, 13), st.integers(0, 40))
def test_sizes_match_the_reference_counts(f: kf.KVFormat, extra: int, t: int) -> None:
    """Record sizes, cache bytes and whole-cache reads against counts written from the
    layout description: a read of a whole cache moves the header and its records (no page
    padding)."""
    w = f.rope_width + 1 + extra
    header, fpb, unit = ref_sizes(f, w)
    assert (f.header_bytes, f.fp_record_bytes(w)) == (header, fpb)
    assert (f.block_bytes(w) if f.axis == "channel" and f.bits != 16
            else f.record_bytes(w)) == unit
    assert f.bytes(t, w) == ref_cache_bytes(f, t, w)
    page_pad = (f.page - t % f.page) % f.page * unit if f.page else 0
    assert f.read_bytes(0, t, w) == header + ref_cache_bytes(f, t, w) - page_pad


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(FormatError, match="token count"):
        kf.parse("int8").bytes(-1, 64)
    with pytest.raises(FormatError, match="token count"):
        kf.parse("bf16").bytes(-1, 64)
    with pytest.raises(FormatError, match="width"):
        kf.parse("quantmla-c4r4").bytes(10, 64)  # no content values before the RoPE part
    with pytest.raises(FormatError, match="capacity"):
        kf.parse("kivi-4.v").region_bytes(-1, 64)
