"""``qbruntime.accelerator`` on kvsim (see :mod:`sim.runtime.vendor.accelerator`)."""

from sim.runtime.vendor.api import Accelerator, PinnedMemory  # noqa: F401
