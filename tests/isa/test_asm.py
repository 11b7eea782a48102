"""Assembly text: exact round-trips, the accepted syntax, and every error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isa.asm import assemble, disassemble, disassemble_instruction
from isa.encoding import decode_program, encode_program
from isa.errors import AssembleError
from isa.instructions import (
    BY_MNEMONIC,
    INSTRUCTION_TYPES,
    NO_ADDR,
    Attn,
    DmaLoad,
    Engine,
    Gemm,
    Nop,
    Program,
    Vec,
    VecFunc,
)
from tests.isa.strategies import extreme_instruction, instructions_of, programs

# ------------------------------------------------------------------------- round trips


@given(programs())
def test_disassemble_assemble_round_trip(program: Program) -> None:
    text = disassemble(program)
    assert assemble(text) == program
    assert disassemble(assemble(text)) == text


@pytest.mark.parametrize("cls", INSTRUCTION_TYPES, ids=lambda c: c.mnemonic)
@given(data=st.data())
def test_every_type_round_trips(cls, data) -> None:
    program = Program(instructions=(data.draw(instructions_of(cls)),))
    assert assemble(disassemble(program)) == program


@pytest.mark.parametrize("edge", ["min", "max"])
@pytest.mark.parametrize("cls", INSTRUCTION_TYPES, ids=lambda c: c.mnemonic)
def test_extreme_values_round_trip(cls, edge) -> None:
    program = Program(instructions=(extreme_instruction(cls, edge),))
    assert assemble(disassemble(program)) == program


@given(programs(max_instructions=6))
def test_text_and_binary_agree(program: Program) -> None:
    assert decode_program(encode_program(assemble(disassemble(program)))) == program


@pytest.mark.parametrize(
    "name", ["", " padded ", "a # b", '"quoted"', "tab\there", "line\nbreak", "ünï", "\\"]
)
def test_awkward_names_round_trip(name: str) -> None:
    program = Program(instructions=(), formats=(name, "plain"), name=name)
    assert assemble(disassemble(program)) == program


# ---------------------------------------------------------------------------- syntax

SOURCE = """\
# a tiny decode step
.name  decode step          # names may hold spaces
.format kv4-g32
.format "kv8 # per-token"

