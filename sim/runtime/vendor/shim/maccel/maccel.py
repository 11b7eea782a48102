"""``maccel.maccel``: the vendor's native library under its older name; on kvsim, the error
class its Python wrappers take from it."""

from sim.runtime.vendor.api import QbRuntimeError as MAccelError  # noqa: F401
