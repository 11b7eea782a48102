"""The enumerations of the vendor runtime's ``type.py``, with the same member names.

The vendor's values are its native library's enum objects, which convert to integers
(``int(value)``: mblt-npu-python reads them so); kvsim's are integers too, in the order the
members are listed, with ``Error`` as -1. ``Cluster`` and ``Core`` number ARIES' two
clusters of four local cores (FACTS.md: qb runtime headers); ``All`` and ``GlobalCore``
name a cluster's cores together and its global core.
"""

from __future__ import annotations

from enum import Enum


class Cluster(Enum):
    """A cluster of the ARIES NPU (two, each of four local cores)."""

    Cluster0 = 0
    Cluster1 = 1
    Error = -1


class Core(Enum):
    """A core within a cluster."""

    Core0 = 0
    Core1 = 1
    Core2 = 2
    Core3 = 3
    All = 4
    GlobalCore = 5
    Error = -1


class CoreAllocationPolicy(Enum):
    """Cores chosen by the runtime at launch (``Auto``) or listed by the user (``Manual``)."""

    Auto = 0
    Manual = 1


class CoreMode(Enum):
    """How a model uses the cores (see ``ModelConfig``'s setters)."""

    Single = 0
    Multi = 1
    Global = 2
    Global4 = 3
    Global8 = 4
    Auto = 5
    Error = -1


class LogLevel(Enum):
    """Verbosity of the runtime's log (kvsim's: the ``kvsim.qbruntime`` logger)."""

    Debug = 0
    Info = 1
    Warn = 2
    Err = 3
    Fatal = 4
    Off = 5


class CacheType(Enum):
    """Kind of a KV cache: one sequence's (``Default``), one of several batch slots
    (``Batch``), or a fixed-size tail cache (``FixedTailCache``)."""

    Default = 0
    Batch = 1
    FixedTailCache = 2
    Error = -1


class DataType(Enum):
    """Element type of a model's inputs and outputs."""

    Float32 = 0
    Float16 = 1
    Int8 = 2
    Uint8 = 3
    BInt16 = 4
    Error = -1


#: kvsim's compiled core modes -> the vendor's.
CORE_MODE_OF = {"single": CoreMode.Single, "global4": CoreMode.Global4,
                "global8": CoreMode.Global8}
#: cluster and core numbers (ARIES: 2 x 4).
CLUSTERS = (Cluster.Cluster0, Cluster.Cluster1)
LOCAL_CORES = (Core.Core0, Core.Core1, Core.Core2, Core.Core3)

__all__ = ["CLUSTERS", "CORE_MODE_OF", "LOCAL_CORES", "CacheType", "Cluster", "Core",
           "CoreAllocationPolicy", "CoreMode", "DataType", "LogLevel"]
