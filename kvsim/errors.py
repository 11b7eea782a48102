"""Documented exception types of kvsim that every layer raises.

Every error kvsim raises on bad input derives from :class:`KvsimError`, so callers can
catch one type. The subclasses say which kind of input was at fault; the instruction set's
own (:class:`isa.errors.IsaError` and its kind, :class:`isa.errors.FormatError`) derive from
it too.
"""

from __future__ import annotations


class KvsimError(Exception):
    """Base class of every documented kvsim error."""


class ConfigError(KvsimError, ValueError):
    """A configuration (hardware, model, run, sweep) is invalid; the message names the field."""


class DeviceError(KvsimError, RuntimeError):
    """The simulated device refused an operation (capacity, SRAM overflow, deadlock)."""


class OutputError(KvsimError, OSError):
    """An output cannot be written (a folder that cannot be made or written in, a full
    disk); the message names the file or folder and the reason. Nothing of the output set
    is left half-written. ``result``: what the command computed, when it raises after the
    work (so it can still be shown)."""

    result: object = None
