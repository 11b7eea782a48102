"""Documented exception types of kvsim.

Every error kvsim raises on bad input derives from :class:`KvsimError`, so callers can
catch one type. The subclasses say which kind of input was at fault.
"""

from __future__ import annotations


class KvsimError(Exception):
    """Base class of every documented kvsim error."""


class ConfigError(KvsimError, ValueError):
    """A configuration (hardware, model, run, sweep) is invalid; the message names the field."""


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


class DeviceError(KvsimError, RuntimeError):
    """The simulated device refused an operation (capacity, SRAM overflow, deadlock)."""
