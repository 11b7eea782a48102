"""``qbruntime.model_variant_handle`` on kvsim (with ``type``'s names, as the vendor's
module has them)."""

from sim.runtime.vendor.api import ModelVariantHandle, NPUData  # noqa: F401

from .type import *  # noqa: F403
