"""The enumerations of the vendor runtime's ``type.py``, with the same member names.

The vendor's values are its native library's enum objects; kvsim's are their names in
lower case (nothing in the documented API reads the values: members are compared and
passed back). ``Cluster`` and ``Core`` number ARIES' two clusters of four local cores
(FACTS.md: qb runtime headers); ``All`` and ``GlobalCore`` name a cluster's cores together
and its global core.
"""

from __future__ import annotations

from enum import Enum


class Cluster(Enum):
    """A cluster of the ARIES NPU (two, each of four local cores)."""

    Cluster0 = "cluster0"
    Cluster1 = "cluster1"
    Error = "error"


class Core(Enum):
    """A core within a cluster."""

    Core0 = "core0"
    Core1 = "core1"
    Core2 = "core2"
    Core3 = "core3"
    All = "all"
    GlobalCore = "global_core"
    Error = "error"


class CoreAllocationPolicy(Enum):
    """Cores chosen by the runtime at launch (``Auto``) or listed by the user (``Manual``)."""

    Auto = "auto"
    Manual = "manual"


class CoreMode(Enum):
    """How a model uses the cores (see ``ModelConfig``'s setters)."""

    Single = "single"
    Multi = "multi"
    Global = "global"
    Global4 = "global4"
    Global8 = "global8"
    Auto = "auto"
    Error = "error"


class LogLevel(Enum):
    """Verbosity of the runtime's log (kvsim's: the ``kvsim.qbruntime`` logger)."""

    Debug = "debug"
    Info = "info"
    Warn = "warn"
    Err = "err"
    Fatal = "fatal"
    Off = "off"


class CacheType(Enum):
    """Kind of a KV cache: one sequence's (``Default``), one of several batch slots
    (``Batch``), or a fixed-size tail cache (``FixedTailCache``)."""

    Default = "default"
    Batch = "batch"
    FixedTailCache = "fixed_tail_cache"
    Error = "error"


class DataType(Enum):
    """Element type of a model's inputs and outputs."""

    Float32 = "float32"
    Float16 = "float16"
    Int8 = "int8"
    Uint8 = "uint8"
    BInt16 = "bint16"
    Error = "error"


#: kvsim's compiled core modes -> the vendor's.
CORE_MODE_OF = {"single": CoreMode.Single, "global4": CoreMode.Global4,
                "global8": CoreMode.Global8}
#: cluster and core numbers (ARIES: 2 x 4).
CLUSTERS = (Cluster.Cluster0, Cluster.Cluster1)
LOCAL_CORES = (Core.Core0, Core.Core1, Core.Core2, Core.Core3)

__all__ = ["CLUSTERS", "CORE_MODE_OF", "LOCAL_CORES", "CacheType", "Cluster", "Core",
           "CoreAllocationPolicy", "CoreMode", "DataType", "LogLevel"]
