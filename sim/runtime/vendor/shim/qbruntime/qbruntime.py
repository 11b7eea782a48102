"""``qbruntime.qbruntime``: the vendor's native library; on kvsim, the one name its Python
wrappers take from it."""

from sim.runtime.vendor.api import QbRuntimeError  # noqa: F401
