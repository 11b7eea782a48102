"""Binary encoding of ISA v1 programs, and its decoder.

Layout (every integer little-endian)::

    program      magic b"KVSI"  version u16  instruction count u32
                 format table: count u16, then per format: byte length u16 + utf-8 text
                 name: byte length u16 + utf-8 text
                 the instructions, back to back
    instruction  opcode u8  core u8  wait count u8  signal count u8
                 the wait flags, then the signal flags, u16 each
                 the body fields in declaration order, each packed with its ``fmt`` code

The body layout is derived from each instruction dataclass (``Instruction.body_fields()``
and the ``fmt``/``enum`` entries of the field metadata), so a new instruction type needs
no change here. Decoding raises only :class:`~isa.errors.DecodeError`; encoding raises
:class:`~isa.errors.IsaError` naming the instruction index and the field that does not fit.

The helpers :func:`int_range`, :func:`value_problem`, :func:`field_default` and
:func:`field_enum` are shared with the assembler (:mod:`isa.asm`) and the tests.
"""

from __future__ import annotations

import dataclasses
import struct
from enum import IntEnum
from functools import cache
from itertools import repeat
from operator import attrgetter
from typing import Any

from isa.errors import DecodeError, IsaError
from isa.instructions import BY_OPCODE, Instruction, Program

MAGIC = b"KVSI"
FORMAT_VERSION = 1

#: struct codes of the header fields every instruction has.
CORE_CODE = "B"
FLAG_CODE = "H"
#: Flag counts are stored as u8, so an instruction waits on / signals at most this many.
MAX_FLAGS = 255
#: Format-table entries and texts have u16 counts and lengths.
MAX_TEXT_BYTES = 0xFFFF
MAX_FORMATS = 0xFFFF
MAX_INSTRUCTIONS = 0xFFFF_FFFF

_PROGRAM_HEADER = struct.Struct("<4sHI")
_INSTRUCTION_HEADER = struct.Struct("<BBBB")
_U16 = struct.Struct("<H")
_INTEGER_CODES = frozenset("bBhHiIlLqQ")


# --------------------------------------------------------------------------- field helpers


def int_range(code: str) -> tuple[int, int]:
    """Inclusive ``(min, max)`` of the integer :mod:`struct` code ``code`` (standard sizes)."""
    if code not in _INTEGER_CODES:
        raise TypeError(f"struct code {code!r} is not an integer code")
    bits = 8 * struct.calcsize("<" + code)
    if code.islower():
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def width_name(code: str) -> str:
    """``"u32"`` for ``"I"``, ``"i32"`` for ``"i"``, ... ."""
    bits = 8 * struct.calcsize("<" + code)
    return f"{'i' if code.islower() else 'u'}{bits}"


def field_enum(f: dataclasses.Field) -> type[IntEnum] | None:
    """The enum a field's values must belong to (metadata ``enum``), if any."""
    return f.metadata.get("enum")


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value, or :data:`dataclasses.MISSING` when it is required."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@cache
def enum_values(enum: type[IntEnum]) -> frozenset[int]:
    return frozenset(m.value for m in enum)


def enum_choices(enum: type[IntEnum]) -> str:
    return ", ".join(f"{m.name.lower()}={m.value}" for m in enum)


def value_problem(value: object, code: str, enum: type[IntEnum] | None = None) -> str | None:
    """Why ``value`` cannot be stored with struct code ``code`` (and ``enum``), or None."""
    if not isinstance(value, int):
        return f"is not an integer (got {type(value).__name__})"
    lo, hi = int_range(code)
    if not lo <= value <= hi:
        return f"is out of range for {width_name(code)} [{lo}, {hi}]"
    if enum is not None and value not in enum_values(enum):
        return f"is not a valid {enum.__name__} (one of {enum_choices(enum)})"
    return None


@cache
def body_layout(cls: type[Instruction]) -> tuple[tuple[dataclasses.Field, ...], struct.Struct]:
    """The body fields of ``cls`` and the struct that packs them, in declaration order."""
    fields = tuple(cls.body_fields())
    codes = []
    for f in fields:
        code = f.metadata.get("fmt")
        if code not in _INTEGER_CODES:
            raise TypeError(f"{cls.__name__}.{f.name} has no integer struct code in 'fmt'")
        codes.append(code)
    return fields, struct.Struct("<" + "".join(codes))


# --------------------------------------------------------------------------------- encode


def _instruction_type(instr: object, where: str) -> type[Instruction]:
    cls = type(instr)
    if not isinstance(instr, Instruction) or BY_OPCODE.get(getattr(cls, "opcode", -1)) is not cls:
        raise IsaError(f"{where}: {cls.__name__} is not an ISA v1 instruction type")
    return cls


