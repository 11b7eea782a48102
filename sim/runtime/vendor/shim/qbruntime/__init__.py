"""``qbruntime`` on kvsim's simulated card (``kvsim exec`` puts this folder on the path).
Every name comes from :mod:`sim.runtime.vendor.api`; see :mod:`sim.runtime.vendor`."""

from sim.runtime.vendor.api import *  # noqa: F403
from sim.runtime.vendor.api import (  # noqa: F401
    PACKAGE_ALL,
    __git_version__,
    __product__,
    __vendor__,
    __version__,
)

from . import (  # noqa: F401  (the vendor package's modules, as attributes)
    accelerator,
    future,
    model,
    model_variant_handle,
    npu_data,
    pinned_memory,
    type,
    version,
)

__all__ = list(PACKAGE_ALL)
