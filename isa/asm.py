"""Text assembly and disassembly of ISA v1 programs.

One statement per line; ``#`` starts a comment; blank lines are ignored::

    .name decode-step            # the program's name
    .format kv4-g32              # appended to the format table (referenced by index)
    dma.load core=1 signal=1 src=0x10000 dst=0 nbytes=4096
    gemm core=1 wait=1 signal=2 m=1 k=4096 n=1 w_bits=4 a=0 w=0x1000 out=0x2000
    vec func=rmsnorm rows=1 cols=4096 src0=0 dst=0x1000
    nop on=dma_in wait=2

An instruction is its mnemonic followed by ``field=value`` pairs in any order: ``core=``,
``wait=`` and ``signal=`` (comma-separated flag ids) and the body fields of the instruction
dataclass. Numbers are decimal or ``0x`` hex (a sign is allowed for signed fields). Enum
fields (metadata ``enum``) take the lowercase member name or its number. Fields with a
default may be omitted. A directive's argument is the rest of the line, or a JSON string
literal (``.format "a # b"``) when it must hold ``#``, quotes, or surrounding whitespace.

:func:`disassemble` writes this syntax back (u64 fields in hex, defaults omitted) such that
``assemble(disassemble(p)) == p`` for every encodable program ``p``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from enum import IntEnum

from isa.encoding import (
    CORE_CODE,
    FLAG_CODE,
    MAX_FLAGS,
    enum_values,
    field_default,
    field_enum,
    value_problem,
)
from isa.errors import AssembleError, IsaError
from isa.instructions import BY_MNEMONIC, Instruction, Program

_NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)\Z")
_HEX_CODES = frozenset("Q")  # u64 fields are addresses: written in hex
_FLAG_FIELDS = ("wait", "signal")
_JSON = json.JSONDecoder()


class _LineError(Exception):
    """A problem on the current line; :func:`assemble` adds the line number."""


# ------------------------------------------------------------------------------- assemble


def _number(text: str) -> int:
    if not _NUMBER.match(text):
        raise _LineError(f"bad number {text!r} (expected decimal or 0x hex)")
    body = text.lstrip("+-")
    if len(body) > 40:  # far past any field's 64 bits; int() refuses > 4300 digits anyway
        raise _LineError(f"number too large ({len(body)} digits)")
    value = int(body, 16) if body[:2].lower() == "0x" else int(body, 10)
    return -value if text.startswith("-") else value


def _checked(key: str, text: str, value: int, code: str, enum: type[IntEnum] | None) -> int:
    problem = value_problem(value, code, enum)
    if problem is not None:
        raise _LineError(f"{key}={text} {problem}")
    return value


def _enum_value(key: str, text: str, code: str, enum: type[IntEnum]) -> int:
    member = enum.__members__.get(text.upper())
    if member is not None:
        return int(member)
    if _NUMBER.match(text):
        return _checked(key, text, _number(text), code, enum)
    names = ", ".join(m.name.lower() for m in enum)
    raise _LineError(f"{key}={text}: unknown {enum.__name__} name (valid: {names}; or a number)")


def _flags(key: str, text: str) -> tuple[int, ...]:
    ids = tuple(_checked(key, part, _number(part), FLAG_CODE, None) for part in text.split(","))
    if len(ids) > MAX_FLAGS:
        raise _LineError(f"{key}= lists {len(ids)} flags; at most {MAX_FLAGS} fit")
    return ids


def _instruction(tokens: list[str]) -> Instruction:
    mnemonic = tokens[0].lower()
    cls = BY_MNEMONIC.get(mnemonic)
    if cls is None:
        known = ", ".join(sorted(BY_MNEMONIC))
        raise _LineError(f"unknown mnemonic {tokens[0]!r} (known: {known})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, object] = {}
    try:
        for token in tokens[1:]:
            key, eq, text = token.partition("=")
            key = key.lower()
            if not eq or not key:
                raise _LineError(f"expected field=value, got {token!r}")
            if key not in fields:
                raise _LineError(f"unknown field {key!r} (fields: {', '.join(fields)})")
            if key in values:
                raise _LineError(f"duplicate field {key!r}")
            f = fields[key]
            if key in _FLAG_FIELDS:
                values[key] = _flags(key, text)
            elif key == "core":
                values[key] = _checked(key, text, _number(text), CORE_CODE, None)
            elif (enum := field_enum(f)) is not None:
                values[key] = _enum_value(key, text, f.metadata["fmt"], enum)
            else:
                values[key] = _checked(key, text, _number(text), f.metadata["fmt"], None)
    except _LineError as e:
        raise _LineError(f"{mnemonic}: {e}") from None

    missing = [
        f.name
        for f in cls.body_fields()
        if f.name not in values and field_default(f) is dataclasses.MISSING
    ]
    if missing:
        raise _LineError(f"{mnemonic}: missing required field(s) {', '.join(missing)}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise _LineError(f"{mnemonic}: {e}") from None


def _directive_argument(directive: str, rest: str) -> str:
    rest = rest.strip()
    if rest.startswith('"'):
        try:
            value, end = _JSON.raw_decode(rest)
        except ValueError as e:
            raise _LineError(f"{directive}: bad quoted string: {e}") from None
        tail = rest[end:].strip()
        if tail and not tail.startswith("#"):
            raise _LineError(f"{directive}: unexpected text {tail!r} after the quoted string")
    else:
        value = rest.split("#", 1)[0].strip()
        if not value:
            raise _LineError(f"{directive} needs an argument")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _LineError(f"{directive}: argument is not encodable as utf-8: {e.reason}") from None
    return value


def assemble(text: str) -> Program:
    """Assemble ``text`` into a :class:`Program`; errors name the line (1-based)."""
    if not isinstance(text, str):
        raise AssembleError(f"assembly is text (str), got {type(text).__name__}")
    instructions: list[Instruction] = []
    formats: list[str] = []
    name: str | None = None
    for lineno, raw in enumerate(text.split("\n"), start=1):
        try:
            line = raw.strip()
            if line.startswith("."):
                parts = line.split(None, 1)
                head, rest = parts[0], (parts[1] if len(parts) > 1 else "")
                if head == ".format":
                    formats.append(_directive_argument(head, rest))
                elif head == ".name":
                    if name is not None:
                        raise _LineError("duplicate .name directive")
                    name = _directive_argument(head, rest)
                else:
                    raise _LineError(f"unknown directive {head!r} (known: .format, .name)")
                continue
            tokens = line.split("#", 1)[0].split()
            if tokens:
                instructions.append(_instruction(tokens))
        except _LineError as e:
            raise AssembleError(f"line {lineno}: {e}") from None
    return Program(instructions=tuple(instructions), formats=tuple(formats), name=name or "")


# ---------------------------------------------------------------------------- disassemble


def _quote(text: str) -> str:
    bare = (
        text
        and text == text.strip()
        and text.isprintable()
        and "#" not in text
        and not text.startswith('"')
    )
    return text if bare else json.dumps(text, ensure_ascii=False)


def _field_text(value: int, code: str, enum: type[IntEnum] | None) -> str:
    if enum is not None and value in enum_values(enum):
        return enum(value).name.lower()
    if code in _HEX_CODES and value >= 0:
        return hex(value)
    return str(value)


def disassemble_instruction(instr: Instruction) -> str:
    """One line of assembly for ``instr``; fields equal to their default are left out."""
    cls = type(instr)
    if BY_MNEMONIC.get(getattr(cls, "mnemonic", "")) is not cls:
        raise IsaError(f"{cls.__name__} is not an ISA v1 instruction type")
    parts = [cls.mnemonic]
    if instr.core != 0:
        parts.append(f"core={instr.core}")
    for key in _FLAG_FIELDS:
        ids = getattr(instr, key)
        if ids:
            parts.append(f"{key}={','.join(str(i) for i in ids)}")
    for f in cls.body_fields():
        value = getattr(instr, f.name)
        if value == field_default(f):
            continue
        parts.append(f"{f.name}={_field_text(value, f.metadata['fmt'], field_enum(f))}")
    return " ".join(parts)


def disassemble(program: Program) -> str:
    """Assembly text for ``program``; :func:`assemble` turns it back into an equal program."""
    lines = []
    if program.name:
        lines.append(f".name {_quote(program.name)}")
    lines += [f".format {_quote(fmt)}" for fmt in program.formats]
    lines += [disassemble_instruction(instr) for instr in program.instructions]
    return "".join(line + "\n" for line in lines)