def encode_instruction(instr: Instruction, *, index: int | None = None) -> bytes:
    """Encode one instruction; ``index`` (its place in a program) only goes into errors."""
    where = "instruction" if index is None else f"instruction {index}"
    cls = _instruction_type(instr, where)
    where = f"{where} ({cls.mnemonic})"

    def check(name: str, value: object, code: str, enum: type[IntEnum] | None = None) -> None:
        problem = value_problem(value, code, enum)
        if problem is not None:
            raise IsaError(f"{where}: field {name!r} = {value!r} {problem}")

    check("core", instr.core, CORE_CODE)
    flags: list[int] = []
    for name in ("wait", "signal"):
        ids = tuple(getattr(instr, name))
        if len(ids) > MAX_FLAGS:
            raise IsaError(f"{where}: field {name!r} has {len(ids)} flags; at most {MAX_FLAGS} fit")
        for flag in ids:
            problem = value_problem(flag, FLAG_CODE)
            if problem is not None:
                raise IsaError(f"{where}: field {name!r}: flag {flag!r} {problem}")
        flags.extend(ids)

    fields, body = body_layout(cls)
    values = []
    for f in fields:
        value = getattr(instr, f.name)
        check(f.name, value, f.metadata["fmt"], field_enum(f))
        values.append(value)

    return (
        _INSTRUCTION_HEADER.pack(cls.opcode, instr.core, len(instr.wait), len(instr.signal))
        + struct.pack(f"<{len(flags)}{FLAG_CODE}", *flags)
        + body.pack(*values)
    )


