"""``maccel.type`` on kvsim: enums, value types and module functions."""

from sim.runtime.vendor.api import (  # noqa: F401
    BatchParam,
    Buffer,
    BufferInfo,
    CacheInfo,
    CacheType,
    Cluster,
    Core,
    CoreAllocationPolicy,
    CoreId,
    CoreMode,
    DataType,
    LogLevel,
    ModelConfig,
    Scale,
    get_available_device_numbers,
    get_available_devices,
    get_model_summary,
    set_log_level,
    start_tracing_events,
    stop_tracing_events,
)
