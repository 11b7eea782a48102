"""``qbruntime.future`` on kvsim (see :mod:`sim.runtime.vendor.future`)."""

from sim.runtime.vendor.api import Future  # noqa: F401
