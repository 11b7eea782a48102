"""Program validation: one test per error, and well-formed programs that pass."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from isa.errors import ProgramError
from isa.instructions import (
    NO_ADDR,
    Attn,
    DmaCopy,
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Instruction,
    KvRead,
    KvWrite,
    MemoryLayout,
    Nop,
    Program,
    Region,
    Space,
    Vec,
    VecFunc,
)
from isa.validate import validate_program
from tests.isa.strategies import programs

KiB = 1024
MiB = 1024 * KiB
LAYOUT = MemoryLayout(dram_bytes=4 * MiB, sram_bytes=64 * KiB, host_bytes=1 * MiB, num_cores=2)
REGIONS = (
    Region("weights", Space.DRAM, 0, 2 * MiB, "weights"),
    Region("activations", Space.DRAM, 2 * MiB, 1 * MiB, "activations"),
    Region("buf0", Space.SRAM, 0, 32 * KiB, "scratch", core=0),
    Region("buf1", Space.SRAM, 32 * KiB, 32 * KiB, "scratch", core=0),
    Region("buf", Space.SRAM, 0, 64 * KiB, "scratch", core=1),
)
WITH_REGIONS = MemoryLayout(
    dram_bytes=4 * MiB, sram_bytes=64 * KiB, host_bytes=1 * MiB, num_cores=2, regions=REGIONS
)
FORMATS = ("int8", "kivi-4.v")

TILE = 8 * KiB  # bytes of weights per tile: k=64 x n=128 int8
GEMM = Gemm(m=1, k=64, n=128, w_bits=8, a=0, w=TILE, out=4 * TILE)
# kivi-4.v region of 16 tokens of 64 values: a 4-byte header and a ring of 16 fp16 records
# (the 128-token window is wider than the cache)
KV_WRITE = KvWrite(fmt=1, tokens=1, width=64, cap=16, src=0, dst=0x100, nbytes=4 + 16 * 128)
ATTN = Attn(
    q_len=1,
    ctx=16,
    heads=4,
    kv_heads=2,
    head_dim=64,
    k_fmt=0,
    v_fmt=1,
    q=0,
    k=0x1000,
    v=0x2000,
    out=0x3000,
    cap=16,
    k_nbytes=2048,
    v_nbytes=1024,
)


def fails(instrs: list[Instruction], layout: MemoryLayout = LAYOUT) -> ProgramError:
    with pytest.raises(ProgramError) as info:
        validate_program(Program(instructions=tuple(instrs), formats=FORMATS), layout)
    return info.value


def passes(instrs: list[Instruction], layout: MemoryLayout = LAYOUT) -> None:
    assert validate_program(Program(instructions=tuple(instrs), formats=FORMATS), layout) is None


def double_buffered(tiles: int, core: int = 0) -> list[Instruction]:
    """Stream ``tiles`` weight tiles through two SRAM buffers while the MXU consumes them.

    Flags (offset by ``10 * core``): ``1+b`` = buffer ``b`` loaded, ``3+b`` = buffer ``b``
    consumed (free again), ``5`` = activations loaded.
    """
    base = 10 * core
    buf = (TILE, 2 * TILE)
    instrs: list[Instruction] = [
        DmaLoad(core=core, signal=(base + 5,), src=2 * MiB, dst=0, nbytes=64)
    ]
    for t in range(tiles):
        b = t % 2
        wait = (base + 3 + b,) if t >= 2 else ()
        instrs.append(
            DmaLoad(
                core=core, wait=wait, signal=(base + 1 + b,), src=t * TILE, dst=buf[b], nbytes=TILE
            )
        )
    for t in range(tiles):
        b = t % 2
        wait = (base + 1 + b,) + ((base + 5,) if t == 0 else ())
        instrs.append(
            GEMM.replace(
                core=core, wait=wait, signal=(base + 3 + b,), w=buf[b], out=4 * TILE + 512 * t
            )
        )
    # Join the last "buffer free" signal of each buffer before storing the outputs.
    last = sorted({base + 3 + t % 2 for t in range(max(0, tiles - 2), tiles)})
    instrs.append(
        DmaStore(
            core=core, wait=tuple(last), src=4 * TILE, dst=2 * MiB + core * TILE, nbytes=512 * tiles
        )
    )
    return instrs


# ------------------------------------------------------------------------- passing


@pytest.mark.parametrize("layout", [LAYOUT, WITH_REGIONS], ids=["sizes", "regions"])
def test_double_buffered_program_validates(layout) -> None:
    passes(double_buffered(tiles=6) + double_buffered(tiles=3, core=1), layout)


def test_every_instruction_type_validates() -> None:
    passes(
        [
            Nop(on=Engine.D2H),
            DmaCopy(src=0, dst=MiB, nbytes=64),
            HostWrite(src=0, dst=0, nbytes=64),
            HostRead(src=0, dst=0, nbytes=64),
            GEMM.replace(w_bits=4, k=64, bias=0x8000, scale=0x9000, shift=7),
            GEMM.replace(w_bits=2, k=4),
            Vec(func=VecFunc.REQUANT, rows=2, cols=8, src0=0, dst=0x100),
            Vec(func=VecFunc.ADD, rows=2, cols=8, src0=0, src1=0x40, dst=0x100),
            KV_WRITE,
            KvRead(fmt=0, tokens=4, width=64, cap=4, src=0x100, dst=0x200, nbytes=256),
            ATTN,
        ]
    )


def test_empty_program_validates() -> None:
    passes([])


@given(programs(max_instructions=6))
def test_random_programs_raise_only_program_error(program: Program) -> None:
    try:
        validate_program(program, WITH_REGIONS)
    except ProgramError as e:
        assert 0 <= e.index < len(program)


# -------------------------------------------------------------------------- cores


def test_core_out_of_range() -> None:
    err = fails([GEMM, GEMM.replace(core=2)])
    assert err.index == 1
    assert "core 2 out of range (the layout has 2 cores)" in err.reason


@pytest.mark.parametrize(
    ("instr", "engine"),
    [
        (DmaCopy(core=1, src=0, dst=64, nbytes=64), "COPY"),
        (HostWrite(core=1, src=0, dst=0, nbytes=64), "H2D"),
        (HostRead(core=1, src=0, dst=0, nbytes=64), "D2H"),
        (Nop(core=1, on=Engine.COPY), "COPY"),
    ],
)
def test_device_wide_engines_require_core_0(instr, engine) -> None:
    err = fails([GEMM, instr])
    assert err.index == 1
    assert f"runs on the device-wide {engine} engine and requires core 0, not core 1" in (
        err.reason
    )


def test_per_core_nop_may_use_any_core() -> None:
    passes([Nop(core=1, on=Engine.DMA_OUT)])


# ---------------------------------------------------------------------- extents


def test_sram_overflow_names_role_extent_and_core() -> None:
    err = fails([DmaLoad(core=1, src=0, dst=0xF000, nbytes=0x2000)])
    assert err.index == 0
    assert err.reason == "dst: SRAM [0xf000, 0x11000) of core 1 overflows the 65536-byte SRAM"


def test_dram_and_host_overflow() -> None:
    err = fails([GEMM, DmaStore(src=0, dst=4 * MiB - 16, nbytes=32)])
    assert (err.index, err.reason) == (
        1,
        "dst: DRAM [0x3ffff0, 0x400010) overflows the 4194304-byte DRAM",
    )
    err = fails([HostWrite(src=MiB, dst=0, nbytes=1)])
    assert "src: HOST [0x100000, 0x100001) overflows the 1048576-byte HOST" in err.reason


def test_gemm_output_extent_depends_on_scale() -> None:
    # Without a scale the output is int32 (4 bytes per element), with one it is int8.
    gemm = GEMM.replace(n=4096, k=8, out=0xE000)
    passes([gemm.replace(scale=0x100)])
    err = fails([gemm])
    assert err.reason == "out: SRAM [0xe000, 0x12000) of core 0 overflows the 65536-byte SRAM"


def test_access_outside_every_region() -> None:
    err = fails([GEMM, DmaLoad(src=3 * MiB, dst=0, nbytes=64)], WITH_REGIONS)
    assert err.index == 1
    assert err.reason == (
        "src: address outside its region: DRAM [0x300000, 0x300040) lies in no DRAM region"
    )


def test_access_straddling_two_regions() -> None:
    err = fails([DmaLoad(src=2 * MiB - 32, dst=0, nbytes=64)], WITH_REGIONS)
    assert err.reason == (
        "src: address outside its region: DRAM [0x1fffe0, 0x200020) crosses the bounds of "
        "region 'weights' [0x0, 0x200000)"
    )
    err = fails([DmaLoad(src=0, dst=32 * KiB - 8, nbytes=64)], WITH_REGIONS)
    assert "dst: address outside its region: SRAM [0x7ff8, 0x8038) of core 0" in err.reason


def test_sram_regions_are_per_core() -> None:
    layout = MemoryLayout(
        dram_bytes=MiB,
        sram_bytes=64 * KiB,
        host_bytes=MiB,
        num_cores=2,
        regions=(Region("buf", Space.SRAM, 0, 64 * KiB, "scratch", core=0),),
    )
    passes([DmaLoad(core=0, src=0, dst=0x100, nbytes=64)], layout)
    err = fails([DmaLoad(core=1, src=0, dst=0x100, nbytes=64)], layout)
    assert err.reason == (
        "dst: address outside its region: SRAM [0x100, 0x140) of core 1 lies in no SRAM "
        "region of core 1"
    )


def test_zero_byte_transfer() -> None:
    err = fails([GEMM, DmaLoad(src=0x40, dst=0, nbytes=0)])
    assert (err.index, err.reason) == (1, "src: zero-byte transfer at DRAM 0x40")
    err = fails([GEMM.replace(m=0)])
    assert err.reason == "a: zero-byte transfer at SRAM 0x0"


def test_unused_operands_are_not_accesses() -> None:
    passes([Vec(func=VecFunc.COPY, rows=1, cols=8, src0=0, src1=NO_ADDR, dst=0x40)])


# ------------------------------------------------------------------- field values


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"w_bits": 3}, "w_bits must be one of (2, 4, 8), got 3"),
        ({"w_bits": 16}, "w_bits must be one of (2, 4, 8), got 16"),
        (
            {"w_bits": 4, "k": 63},
            "w_bits 4 packs 2 values per byte, so k must be a multiple of 2 (k=63)",
        ),
        (
            {"w_bits": 2, "k": 66},
            "w_bits 2 packs 4 values per byte, so k must be a multiple of 4 (k=66)",
        ),
    ],
)
def test_gemm_weight_packing(changes, reason) -> None:
    err = fails([GEMM, GEMM.replace(**changes)])
    assert err.index == 1
    assert reason in err.reason


def test_vec_func_must_be_a_vec_func() -> None:
    err = fails([Vec(func=15, rows=1, cols=8, src0=0, dst=0x40)])
    assert err.index == 0
    assert "func 15 is not a valid VecFunc" in err.reason


def test_nop_engine_must_be_an_engine() -> None:
    err = fails([Nop(on=7)])
    assert "on 7 is not a valid Engine" in err.reason


@pytest.mark.parametrize(
    ("instr", "reason"),
    [
        (KV_WRITE.replace(fmt=2), "fmt 2 is not an index into the program's 2 formats"),
        (
            KvRead(fmt=5, tokens=1, width=8, cap=1, src=0, dst=0x40, nbytes=8),
            "fmt 5 is not an index into the program's 2 formats",
        ),
        (ATTN.replace(k_fmt=2), "k_fmt 2 is not an index"),
        (ATTN.replace(v_fmt=65535), "v_fmt 65535 is not an index"),
    ],
)
def test_format_indices(instr, reason) -> None:
    err = fails([KV_WRITE, instr])
    assert err.index == 1
    assert reason in err.reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"heads": 6, "kv_heads": 4}, "heads (6) must be a multiple of kv_heads (4)"),
        ({"kv_heads": 0}, "heads (4) must be a multiple of kv_heads (0)"),
        ({"ctx": 0}, "ctx must be >= 1, got 0"),
    ],
)
def test_attention_shape(changes, reason) -> None:
    err = fails([ATTN.replace(**changes)])
    assert (err.index, err.reason) == (0, reason)


@pytest.mark.parametrize(
    ("instr", "formats", "reason"),
    [
        (KV_WRITE.replace(nbytes=40), FORMATS,
         "nbytes 40 is not the size of a 16-token kivi-4.v region of width 64: 2052 bytes"),
        (KvRead(fmt=0, tokens=4, width=64, cap=8, src=0x100, dst=0x200, nbytes=256), FORMATS,
         "nbytes 256 is not the size of a 8-token int8 region of width 64: 512 bytes"),
        (KV_WRITE.replace(cap=0), FORMATS, "cap (the cache's capacity in tokens) must be >= 1"),
        (ATTN.replace(cap=0), FORMATS, "cap (the cache's capacity in tokens) must be >= 1"),
        (KV_WRITE, ("int8", "kv4-g32"), "fmt 1 names no KV format: unknown KV format 'kv4-g32'"),
        (ATTN, ("kivi-4", "int8"), "k_fmt 0 names no KV format: KV layout 'kivi-4' has"),
        (KvRead(fmt=0, tokens=1, width=8, cap=1, src=0, dst=0x40, nbytes=8),
         ("quantmla-c4r4",), "width 8: quantmla-c4r4: width 8 leaves no content values"),
    ],
)
def test_kv_formats_and_region_sizes(instr, formats, reason) -> None:
    """A KV instruction names a real format and addresses a whole region of it: a wrong
    ``nbytes`` would be priced in a timing-only run and refused only in a functional one."""
    with pytest.raises(ProgramError) as info:
        validate_program(Program(instructions=(instr,), formats=formats), LAYOUT)
    assert (info.value.index, reason in info.value.reason) == (0, True), info.value.reason


# -------------------------------------------------------------------------- flags


def test_flag_waited_more_often_than_signalled() -> None:
    instrs = [
        GEMM.replace(signal=(7,)),
        GEMM.replace(wait=(7,)),
        GEMM.replace(wait=(7,)),
        GEMM.replace(wait=(7,)),
    ]
    err = fails(instrs)
    assert err.index == 1
    assert "waits on flag 7 (3 times) but it is signalled only 1 time" in err.reason


def test_flag_never_signalled_reports_first_waiter() -> None:
    err = fails([GEMM.replace(signal=(1,)), GEMM.replace(wait=(1,)), GEMM.replace(wait=(2, 9))])
    assert (err.index, err.reason) == (
        2,
        "waits on flag 2 (1 time) but it is never signalled (deadlock)",
    )


def test_extra_signals_are_fine() -> None:
    passes([GEMM.replace(signal=(1, 1)), GEMM.replace(wait=(1,))])


def test_first_bad_instruction_is_reported() -> None:
    err = fails([GEMM.replace(wait=(5,)), GEMM.replace(core=9), GEMM.replace(w_bits=1)])
    assert err.index == 1
    assert str(err).startswith("instruction 1: core 9")


def test_a_repeated_bad_object_is_reported_at_its_first_place() -> None:
    """validate_program checks each instruction object once; the error names the first
    index the bad object holds."""
    bad = GEMM.replace(core=2)
    err = fails([GEMM, bad, GEMM, bad])
    assert err.index == 1
    assert "core 2 out of range" in err.reason


def test_an_instruction_checked_once_is_not_checked_again_against_the_same_layout(
        monkeypatch):
    import isa.validate as validate

    gemm = Gemm(m=1, k=64, n=128, w_bits=8, a=0, w=TILE, out=4 * TILE)
    seen = []
    check = validate.batched_ok  # every object not yet checked goes there first

    def counted(objs, *args):
        seen.extend(objs)
        return check(objs, *args)

    monkeypatch.setattr(validate, "batched_ok", counted)
    validate_program(Program([gemm, gemm], formats=FORMATS), LAYOUT)
    validate_program(Program([gemm], formats=FORMATS), LAYOUT)  # a later call: remembered
    assert seen == [gemm]
    validate_program(Program([gemm], formats=FORMATS[:1]), LAYOUT)  # other formats
    small = MemoryLayout(dram_bytes=4 * MiB, sram_bytes=16 * KiB, host_bytes=1 * MiB,
                         num_cores=2)
    with pytest.raises(ProgramError, match="overflows the 16384-byte SRAM"):  # another layout
        validate_program(Program([gemm], formats=FORMATS), small)
    assert seen == [gemm, gemm, gemm]
    # the flags of each program are still checked on every call
    waiting = Nop(on=Engine.DMA_OUT, wait=(3,))
    with pytest.raises(ProgramError, match="never signalled"):
        validate_program(Program([gemm, waiting], formats=FORMATS), LAYOUT)


def test_the_remembered_instructions_are_bounded(monkeypatch):
    import isa.validate as validate

    monkeypatch.setattr(validate, "MAX_REMEMBERED_INSTRUCTIONS", 3)
    monkeypatch.setattr(validate, "_REMEMBERED", {})
    gemms = [Gemm(m=1, k=64, n=128, w_bits=8, a=0, w=TILE, out=4 * TILE) for _ in range(4)]
    validate_program(Program(gemms[:3], formats=FORMATS), LAYOUT)
    assert sum(map(len, validate._REMEMBERED.values())) == 3
    validate_program(Program(gemms[3:], formats=FORMATS), LAYOUT)
    assert sum(map(len, validate._REMEMBERED.values())) <= 3


def _near(points: list[int], hi: int):
    """Values at and around ``points`` (region and memory bounds), and anywhere below hi."""
    from hypothesis import strategies as st

    return st.one_of(st.sampled_from(points).flatmap(
        lambda p: st.integers(max(0, p - 70), min(hi, p + 70))), st.integers(0, hi))


def _dma_load_fields():
    from hypothesis import strategies as st

    bounds = [0, 32 * KiB, 64 * KiB, 2 * MiB, 3 * MiB, 4 * MiB]
    return st.fixed_dictionaries({
        "core": st.integers(0, 3),
        "src": _near(bounds, 2**64 - 1),
        "dst": _near(bounds, 2**64 - 1),
        "nbytes": _near([0, 1, 64, 4 * KiB, 32 * KiB], 2**32 - 1),
        "rows": _near([0, 1, 2, 8, 512], 2**32 - 1),
        "src_stride": _near([0, 64, 4 * KiB], 2**32 - 1),
        "dst_stride": _near([0, 64, 4 * KiB], 2**32 - 1),
    })


@given(fields=_dma_load_fields())
def test_the_batched_dma_load_check_passes_only_what_the_scalar_checks_pass(fields):
    """validate_program checks a program's DmaLoads at once in arrays and sends what that
    does not pass to the per-instruction checks: its verdict and message, with and without
    regions, are those of the per-instruction checks alone."""
    import isa.validate as validate

    load = DmaLoad(**fields)
    for layout in (LAYOUT, WITH_REGIONS):
        verdicts = []
        for batched in (True, False):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(validate, "_REMEMBERED", {})
                if not batched:
                    mp.setattr(validate, "batched_ok", lambda objs, *a: np.zeros(len(objs), bool))
                try:
                    validate_program(Program([load], formats=FORMATS), layout)
                    verdicts.append(None)
                except ProgramError as err:
                    verdicts.append(str(err))
        assert verdicts[0] == verdicts[1], (fields, layout.regions)