dma.load core=1 signal=1 src=0x10000 dst=0 nbytes=4096
GEMM core=1 wait=1 signal=2,3 m=1 k=4096 n=1 w_bits=4 a=0 w=0x1000 out=0X2000
vec func=rmsnorm rows=1 cols=4096 src0=0 dst=0x1000 p0=-7 p1=-0x10
vec func=2 rows=1 cols=1 src0=0 dst=0 src1=0x40
nop on=dma_in wait=2
nop on=H2D wait=3   # names are case-insensitive
"""


def test_assemble_source() -> None:
    program = assemble(SOURCE)
    assert program.name == "decode step"
    assert program.formats == ("kv4-g32", "kv8 # per-token")
    assert program.instructions == (
        DmaLoad(core=1, signal=(1,), src=0x10000, dst=0, nbytes=4096),
        Gemm(
            core=1,
            wait=(1,),
            signal=(2, 3),
            m=1,
            k=4096,
            n=1,
            w_bits=4,
            a=0,
            w=0x1000,
            out=0x2000,
        ),
        Vec(func=VecFunc.RMSNORM, rows=1, cols=4096, src0=0, dst=0x1000, p0=-7, p1=-16),
        Vec(func=VecFunc.RMSNORM, rows=1, cols=1, src0=0, dst=0, src1=0x40),
        Nop(on=Engine.DMA_IN, wait=(2,)),
        Nop(on=Engine.H2D, wait=(3,)),
    )


def test_disassembly_is_readable() -> None:
    gemm = Gemm(
        core=1, wait=(1, 2), signal=(3,), m=1, k=64, n=8, w_bits=4, a=0, w=0x1000, out=0x2000
    )
    assert disassemble_instruction(gemm) == (
        "gemm core=1 wait=1,2 signal=3 m=1 k=64 n=8 w_bits=4 a=0x0 w=0x1000 out=0x2000"
    )
    vec = Vec(func=VecFunc.SILU_MUL, rows=2, cols=8, src0=0, src1=0x10, dst=0x20, p2=-3)
    assert disassemble_instruction(vec) == (
        "vec func=silu_mul rows=2 cols=8 src0=0x0 src1=0x10 dst=0x20 p2=-3"
    )
    assert disassemble_instruction(Nop(on=Engine.COPY)) == "nop on=copy"


def test_defaults_are_omitted_and_restored() -> None:
    text = "gemm m=1 k=2 n=3 w_bits=8 a=0 w=0 out=0\n"
    gemm = assemble(text).instructions[0]
    assert (gemm.bias, gemm.scale, gemm.shift, gemm.core, gemm.wait) == (NO_ADDR, NO_ADDR, 0, 0, ())
    assert disassemble(assemble(text)) == "gemm m=1 k=2 n=3 w_bits=8 a=0x0 w=0x0 out=0x0\n"


def test_comments_blank_lines_and_crlf() -> None:
    assert assemble("\r\n  # only a comment\r\n\r\n") == Program(instructions=())
    assert assemble("nop on=vpu # c\r\n").instructions == (Nop(on=Engine.VPU),)


# ---------------------------------------------------------------------------- errors

ATTN = (
    "attn q_len=1 ctx=8 heads=4 kv_heads=1 head_dim=64 k_fmt=0 v_fmt=0 q=0 k=0 v=0 out=0 "
    "k_nbytes=1 v_nbytes=1"
)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gemmm m=1", r"unknown mnemonic 'gemmm' \(known: attn, attn.dq, dma.copy"),
        ("nop on=vpu color=red", r"nop: unknown field 'color' \(fields: core, wait, signal, on\)"),
        ("vec func=add rows=1 cols=1", "vec: missing required field(s) src0, dst"),
        ("nop on=vpu core=1x", r"nop: bad number '1x' \(expected decimal or 0x hex\)"),
        ("nop on=vpu core=", "nop: bad number ''"),
        ("nop on=vpu wait=1,,2", "nop: bad number ''"),
        ("nop on=vpu core=0b1", "nop: bad number '0b1'"),
        ("nop on=vpu core=256", r"nop: core=256 is out of range for u8 \[0, 255\]"),
        ("nop on=vpu signal=65536", "nop: signal=65536 is out of range for u16"),
        (ATTN + " heads=-1", "attn: duplicate field 'heads'"),
        (ATTN.replace("heads=4", "heads=-1"), "attn: heads=-1 is out of range for u16"),
        (ATTN + " out_mult=2147483648", "attn: out_mult=2147483648 is out of range for i32"),
        ("nop on=warp", r"nop: on=warp: unknown Engine name \(valid: dma_in, dma_out, mxu"),
        ("nop on=7", "nop: on=7 is not a valid Engine"),
        ("nop on=vpu on=mxu", "nop: duplicate field 'on'"),
        ("nop on=vpu wait=1 wait=2", "nop: duplicate field 'wait'"),
        ("nop on=vpu core", "nop: expected field=value, got 'core'"),
        ("nop on=vpu =3", "nop: expected field=value, got '=3'"),
        (".fromat x", r"unknown directive '.fromat' \(known: .format, .name\)"),
        (".format", ".format needs an argument"),
        (".format  # nothing", ".format needs an argument"),
        ('.format "open', ".format: bad quoted string"),
        ('.format "a" b', r".format: unexpected text 'b' after the quoted string"),
        ('.format "\\ud800"', ".format: argument is not encodable as utf-8"),
    ],
)
def test_errors_name_the_line_and_problem(line: str, message: str) -> None:
    text = "# header\nnop on=vpu\n" + line + "\nnop on=mxu\n"
    with pytest.raises(AssembleError, match="line 3: " + message.replace("(s)", r"\(s\)")):
        assemble(text)


def test_too_many_flags() -> None:
    flags = ",".join(["1"] * 256)
    with pytest.raises(AssembleError, match="line 1: nop: wait= lists 256 flags; at most 255"):
        assemble(f"nop on=vpu wait={flags}")


def test_duplicate_name_directive() -> None:
    with pytest.raises(AssembleError, match="line 2: duplicate .name directive"):
        assemble(".name a\n.name b\n")


# ------------------------------------------------------------------------ robustness

_TOKENS = st.one_of(
    st.sampled_from(sorted(BY_MNEMONIC) + [".format", ".name", "#", "=", ",", '"']),
    st.builds(
        "{}={}".format,
        st.sampled_from(["core", "wait", "signal", "func", "on", "k", "src", "p0", "x"]),
        st.one_of(
            st.from_regex(r"[+-]?(0x)?[0-9a-f,]{0,22}", fullmatch=True),
            st.sampled_from([n.lower() for n in Engine.__members__]),
            st.text(max_size=4),
        ),
    ),
    st.text(max_size=6),
)


@given(st.lists(st.lists(_TOKENS, max_size=12).map(" ".join), max_size=6).map("\n".join))
def test_random_token_lines_raise_only_assemble_error(text: str) -> None:
    try:
        assemble(text)
    except AssembleError:
        pass


@given(st.text(max_size=200))
def test_random_text_raises_only_assemble_error(text: str) -> None:
    try:
        assemble(text)
    except AssembleError:
        pass


def test_error_for_every_missing_field_names_them_all() -> None:
    with pytest.raises(AssembleError, match="line 1: attn: missing required field") as info:
        assemble("attn")
    for f in Attn.body_fields():
        if f.name in ("q_len", "ctx", "heads", "kv_heads", "head_dim", "q", "out"):
            assert f.name in str(info.value)


@pytest.mark.parametrize("text, message", [
    (None, "assembly is text"),
    (b"nop", "assembly is text"),
    ("dma.load core=0 src=0 dst=0 nbytes=" + "9" * 5000, "number too large"),
])
def test_assembler_refuses_non_text_and_huge_numbers(text, message):
    with pytest.raises(AssembleError, match=message):
        assemble(text)


@pytest.mark.parametrize("buf", ["KVSI", None, 5])
def test_decoder_refuses_what_is_not_bytes(buf):
    from isa.errors import DecodeError

    with pytest.raises(DecodeError, match="a program is bytes"):
        decode_program(buf)


@pytest.mark.parametrize("spec, message", [
    (None, "named by a string"),
    (5, "named by a string"),
    ("b4.token.g" + "9" * 5000, "number too large"),
])
def test_format_names_must_be_sane_strings(spec, message):
    from isa import kvformats
    from isa.errors import FormatError

    with pytest.raises(FormatError, match=message):
        kvformats.parse(spec)
    with pytest.raises(FormatError, match=message):
        kvformats.pair(spec)
