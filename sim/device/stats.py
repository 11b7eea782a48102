"""Always-on counters of a device: bytes per link and per traffic kind, engine busy time.

Unlike the trace recorder these are kept whatever the trace level, so metrics never
depend on tracing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: Links whose bytes are counted in ``traffic``.
LINKS = ("dram_read", "dram_write", "pcie_h2d", "pcie_d2h")
#: Traffic kinds (the ``kind`` of the memory region a transfer touches).
KINDS = ("weights", "kv_cache", "activations", "host_io")


@dataclass
class Stats:
    traffic: Counter = field(default_factory=Counter)  # link -> bytes
    by_kind: Counter = field(default_factory=Counter)  # kind -> bytes moved (any link)
    link_kind: Counter = field(default_factory=Counter)  # (link, kind) -> bytes
    busy_ps: Counter = field(default_factory=Counter)  # "core0.mxu" -> ps busy
    # the fixed costs (hardware.cores): per engine queue, ps of instruction dispatch and of
    # cross-core synchronisation; ps of program launch (once per program)
    dispatch_ps: Counter = field(default_factory=Counter)
    sync_ps: Counter = field(default_factory=Counter)
    launch_ps: int = 0
    instructions: int = 0
    ops: int = 0

    def add(self, link: str, kind: str, nbytes: int) -> None:
        self.traffic[link] += nbytes
        self.by_kind[kind] += nbytes
        self.link_kind[(link, kind)] += nbytes

    def snapshot(self) -> dict:
        return {
            "traffic": dict(self.traffic),
            "by_kind": dict(self.by_kind),
            "link_kind": dict(self.link_kind),
            "busy_ps": dict(self.busy_ps),
            "dispatch_ps": dict(self.dispatch_ps),
            "sync_ps": dict(self.sync_ps),
            "launch_ps": self.launch_ps,
            "instructions": self.instructions,
            "ops": self.ops,
        }

    @staticmethod
    def delta(after: dict, before: dict) -> dict:
        """Difference of two snapshots (what happened between them)."""
        out = {}
        for key in ("traffic", "by_kind", "link_kind", "busy_ps", "dispatch_ps", "sync_ps"):
            a, b = after[key], before[key]
            out[key] = {k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0)}
        out["launch_ps"] = after["launch_ps"] - before["launch_ps"]
        out["instructions"] = after["instructions"] - before["instructions"]
        out["ops"] = after["ops"] - before["ops"]
        return out
