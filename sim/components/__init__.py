"""SimPy components of the device: DRAM, SRAM, DMA engines, host link, compute cores.

Each takes ``env`` first, documents its units, reports to a recorder and to the stats,
and never writes files.
"""

from .core import ComputeCore
from .dma import DmaEngine
from .dram import Dram
from .link import HostLink
from .sram import Sram

__all__ = ["ComputeCore", "DmaEngine", "Dram", "HostLink", "Sram"]
