"""``Accelerator``: a handle on one simulated card (the vendor runtime's
``qbruntime/accelerator.py``). Two handles on the same device name and number are the same
card, as two handles on ``/dev/aries0`` are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.runtime.checks import is_index
from sim.runtime.vendor.calltrace import traced_class
from sim.runtime.vendor.errors import NotSimulatedError, QbRuntimeError
from sim.runtime.vendor.pinned_memory import PinnedMemory
from sim.runtime.vendor.system import system


def _note(self: Any, device_name: Any = "auto", dev_no: Any = 0) -> str:
    return f"{device_name!r}, {dev_no!r}" if not isinstance(device_name, int) else \
        f"{device_name!r}"


@traced_class({"__init__": _note})
class Accelerator:
    """A simulated card: ``Accelerator()``, ``Accelerator(dev_no)``,
    ``Accelerator(device_name)`` or ``Accelerator(device_name, dev_no)``."""

    def __init__(self, device_name: str | int = "auto", dev_no: int = 0):
        if is_index(device_name):  # Accelerator(dev_no)
            device_name, dev_no = "auto", device_name
        if not isinstance(device_name, str):
            raise QbRuntimeError(f"Accelerator: device_name must be a string, got "
                                 f"{type(device_name).__name__}", "Accelerator_InvalidName")
        if not is_index(dev_no):
            raise QbRuntimeError(f"Accelerator: dev_no must be an integer, got {dev_no!r}",
                                 "Accelerator_InvalidNumber")
        self._card = system().resolve(device_name, int(dev_no))

    def get_device_name(self) -> str:
        """The resolved device name (``aries-rb`` for an ARIES card)."""
        return self._card.device_name

    def allocate_pinned_memory(self, shape: Sequence[int], dtype: np.dtype) -> PinnedMemory:
        if not self._card.device_name.startswith("regulus"):
            raise QbRuntimeError("allocate_pinned_memory: pinned memory is only supported on "
                                 "REGULUS devices", "Accelerator_NotSupported")
        raise NotSimulatedError("Accelerator.allocate_pinned_memory",
                                "zero-copy pinned memory (REGULUS, experimental): kvsim's "
                                "regulus preset models host transfers as DRAM copies")

    def __repr__(self) -> str:
        return f"Accelerator({self._card.device_name!r}, {self._card.dev_no})"


__all__ = ["Accelerator"]