def _encode_text(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise IsaError(f"{what} must be a str, got {type(text).__name__}")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise IsaError(f"{what} is not encodable as utf-8: {e.reason}") from None
    if len(raw) > MAX_TEXT_BYTES:
        raise IsaError(f"{what} is {len(raw)} bytes of utf-8; at most {MAX_TEXT_BYTES} fit")
    return _U16.pack(len(raw)) + raw


@cache
def _fast_plan(cls: type[Instruction]) -> tuple[Any, tuple[tuple[int, frozenset[int]], ...], str]:
    """What :func:`_encode_fast` needs for ``cls``: a getter of its body values, the
    (position, valid values) of its enum fields, and the body's struct codes."""
    fields, body = body_layout(cls)
    names = [f.name for f in fields]
    getter = (lambda _i: ()) if not names else (
        (lambda i, _n=names[0]: (getattr(i, _n),)) if len(names) == 1
        else attrgetter(*names))
    enums = tuple((j, enum_values(e)) for j, f in enumerate(fields)
                  if (e := field_enum(f)) is not None)
    return getter, enums, body.format[1:]


@cache
def _full_struct(body_codes: str, n_flags: int) -> struct.Struct:
    return struct.Struct(f"<BBBB{n_flags}{FLAG_CODE}{body_codes}")


def _encode_fast(instr: Instruction) -> bytes | None:
    """The bytes :func:`encode_instruction` gives for ``instr``, packed in one call; None
    when any check could fail (the caller then takes the checking path, which names the
    field at fault). Same bytes by construction: one struct of the same codes in the same
    order, and ``struct`` rejects every out-of-range value with the standard sizes."""
    cls = type(instr)
    if BY_OPCODE.get(getattr(cls, "opcode", -1)) is not cls:
        return None
    getter, enums, codes = _fast_plan(cls)
    values = getter(instr)
    for j, valid in enums:
        if values[j] not in valid:
            return None
    wait, signal = instr.wait, instr.signal
    nw, ns = len(wait), len(signal)
    if nw > MAX_FLAGS or ns > MAX_FLAGS:
        return None
    core = instr.core
    allv = (cls.opcode, core, nw, ns, *wait, *signal, *values)
    if not all(map(isinstance, allv[1:], repeat(int))):
        return None
    try:
        return _full_struct(codes, nw + ns).pack(*allv)
    except struct.error:
        return None


def encode_program(program: Program) -> bytes:
    """Encode ``program`` (header, format table, name, instructions) to bytes."""
    count = len(program.instructions)
    if count > MAX_INSTRUCTIONS:
        raise IsaError(f"program has {count} instructions; at most {MAX_INSTRUCTIONS} fit")
    if len(program.formats) > MAX_FORMATS:
        raise IsaError(f"program has {len(program.formats)} formats; at most {MAX_FORMATS} fit")
    out = bytearray(_PROGRAM_HEADER.pack(MAGIC, FORMAT_VERSION, count))
    out += _U16.pack(len(program.formats))
    for j, fmt in enumerate(program.formats):
        out += _encode_text(fmt, f"format {j}")
    out += _encode_text(program.name, "program name")
    parts = [bytes(out)]
    # A compiled program repeats instruction objects (its block memo hands out the same
    # ones for repeated tiles): encode each object once. Keys are ids of objects the
    # program holds, so they stay valid for the whole loop.
    done: dict[int, bytes] = {}
    for i, instr in enumerate(program.instructions):
        raw = done.get(id(instr))
        if raw is None:
            raw = _encode_fast(instr)
            if raw is None:
                raw = encode_instruction(instr, index=i)
            done[id(instr)] = raw
        parts.append(raw)
    return b"".join(parts)


# --------------------------------------------------------------------------------- decode


def _need(data: bytes, offset: int, n: int, what: str) -> None:
    left = len(data) - offset
    if n > left:
        raise DecodeError(
            f"truncated data: {what} at byte offset {offset} needs {n} bytes, {left} left"
        )


def _read_text(data: bytes, offset: int, what: str) -> tuple[str, int]:
    _need(data, offset, _U16.size, f"length of {what}")
    (n,) = _U16.unpack_from(data, offset)
    offset += _U16.size
    _need(data, offset, n, what)
    try:
        text = data[offset : offset + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(
            f"{what} at byte offset {offset} is not valid utf-8: {e.reason}"
        ) from None
    return text, offset + n


def _decode_at(data: bytes, offset: int, index: int | None) -> tuple[Instruction, int]:
    start = offset
    where = "instruction" if index is None else f"instruction {index}"
    _need(data, offset, _INSTRUCTION_HEADER.size, f"{where} header")
    opcode, core, n_wait, n_signal = _INSTRUCTION_HEADER.unpack_from(data, offset)
    cls = BY_OPCODE.get(opcode)
    if cls is None:
        raise DecodeError(f"{where}: unknown opcode 0x{opcode:02x} at byte offset {offset}")
    where = f"{where} ({cls.mnemonic})"
    offset += _INSTRUCTION_HEADER.size

    n_flags = n_wait + n_signal
    flag_struct = struct.Struct(f"<{n_flags}{FLAG_CODE}")
    _need(data, offset, flag_struct.size, f"{where} flags")
    flags = flag_struct.unpack_from(data, offset)
    offset += flag_struct.size

    fields, body = body_layout(cls)
    _need(data, offset, body.size, f"{where} body")
    values = body.unpack_from(data, offset)
    offset += body.size
    for f, value in zip(fields, values, strict=True):
        enum = field_enum(f)
        if enum is not None and value not in enum_values(enum):
            raise DecodeError(
                f"{where} at byte offset {start}: field {f.name!r} = {value} is not a valid "
                f"{enum.__name__} (one of {enum_choices(enum)})"
            )
    kwargs = {f.name: value for f, value in zip(fields, values, strict=True)}
    try:
        instr = cls(core=core, wait=flags[:n_wait], signal=flags[n_wait:], **kwargs)
    except (TypeError, ValueError) as e:
        raise DecodeError(f"{where} at byte offset {start}: {e}") from None
    return instr, offset


def decode_instruction(
    buf: bytes | bytearray | memoryview, offset: int = 0
) -> tuple[Instruction, int]:
    """Decode the instruction at ``offset`` of ``buf``; return it and the offset after it."""
    data = buf if isinstance(buf, bytes) else bytes(buf)
    if not 0 <= offset <= len(data):
        raise DecodeError(f"offset {offset} is outside the {len(data)}-byte buffer")
    return _decode_at(data, offset, None)


def decode_program(buf: bytes | bytearray | memoryview) -> Program:
    """Decode bytes made by :func:`encode_program`; raise DecodeError on anything else."""
    if not isinstance(buf, bytes | bytearray | memoryview):
        raise DecodeError(f"a program is bytes, got {type(buf).__name__}")
    data = buf if isinstance(buf, bytes) else bytes(buf)
    head = data[: len(MAGIC)]
    if head != MAGIC[: len(head)] or not head:
        raise DecodeError(f"bad magic {head!r} (expected {MAGIC!r}): not a kvsim program")
    _need(data, 0, _PROGRAM_HEADER.size, "program header")
    _, version, count = _PROGRAM_HEADER.unpack_from(data, 0)
    if version != FORMAT_VERSION:
        raise DecodeError(
            f"unsupported format version {version} (this build reads version {FORMAT_VERSION})"
        )
    offset = _PROGRAM_HEADER.size
    _need(data, offset, _U16.size, "format count")
    (n_formats,) = _U16.unpack_from(data, offset)
    offset += _U16.size
    formats = []
    for j in range(n_formats):
        text, offset = _read_text(data, offset, f"format {j}")
        formats.append(text)
    name, offset = _read_text(data, offset, "program name")

    instructions = []
    for i in range(count):
        instr, offset = _decode_at(data, offset, i)
        instructions.append(instr)
    if offset != len(data):
        raise DecodeError(
            f"{len(data) - offset} trailing bytes at byte offset {offset}, "
            f"after the last of {count} instructions"
        )
    return Program(instructions=tuple(instructions), formats=tuple(formats), name=name)
