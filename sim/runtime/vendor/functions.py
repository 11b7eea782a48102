"""The module-level functions of the vendor runtime's ``type.py``: log level, event
tracing, a model's summary, the devices present."""

from __future__ import annotations

import logging
from pathlib import Path

from sim.runtime.vendor.calltrace import traced
from sim.runtime.vendor.enums import LogLevel
from sim.runtime.vendor.errors import QbRuntimeError
from sim.runtime.vendor.system import DEVICE_NAMES, system

#: kvsim's qbruntime logs here
logger = logging.getLogger("kvsim.qbruntime")
_LEVELS = {LogLevel.Debug: logging.DEBUG, LogLevel.Info: logging.INFO,
           LogLevel.Warn: logging.WARNING, LogLevel.Err: logging.ERROR,
           LogLevel.Fatal: logging.CRITICAL, LogLevel.Off: logging.CRITICAL + 1}


@traced("set_log_level")
def set_log_level(level: LogLevel) -> None:
    """Log only messages of ``level`` and above (``Off``: none)."""
    if not isinstance(level, LogLevel):
        raise QbRuntimeError(f"set_log_level: expected a LogLevel, got {level!r}",
                             "InvalidArgument")
    logger.setLevel(_LEVELS[level])


@traced("start_tracing_events")
def start_tracing_events(path: str) -> bool:
    """Record every runtime call of every card into the Chrome/Perfetto trace ``path``
    (simulated times), written by :func:`stop_tracing_events`. False (and a logged
    reason) when tracing is on already or ``path`` cannot be written."""
    from sim.runtime import start_tracing_events as start
    from sim.runtime.errors import RuntimeApiError

    try:
        return start(path)
    except RuntimeApiError as err:
        logger.warning("%s", err)
        return False


@traced("stop_tracing_events")
def stop_tracing_events() -> None:
    """Write the trace started by :func:`start_tracing_events` (a logged warning when
    tracing is off)."""
    from sim.runtime import stop_tracing_events as stop
    from sim.runtime.tracing import tracing_active

    if not tracing_active():
        logger.warning("stop_tracing_events: tracing is not on")
        return
    stop()


@traced("get_model_summary")
def get_model_summary(mxq_path: str) -> str:
    """A table of the compiled model ``mxq_path`` (a ``.kvm``): target device, core mode,
    variants with their input and output shapes, and its layers."""
    from models.compiler import CompiledModel
    from sim.runtime.vendor.errors import runtime_errors
    from sim.runtime.vendor.system import device_name_of

    p = Path(mxq_path)
    if not p.is_file():
        raise QbRuntimeError(f"{p}: no such file", "Model_InvalidPath")
    with runtime_errors("get_model_summary"):
        cm = CompiledModel.load(p)
    m = cm.model
    rows = [("target device", f"{device_name_of(cm.hw.name)} (kvsim preset {cm.hw.name})"),
            ("core mode", cm.core_mode), ("variants", "1"),
            ("variant 0 input", f"(1, -1, {m.hidden_size}) float32, up to {cm.max_seq} "
                                f"tokens per call"),
            ("variant 0 output", f"(1, 1, {m.vocab_size}) float32"),
            ("KV cache", f"{cm.cap} tokens x {cm.slots} slot(s), format {cm.kv}"),
            ("layers", f"{m.num_layers} x (attention {cm.blocks.attention.kind}, MLP)")]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{m.name} ({p.name})", *(f"  {k:<{width}}  {v}" for k, v in rows)])


@traced("get_available_devices")
def get_available_devices() -> list[str]:
    """The device names of the simulated cards."""
    return sorted({c.device_name for c in system().cards})


@traced("get_available_device_numbers")
def get_available_device_numbers(device_name: str = "auto") -> list[int]:
    """The device numbers of ``device_name`` (empty if it names no card present)."""
    name = device_name.lower()
    if name != "auto" and not any(d.startswith(name) for d in DEVICE_NAMES):
        return []
    return [c.dev_no for c in system().cards
            if name == "auto" or c.device_name.startswith(name)]


__all__ = ["get_available_device_numbers", "get_available_devices", "get_model_summary",
           "logger", "set_log_level", "start_tracing_events", "stop_tracing_events"]
