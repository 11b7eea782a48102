"""The record of the ``qbruntime`` calls a host program makes on kvsim: which function and
method of the surface was called, how often, whether kvsim simulated it or raised
:class:`NotSimulatedError`, and a few of its distinct argument shapes.

Every public function and method of kvsim's ``qbruntime`` is wrapped by :func:`traced`
(classes by :func:`traced_class`). ``kvsim exec --trace-calls FILE`` writes the record as
JSON when the program exits (:func:`write`), beside each card's device calls.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

#: distinct argument notes kept per call (the rest are counted)
MAX_NOTES = 12

_lock = threading.Lock()
_calls: dict[str, dict[str, Any]] = {}
#: per thread, how deep in traced calls it is: only the outermost call is the host
#: program's (kvsim's own uses of the surface inside a call are not recorded)
_depth = threading.local()


def _entry(name: str) -> dict[str, Any]:
    e = _calls.get(name)
    if e is None:
        e = _calls[name] = {"count": 0, "simulated": 0, "not_simulated": 0, "errors": 0,
                            "notes": [], "more_notes": 0}
    return e


def record(name: str, outcome: str, note: str | None = None) -> None:
    with _lock:
        e = _entry(name)
        e["count"] += 1
        e[outcome] += 1
        if note is not None and note not in e["notes"]:
            if len(e["notes"]) < MAX_NOTES:
                e["notes"].append(note)
            else:
                e["more_notes"] += 1


def traced(name: str, note: Callable[..., str | None] | None = None) -> Callable:
    """Wrap a function so each call is recorded under ``name`` (``note(*args, **kw)``
    describes its arguments, e.g. ``seq=128 cache=0``)."""
    from sim.runtime.vendor.errors import NotSimulatedError

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_depth, "n", 0)
            if depth:
                return fn(*args, **kwargs)
            try:
                text = note(*args, **kwargs) if note is not None else None
            except Exception:  # a note must never break the call it describes
                text = None
            _depth.n = 1
            try:
                out = fn(*args, **kwargs)
            except NotSimulatedError:
                record(name, "not_simulated", text)
                raise
            except Exception:
                record(name, "errors", text)
                raise
            finally:
                _depth.n = 0
            record(name, "simulated", text)
            return out

        call.__wrapped_call__ = name  # type: ignore[attr-defined]
        return call

    return wrap


def traced_class(notes: dict[str, Callable[..., str | None]] | None = None) -> Callable:
    """Class decorator: trace ``__init__`` and every public method (not properties)."""
    notes = notes or {}

    def deco(cls: type) -> type:
        for attr, value in list(vars(cls).items()):
            if attr != "__init__" and attr.startswith("_"):
                continue
            name = f"{cls.__name__}.{attr}"
            if isinstance(value, classmethod | staticmethod):
                kind = type(value)
                setattr(cls, attr, kind(traced(name, notes.get(attr))(value.__func__)))
            elif callable(value) and not isinstance(value, type):
                setattr(cls, attr, traced(name, notes.get(attr))(value))
        return cls

    return deco


def calls() -> dict[str, dict[str, Any]]:
    """A copy of the record: ``{"Model.infer": {"count": .., "simulated": .., ...}}``."""
    with _lock:
        return {k: {**v, "notes": list(v["notes"])} for k, v in sorted(_calls.items())}


def reset() -> None:
    with _lock:
        _calls.clear()


__all__ = ["MAX_NOTES", "calls", "record", "reset", "traced", "traced_class"]
