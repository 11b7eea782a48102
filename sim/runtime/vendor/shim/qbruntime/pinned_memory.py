"""``qbruntime.pinned_memory`` on kvsim (see :mod:`sim.runtime.vendor.pinned_memory`)."""

from sim.runtime.vendor.api import PinnedMemory  # noqa: F401

__all__ = ["PinnedMemory"]
