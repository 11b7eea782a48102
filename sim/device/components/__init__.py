"""SimPy components of the device: DRAM, SRAM, DMA engines, host link, compute cores.

Each takes ``env`` first, documents its units, reports to a recorder and to the stats,
and never writes files. Each states its timing rules once, as compiled functions that its
SimPy process calls and the array loop compiles in (``rules.py`` says how).
"""

from sim.device.components.core import ComputeCore
from sim.device.components.dma import DmaEngine
from sim.device.components.dram import Dram
from sim.device.components.link import HostLink
from sim.device.components.sram import Sram

__all__ = ["ComputeCore", "DmaEngine", "Dram", "HostLink", "Sram"]
