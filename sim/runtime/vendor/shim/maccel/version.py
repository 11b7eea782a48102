"""``maccel.version`` on kvsim."""

from sim.runtime.vendor.api import __git_version__, __product__, __vendor__, __version__

__all__ = ["__version__", "__git_version__", "__vendor__", "__product__"]
