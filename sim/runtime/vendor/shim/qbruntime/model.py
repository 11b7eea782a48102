"""``qbruntime.model`` on kvsim (see :mod:`sim.runtime.vendor.model`)."""

from sim.runtime.vendor.api import (  # noqa: F401  # noqa: F401
    Accelerator,
    Future,
    Model,
    ModelVariantHandle,
    NPUData,
    PinnedMemory,
    load,
)

from .type import *  # noqa: F403

__all__ = ["Model", "load"]
