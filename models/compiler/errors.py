"""The compiler's error."""

from __future__ import annotations

from kvsim.errors import KvsimError


class CompileError(KvsimError, ValueError):
    """The model cannot be compiled for this hardware (it does not fit, or is invalid)."""
