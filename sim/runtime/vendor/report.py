"""The record a host program leaves under ``kvsim exec --trace-calls FILE``: the
``qbruntime`` calls it made (:mod:`.calltrace`), each simulated or not, and what each card
did for them (device calls by kind and their simulated time)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.runtime.vendor import calltrace, clock

if TYPE_CHECKING:
    from sim.runtime.vendor.system import System


def summary(sys_: System) -> dict[str, Any]:
    cards = []
    for c in sys_.cards:
        calls = {op: {"count": n, "simulated_s": ps / 1e12}
                 for (dev, op), (n, ps) in sorted(sys_.device_calls.items())
                 if dev == c.dev_no}
        cards.append({"device_name": c.device_name, "dev_no": c.dev_no, "preset": c.hw,
                      "functional": None if c.acc is None else c.acc.functional,
                      "simulated_s": None if c.acc is None else c.acc.now_s,
                      "device_calls": calls})
    return {"runtime": "kvsim qbruntime (surface of mobilint-qb-runtime 1.5.0)",
            "clock": clock.describe(), "qbruntime_calls": calltrace.calls(), "cards": cards}


def write_trace(sys_: System, path: str | None) -> None:
    """Write :func:`summary` to ``path``, whole or not at all
    (:func:`kvsim.files.write_output_set`); a failure is a
    :class:`kvsim.errors.OutputError` naming ``--trace-calls`` and the file."""
    if not path:
        return
    import json
    from pathlib import Path

    from kvsim.files import write_output_set

    p = Path(path)
    write_output_set(p.parent, {p.name: json.dumps(summary(sys_), indent=1) + "\n"},
                     flag="--trace-calls")


__all__ = ["summary", "write_trace"]
