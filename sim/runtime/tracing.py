"""``start_tracing_events(path)`` / ``stop_tracing_events()``: a Chrome/Perfetto trace of
what the host program did on the simulated cards between the two calls, as the vendor
runtime writes one of the real card.

One process per card (``card<dev_no>``), one track per kind of call (``infer``,
``dump_cache_memory``, ...); each call is an ``X`` event spanning its simulated time, with
its bytes per link as arguments. Times are each card's own simulated clock (µs). The file
is written atomically when tracing stops.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.runtime.errors import RuntimeApiError
from traces.chrome import chrome_trace
from traces.recorder import Recorder

if TYPE_CHECKING:
    from sim.runtime.accelerator import Accelerator
    from sim.runtime.types import CallRecord

#: Most calls one tracing session keeps (a bound on memory; later calls are counted in
#: the trace's ``dropped_calls``). An assumption: a long generation is ~10^5 calls.
MAX_TRACED_CALLS = 1_000_000


class _Session:
    def __init__(self, path: Path):
        self.path = path
        self.recorder = Recorder(level="ops", max_events=MAX_TRACED_CALLS)


_session: _Session | None = None
#: Functions told of runtime events: ``fn(kind, acc, obj)`` with kind ``"launching"``
#: (obj: the Model, before its weights load) or ``"call"`` (obj: the CallRecord of a call
#: just made). Progress displays use them; they must not call the runtime.
_listeners: list[Callable[[str, Any, Any], None]] = []


def add_listener(fn: Callable[[str, Any, Any], None]) -> None:
    _listeners.append(fn)


def remove_listener(fn: Callable[[str, Any, Any], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def notify(kind: str, acc: Any, obj: Any) -> None:
    for fn in list(_listeners):
        fn(kind, acc, obj)


def start_tracing_events(path: str | os.PathLike) -> bool:
    """Start recording every runtime call of every card into the Chrome trace ``path``
    (written by :func:`stop_tracing_events`). Refused while tracing is already on, or when
    ``path``'s folder does not exist or cannot be written (before anything is recorded)."""
    global _session
    if not isinstance(path, str | os.PathLike):
        raise RuntimeApiError(f"start_tracing_events: path must be a file path, got "
                              f"{type(path).__name__} {path!r}")
    if _session is not None:
        raise RuntimeApiError(f"start_tracing_events: tracing into {str(_session.path)!r} is "
                              f"already on; call stop_tracing_events() first")
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise RuntimeApiError(f"start_tracing_events: {str(p)!r} is a folder, not a file")
    from kvsim.files import probe_writable

    try:  # for real: os.access says yes to root on a read-only file system
        if not folder.is_dir():
            raise FileNotFoundError(2, "no such folder")
        probe_writable(folder, make=False)
    except OSError as err:
        raise RuntimeApiError(f"start_tracing_events: cannot write into the folder "
                              f"{str(folder)!r} ({err.strerror or err})") from None
    _session = _Session(p)
    return True


def stop_tracing_events() -> bool:
    """Stop tracing and write the trace file (atomically). Refused when tracing is off."""
    global _session
    from kvsim.files import atomic_write_json

    if _session is None:
        raise RuntimeApiError("stop_tracing_events: tracing is not on "
                              "(start_tracing_events(path) first)")
    session, _session = _session, None
    trace: dict[str, Any] = chrome_trace(session.recorder)
    trace["otherData"] = {"source": "kvsim runtime calls (simulated time)",
                          "dropped_calls": session.recorder.dropped}
    atomic_write_json(session.path, trace, indent=None)
    return True


def tracing_active() -> bool:
    return _session is not None


def note_call(acc: Accelerator, rec: CallRecord) -> None:
    """Record ``rec``, a call on ``acc``, while tracing is on; tell the listeners."""
    if _listeners:
        notify("call", acc, rec)
    if _session is None:
        return
    traffic = rec.stats.get("traffic", {}) if isinstance(rec.stats, dict) else {}
    args = {f"{k}_bytes": int(v) for k, v in sorted(traffic.items()) if v}
    _session.recorder.span(f"card{acc.dev_no}", rec.op, rec.op, rec.start_ps, rec.end_ps,
                           args=args or None)


__all__ = ["MAX_TRACED_CALLS", "add_listener", "notify", "remove_listener",
           "start_tracing_events", "stop_tracing_events", "tracing_active"]
