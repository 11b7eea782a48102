"""Where a run's time went: one row per runtime call, and per phase the time each resource
needed, for ``metrics.json`` (``calls``, ``time_breakdown``) and the report.

A resource's *demand* in a phase is the time it alone needs for that phase's work:
DRAM bytes of a kind (``link_kind``: ``dram_read`` + ``dram_write``) over the effective
DRAM bandwidth; compute, the busiest core's MXU + VPU busy time; host I/O, the busy time
of the host link's two directions; runtime overhead, the per-call host cost
(``hardware.host.call_overhead_ns``) times the calls. The device's fixed costs
(``hardware.cores``) each have their own row: ``program_launch_s`` (every program's launch),
``dispatch_s`` (instruction dispatch of the busiest engine queue) and ``barrier_sync_s``
(cross-core synchronisations of the engine queue that waited most). Resources overlap,
so the demands do not add up to the elapsed time: the largest one bounds the phase from below and is
reported as ``critical``; ``elapsed_s`` minus it is time no single resource explains
(latency, dependencies, imbalance).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from sim.device.hw import HardwareConfig
from sim.runtime import CallRecord
from sim.units import PS_PER_S
from traces.results import CallRow, PhaseTime

#: DRAM traffic kinds shown in the breakdown (``sim.device.stats`` kinds).
KINDS = ("weights", "kv_cache", "activations", "host_io")
#: Compute engines of a core (``busy_ps`` keys ``coreN.<engine>``).
COMPUTE_ENGINES = ("mxu", "vpu")


@dataclass(frozen=True)
class Labelled:
    """A call with what the run knows about it: its phase (``launch``, ``prefill``,
    ``decode``, ``cache_op``), step number within the phase, tokens it computed and the
    tokens in the cache after it."""

    call: CallRecord
    phase: str
    step: int
    tokens: int
    cache_tokens: int


def _dram_by_kind(stats: dict) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    for (link, kind), n in stats.get("link_kind", {}).items():
        if link in ("dram_read", "dram_write"):
            out[kind] = out.get(kind, 0) + n
    return out


def call_rows(calls: Sequence[Labelled], kv_bytes_at: Callable[[int], int]
              ) -> tuple[CallRow, ...]:
    """One row per call; ``kv_bytes_at(tokens)`` gives the stored cache bytes at a token
    count. Times in seconds from the start of the simulation."""
    rows = []
    kv: dict[int, int] = {}  # bytes by token count (decode steps repeat few sizes' work)
    for c in calls:
        t = c.call.stats.get("traffic", {})
        if c.cache_tokens not in kv:
            kv[c.cache_tokens] = kv_bytes_at(c.cache_tokens)
        rows.append(CallRow(
            op=c.call.op, phase=c.phase, step=c.step, tokens=c.tokens,
            start_s=c.call.start_ps / PS_PER_S, end_s=c.call.end_ps / PS_PER_S,
            time_s=c.call.time_s, cache_tokens=c.cache_tokens,
            kv_cache_bytes=kv[c.cache_tokens],
            dram_bytes=t.get("dram_read", 0) + t.get("dram_write", 0),
            dram_bytes_by_kind=MappingProxyType(_dram_by_kind(c.call.stats)),
            pcie_h2d_bytes=t.get("pcie_h2d", 0), pcie_d2h_bytes=t.get("pcie_d2h", 0),
            ops=c.call.stats.get("ops", 0),
        ))
    return tuple(rows)


def _demand(calls: Sequence[CallRecord], hw: HardwareConfig) -> dict[str, float]:
    kinds = dict.fromkeys(KINDS, 0)
    busy: dict[str, int] = {}
    dispatch: dict[str, int] = {}
    sync: dict[str, int] = {}
    launch = 0
    for c in calls:
        for k, n in _dram_by_kind(c.stats).items():
            kinds[k] = kinds.get(k, 0) + n
        for k, v in c.stats.get("busy_ps", {}).items():
            busy[k] = busy.get(k, 0) + v
        for k, v in c.stats.get("dispatch_ps", {}).items():
            dispatch[k] = dispatch.get(k, 0) + v
        for k, v in c.stats.get("sync_ps", {}).items():
            sync[k] = sync.get(k, 0) + v
        launch += c.stats.get("launch_ps", 0)
    per_core: dict[str, int] = {}
    for k, v in busy.items():
        block, _, engine = k.partition(".")
        if engine in COMPUTE_ENGINES:
            per_core[block] = per_core.get(block, 0) + v
    bw = hw.dram.effective_bytes_per_s
    out = {f"dram_{k}_s": n / bw for k, n in kinds.items()}
    out["compute_s"] = max(per_core.values(), default=0) / PS_PER_S
    out["host_link_s"] = sum(v for k, v in busy.items()
                             if k.split(".")[0] in ("pcie", "link")) / PS_PER_S
    out["runtime_overhead_s"] = len(calls) * hw.host.call_overhead_ns * 1e-9
    out["program_launch_s"] = launch / PS_PER_S
    out["dispatch_s"] = max(dispatch.values(), default=0) / PS_PER_S
    out["barrier_sync_s"] = max(sync.values(), default=0) / PS_PER_S
    return out


#: The fixed-cost rows of a phase (besides ``runtime_overhead_s``), in ``time_breakdown``.
FIXED_COSTS = ("program_launch_s", "dispatch_s", "barrier_sync_s")


def time_breakdown(calls: Sequence[Labelled], hw: HardwareConfig) -> Mapping[str, PhaseTime]:
    """Per phase (in run order): calls, elapsed time, each resource's demand (seconds) and
    the critical one. Decode is also given per token (``decode_per_token``)."""
    phases: dict[str, list[CallRecord]] = {}
    for c in calls:
        phases.setdefault(c.phase, []).append(c.call)
    out: dict[str, PhaseTime] = {}
    for phase, recs in phases.items():
        d = _demand(recs, hw)
        groups = {"dram": sum(v for k, v in d.items() if k.startswith("dram_")),
                  "compute": d["compute_s"], "host_link": d["host_link_s"],
                  "runtime_overhead": d["runtime_overhead_s"],
                  **{k[:-2]: d[k] for k in FIXED_COSTS}}
        elapsed = sum(r.end_ps - r.start_ps for r in recs) / PS_PER_S
        row = {"calls": len(recs), "elapsed_s": elapsed, **d,
               "critical": max(groups, key=lambda g: groups[g])}
        out[phase] = PhaseTime(**row)
        if phase == "decode":
            n = len(recs)
            out["decode_per_token"] = PhaseTime(**({k: (v / n if isinstance(v, float) else v)
                                                    for k, v in row.items()} | {"calls": 1}))
    return MappingProxyType(out)
