"""``maccel`` (the vendor runtime's older name) on kvsim's simulated card: the same
surface as kvsim's ``qbruntime``, with the old error name ``MAccelError``."""

from sim.runtime.vendor.api import *  # noqa: F403
from sim.runtime.vendor.api import (  # noqa: F401
    PACKAGE_ALL,
    QbRuntimeError,
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
    type,
    version,
)

#: maccel's name for the runtime error
MAccelError = QbRuntimeError

__all__ = [*(n for n in PACKAGE_ALL if n != "QbRuntimeError"), "MAccelError", "__version__"]
