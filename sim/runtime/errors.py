"""The runtime's own error and its integer arguments: what every module of the runtime
checks its arguments with (the value types of :mod:`.types` included), so it sits below
all of them."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from kvsim.errors import KvsimError


class RuntimeApiError(KvsimError, RuntimeError, ValueError):
    """Misuse of the runtime API (wrong shapes, calls after dispose, bad cache sizes). It
    is a ``ValueError`` too: the vendor's Python runtime raises ``ValueError`` for inputs
    or outputs of the wrong shape or dtype ("Input shape is invalid.", "Output shape
    mismatch."), so host code that catches those keeps working."""


def is_index(v: Any) -> bool:
    """An integer argument (numpy integers too; not bool, not a whole float)."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def index(v: Any, what: str, exc: type[KvsimError] = RuntimeApiError) -> int:
    """``v`` as a Python int (numpy integers converted, so range checks cannot wrap), or
    ``exc("<what> must be an integer, got ...")``."""
    if not is_index(v):
        raise exc(f"{what} must be an integer, got {v!r}")
    return int(operator.index(v))
