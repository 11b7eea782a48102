"""``Future``: the result of an asynchronous inference (the vendor runtime's
``qbruntime/future.py``). ``Model.infer_async`` refuses LLMs as the vendor's does, so a
kvsim Future comes only from ``Future.from_cpp`` with a finished result, or is the
default, invalid one."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.runtime.vendor.calltrace import traced_class
from sim.runtime.vendor.errors import QbRuntimeError


@traced_class()
class Future:
    """A result to wait for and take once."""

    def __init__(self, _future: Any = None, _inputs: list[np.ndarray] | None = None):
        self._future = _future  # a finished result: a list of arrays (None: invalid)
        self._inputs = _inputs

    @classmethod
    def from_cpp(cls, _future: Any, _inputs: list[np.ndarray]) -> Future:
        return cls(_future, _inputs)

    def wait_for(self, timeout_ms: int) -> bool:
        """Whether the result is ready (a kvsim result is ready when the Future is made)."""
        return self._future is not None

    def get(self) -> list[np.ndarray]:
        """The result, once; a second call raises ``Future_NotValid``."""
        if self._future is None:
            raise QbRuntimeError("Future.get: the future has no result (taken already, or "
                                 "never made by an inference)", "Future_NotValid")
        out, self._future, self._inputs = self._future, None, None
        return [np.asarray(o) for o in out]


__all__ = ["Future"]
