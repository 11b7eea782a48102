"""Binary encoding: exact round-trips, the documented layout, and every error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isa.encoding import (
    FORMAT_VERSION,
    MAGIC,
    decode_instruction,
    decode_program,
    encode_instruction,
    encode_program,
)
from isa.errors import DecodeError, IsaError
from isa.instructions import (
    INSTRUCTION_TYPES,
    NO_ADDR,
    DmaLoad,
    Engine,
    Gemm,
    Nop,
    Program,
    Vec,
    VecFunc,
)
from tests.isa.strategies import extreme_instruction, instructions, instructions_of, programs

GEMM = Gemm(m=1, k=64, n=16, w_bits=4, a=0, w=0x100, out=0x400)
VEC = Vec(func=VecFunc.RMSNORM, rows=1, cols=64, src0=0, dst=0x40)


# ------------------------------------------------------------------------- round trips


@given(programs())
def test_program_round_trip(program: Program) -> None:
    assert decode_program(encode_program(program)) == program


@pytest.mark.parametrize("cls", INSTRUCTION_TYPES, ids=lambda c: c.mnemonic)
@given(data=st.data())
def test_every_type_round_trips(cls, data) -> None:
    instr = data.draw(instructions_of(cls))
    prefix = data.draw(st.binary(max_size=8))
    blob = prefix + encode_instruction(instr)
    assert decode_instruction(blob, len(prefix)) == (instr, len(blob))


@pytest.mark.parametrize("edge", ["min", "max"])
@pytest.mark.parametrize("cls", INSTRUCTION_TYPES, ids=lambda c: c.mnemonic)
def test_extreme_values_round_trip(cls, edge) -> None:
    program = Program(instructions=(extreme_instruction(cls, edge),), formats=("x",), name="e")
    assert decode_program(encode_program(program)) == program


@given(st.lists(instructions(), max_size=6))
def test_instructions_decode_back_to_back(instrs) -> None:
    blob = b"".join(encode_instruction(i) for i in instrs)
    offset, out = 0, []
    while offset < len(blob):
        instr, offset = decode_instruction(blob, offset)
        out.append(instr)
    assert out == instrs


def test_empty_program_round_trips() -> None:
    assert decode_program(encode_program(Program(instructions=()))) == Program(instructions=())


def test_enum_members_decode_equal() -> None:
    instr = Nop(on=Engine.H2D)
    assert decode_instruction(encode_instruction(instr))[0] == instr


# ---------------------------------------------------------------------------- layout


def test_documented_layout() -> None:
    program = Program(
        instructions=(
            Nop(core=1, wait=(7,), signal=(0x102, 3), on=Engine.MXU),
            DmaLoad(src=0x10, dst=0x20, nbytes=0x30),
        ),
        formats=("kv4",),
        name="é",
    )
    expected = (
        MAGIC
        + struct.pack("<HI", FORMAT_VERSION, 2)
        + struct.pack("<HH", 1, 3)
        + b"kv4"
        + struct.pack("<H", 2)
        + "é".encode()
        + bytes([0x00, 1, 1, 2])
        + struct.pack("<HHH", 7, 0x102, 3)
        + bytes([Engine.MXU])
        + bytes([0x10, 0, 0, 0])
        + struct.pack("<QQIIII", 0x10, 0x20, 0x30, 1, 0, 0)  # rows=1, strides 0
    )
    assert encode_program(program) == expected


def test_signed_fields_are_twos_complement() -> None:
    blob = encode_instruction(VEC.replace(p0=-1, p3=-(2**31)))
    assert blob.endswith(struct.pack("<iiii", -1, 0, 0, -(2**31)))


# ----------------------------------------------------------------------- decode errors


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(blob: bytes) -> None:
    for data in (blob, MAGIC + struct.pack("<H", FORMAT_VERSION) + blob):
        try:
            decode_program(data)
        except DecodeError:
            pass


@given(programs(max_instructions=4), st.data())
def test_corrupted_encodings_raise_only_decode_error(program, data) -> None:
    blob = bytearray(encode_program(program))
    i = data.draw(st.integers(0, len(blob) - 1))
    blob[i] = data.draw(st.integers(0, 255))
    try:
        decode_program(bytes(blob))
    except DecodeError:
        pass


@given(programs(max_instructions=4))
def test_every_truncation_is_reported(program) -> None:
    blob = encode_program(program)
    for n in range(len(blob)):
        with pytest.raises(DecodeError):
            decode_program(blob[:n])


def _program_bytes(*instrs, formats=("kv8",), name="p") -> bytes:
    return encode_program(Program(instructions=tuple(instrs), formats=formats, name=name))


def test_bad_magic() -> None:
    with pytest.raises(DecodeError, match="bad magic b'ELF1'"):
        decode_program(b"ELF1" + _program_bytes()[4:])


def test_unsupported_version() -> None:
    blob = bytearray(_program_bytes())
    blob[4:6] = struct.pack("<H", 9)
    with pytest.raises(DecodeError, match="unsupported format version 9"):
        decode_program(bytes(blob))


def test_unknown_opcode_names_opcode_and_offset() -> None:
    blob = bytearray(_program_bytes(GEMM, VEC))
    second = len(blob) - len(encode_instruction(VEC))
    blob[second] = 0x7F
    message = rf"instruction 1: unknown opcode 0x7f at byte offset {second}$"
    with pytest.raises(DecodeError, match=message):
        decode_program(bytes(blob))


def test_truncated_body() -> None:
    blob = _program_bytes(GEMM)
    body_at = len(blob) - len(encode_instruction(GEMM)) + 4
    with pytest.raises(
        DecodeError,
        match=rf"truncated data: instruction 0 \(gemm\) body at byte offset {body_at} "
        r"needs 58 bytes, 10 left",
    ):
        decode_program(blob[: body_at + 10])


def test_truncated_header() -> None:
    with pytest.raises(DecodeError, match="truncated data: program header"):
        decode_program(MAGIC + b"\x01")


def test_trailing_bytes() -> None:
    blob = _program_bytes(GEMM)
    with pytest.raises(DecodeError, match=rf"3 trailing bytes at byte offset {len(blob)}"):
        decode_program(blob + b"\0\0\0")


def test_enum_out_of_range() -> None:
    blob = bytearray(_program_bytes(VEC))
    func_at = len(blob) - len(encode_instruction(VEC)) + 4
    assert blob[func_at] == VecFunc.RMSNORM
    blob[func_at] = 99
    with pytest.raises(DecodeError, match="field 'func' = 99 is not a valid VecFunc"):
        decode_program(bytes(blob))


@pytest.mark.parametrize("where", ["format 0", "program name"])
def test_bad_utf8(where) -> None:
    blob = bytearray(_program_bytes(formats=("abc",), name="xyz"))
    text = b"abc" if where == "format 0" else b"xyz"
    i = blob.index(text)
    blob[i] = 0xFF
    with pytest.raises(DecodeError, match=f"{where} at byte offset {i} is not valid utf-8"):
        decode_program(bytes(blob))


def test_decode_instruction_offset_outside_buffer() -> None:
    with pytest.raises(DecodeError, match="offset 9 is outside"):
        decode_instruction(b"\0" * 4, 9)


# ----------------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"k": -1}, r"instruction 1 \(gemm\): field 'k' = -1 is out of range for u32"),
        ({"n": 2**32}, r"field 'n' = 4294967296 is out of range for u32 \[0, 4294967295\]"),
        ({"a": NO_ADDR + 1}, r"field 'a' = .* is out of range for u64"),
        ({"shift": 256}, r"field 'shift' = 256 is out of range for u8"),
        ({"core": 256}, r"field 'core' = 256 is out of range for u8"),
        ({"wait": (0,) * 256}, r"field 'wait' has 256 flags; at most 255 fit"),
        ({"signal": (65536,)}, r"field 'signal': flag 65536 is out of range for u16"),
        ({"m": "3"}, r"field 'm' = '3' is not an integer"),
    ],
)
def test_encode_rejects_values_that_do_not_fit(changes, message) -> None:
    program = Program(instructions=(VEC, GEMM.replace(**changes)))
    with pytest.raises(IsaError, match=message):
        encode_program(program)


def test_encode_rejects_signed_overflow_and_bad_enum() -> None:
    with pytest.raises(IsaError, match=r"field 'p1' = 2147483648 is out of range for i32"):
        encode_instruction(VEC.replace(p1=2**31))
    with pytest.raises(IsaError, match="field 'func' = 42 is not a valid VecFunc"):
        encode_instruction(VEC.replace(func=42))


def test_encode_accepts_255_flags() -> None:
    instr = GEMM.replace(wait=tuple(range(255)), signal=(65535,) * 255)
    assert decode_instruction(encode_instruction(instr)) == (instr, len(encode_instruction(instr)))


def test_encode_rejects_unencodable_text() -> None:
    with pytest.raises(IsaError, match="format 1 is not encodable as utf-8"):
        encode_program(Program(instructions=(), formats=("ok", "\ud800")))
    with pytest.raises(IsaError, match="program name is 65536 bytes"):
        encode_program(Program(instructions=(), name="x" * 65536))


@given(st.lists(instructions(), min_size=1, max_size=6))
def test_program_body_is_each_instruction_checked_encoding(instrs) -> None:
    """encode_program packs each instruction in one call (and each repeated object once);
    its body equals the checking encoder's bytes, back to back."""
    repeated = instrs + instrs[::-1]
    blob = encode_program(Program(instructions=tuple(repeated), formats=(), name=""))
    body = b"".join(encode_instruction(i) for i in repeated)
    assert blob.endswith(body)
    assert len(blob) == struct.calcsize("<4sHI") + 2 + 2 + len(body)


def test_program_error_names_the_first_bad_instruction_of_a_repeated_object() -> None:
    bad = Nop(core=256, on=1)
    with pytest.raises(IsaError, match=r"instruction 1 \(nop\): field 'core' = 256"):
        encode_program(Program(instructions=(GEMM, bad, bad), formats=(), name=""))
