"""``qbruntime.npu_data`` on kvsim (see :mod:`sim.runtime.vendor.npu_data`)."""

from sim.runtime.vendor.api import Accelerator, NPUData  # noqa: F401

__all__ = ["NPUData"]
