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
