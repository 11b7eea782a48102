"""``PinnedMemory``: NPU-accessible pinned host memory (REGULUS, experimental in the vendor
runtime 1.5.0). kvsim does not simulate it (``Accelerator.allocate_pinned_memory`` and
``Model.infer_pinned_memory`` raise ``NotSimulatedError``); the class keeps the vendor's
surface over a host array so code that type-checks or wraps buffers keeps working."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.runtime.vendor.calltrace import traced_class


@traced_class()
class PinnedMemory:
    """A buffer the NPU reads and writes in place (made by ``allocate_pinned_memory``)."""

    def __init__(self, _pinned_memory: Any):
        self._pinned_memory = _pinned_memory
        self._array = np.asarray(_pinned_memory)

    def __getitem__(self, key: Any) -> Any:
        return self._array[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._array[key] = value

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def size(self) -> int:
        """Bytes of the buffer."""
        return int(self._array.nbytes)

    @property
    def is_available(self) -> bool:
        return True


__all__ = ["PinnedMemory"]
