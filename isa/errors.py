"""The instruction set's exception types: programs, binaries, assembly text and KV-cache
formats. They derive from :class:`kvsim.errors.KvsimError`, the base every kvsim error shares
(the errors every layer raises, :class:`~kvsim.errors.ConfigError` and
:class:`~kvsim.errors.DeviceError`, live in :mod:`kvsim.errors`).
"""

from __future__ import annotations

from kvsim.errors import KvsimError


class IsaError(KvsimError, ValueError):
    """An ISA program, binary or assembly text is invalid."""


class DecodeError(IsaError):
    """Bytes do not decode to a program (unknown opcode, truncated record, bad header)."""


class AssembleError(IsaError):
    """Assembly text does not parse (unknown mnemonic, bad field); names the line."""


class ProgramError(IsaError):
    """A program fails validation; the message names the instruction index and reason."""

    def __init__(self, index: int, reason: str):
        self.index = index
        self.reason = reason
        super().__init__(f"instruction {index}: {reason}")


class FormatError(KvsimError, ValueError):
    """A KV-cache format or a packed buffer does not match its format."""
