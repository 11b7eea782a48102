"""Every public name of kvsim's ``qbruntime``, in one place (the shim's modules take theirs
from here)."""

from __future__ import annotations

from sim.runtime.vendor.accelerator import Accelerator
from sim.runtime.vendor.config import ModelConfig
from sim.runtime.vendor.enums import (
    CacheType,
    Cluster,
    Core,
    CoreAllocationPolicy,
    CoreMode,
    DataType,
    LogLevel,
)
from sim.runtime.vendor.errors import NotSimulatedError, QbRuntimeError
from sim.runtime.vendor.functions import (
    get_available_device_numbers,
    get_available_devices,
    get_model_summary,
    set_log_level,
    start_tracing_events,
    stop_tracing_events,
)
from sim.runtime.vendor.future import Future
from sim.runtime.vendor.model import Model, load
from sim.runtime.vendor.model_variant_handle import ModelVariantHandle
from sim.runtime.vendor.npu_data import NPUData
from sim.runtime.vendor.pinned_memory import PinnedMemory
from sim.runtime.vendor.structs import BatchParam, Buffer, BufferInfo, CacheInfo, CoreId, Scale

#: The vendor release whose surface this mirrors (the snapshot the tests compare with).
__version__: str = "1.5.0"
__git_version__: str = "kvsim"
__vendor__: str = "kvsim (simulated card)"
__product__: str = "kvsim qbruntime: the qbruntime 1.5.0 surface on kvsim's simulated card"

#: the vendor package's own ``__all__`` (``qbruntime/__init__.py``)
PACKAGE_ALL = ["Cluster", "Core", "CoreAllocationPolicy", "Scale", "CoreId", "Buffer",
               "CoreMode", "BufferInfo", "ModelConfig", "LogLevel", "set_log_level",
               "start_tracing_events", "stop_tracing_events", "Model", "load", "Accelerator",
               "PinnedMemory", "NPUData", "QbRuntimeError"]

__all__ = ["Accelerator", "BatchParam", "Buffer", "BufferInfo", "CacheInfo", "CacheType",
           "Cluster", "Core", "CoreAllocationPolicy", "CoreId", "CoreMode", "DataType",
           "Future", "LogLevel", "Model", "ModelConfig", "ModelVariantHandle", "NPUData",
           "NotSimulatedError", "PinnedMemory", "QbRuntimeError", "Scale",
           "get_available_device_numbers", "get_available_devices", "get_model_summary",
           "load", "set_log_level", "start_tracing_events", "stop_tracing_events",
           "__version__", "__git_version__", "__vendor__", "__product__"]
