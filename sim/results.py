"""A run's key figures as typed data, units in the field names: what ``kvsim regress``
compares. Read from ``metrics.json`` (whose keys stay as they are) by
:meth:`RunFigures.from_metrics`; :meth:`RunFigures.figures` gives them back under their
``metrics.json`` names (``prefill.ttft_s``, ``traffic_bytes.dram_read``, ...), the names a
baseline file records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar


def _number(v: Any) -> float | int | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class CacheOpFigures:
    """One scheduled cache operation: its simulated time, the host-side part of it, and
    the bytes it moved (None where the operation has no such figure). Not the measured
    host wall time (``host_measured_s``): that belongs to the machine, not to kvsim."""

    time_s: float | None = None
    host_model_s: float | None = None
    pcie_bytes: int | None = None
    dram_bytes: int | None = None


@dataclass(frozen=True)
class RunFigures:
    """The key figures of one run. ``sim_time_s`` only for a run without prefill (the
    GEMV demo); traffic as ``(name, bytes)`` pairs in ``metrics.json`` order."""

    ttft_s: float | None = None
    time_per_token_s: float | None = None
    decode_tokens_per_s: float | None = None
    launch_time_s: float | None = None
    sim_time_s: float | None = None
    traffic_bytes: tuple[tuple[str, int], ...] = ()
    traffic_by_kind_bytes: tuple[tuple[str, int], ...] = ()
    cache_ops: tuple[CacheOpFigures, ...] = ()

    #: field -> its ``metrics.json`` path (the scalar figures)
    SCALARS: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({
        "ttft_s": ("prefill", "ttft_s"), "time_per_token_s": ("decode", "time_per_token_s"),
        "decode_tokens_per_s": ("decode", "tokens_per_s"),
        "launch_time_s": ("launch", "time_s")})
    #: field -> its ``metrics.json`` group (every numeric entry is a figure)
    GROUPS: ClassVar[Mapping[str, str]] = MappingProxyType({
        "traffic_bytes": "traffic_bytes", "traffic_by_kind_bytes": "traffic_by_kind"})

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> RunFigures:
        """The figures of a run's metrics; absent or non-numeric entries are None/left
        out."""
        kw: dict[str, Any] = {}
        for name, (group, key) in cls.SCALARS.items():
            node = metrics.get(group)
            kw[name] = _number(node.get(key)) if isinstance(node, Mapping) else None
        if "prefill" not in metrics:
            kw["sim_time_s"] = _number(metrics.get("sim_time_s"))
        for name, group in cls.GROUPS.items():
            node = metrics.get(group)
            items = node.items() if isinstance(node, Mapping) else ()
            kw[name] = tuple((k, v) for k, v in items if _number(v) is not None)
        ops = metrics.get("cache_ops")
        kw["cache_ops"] = tuple(
            CacheOpFigures(**{f.name: _number(op.get(f.name)) for f in fields(CacheOpFigures)})
            for op in (ops if isinstance(ops, list) else []) if isinstance(op, Mapping))
        return cls(**kw)

    def figures(self) -> dict[str, float]:
        """The figures by their ``metrics.json`` names (dotted; ``cache_ops[i].NAME``),
        sorted; None left out."""
        out: dict[str, float] = {}
        for name, path in self.SCALARS.items():
            v = getattr(self, name)
            if v is not None:
                out[".".join(path)] = v
        if self.sim_time_s is not None:
            out["sim_time_s"] = self.sim_time_s
        for name, group in self.GROUPS.items():
            for k, v in getattr(self, name):
                out[f"{group}.{k}"] = v
        for i, op in enumerate(self.cache_ops):
            for f in fields(CacheOpFigures):
                v = getattr(op, f.name)
                if v is not None:
                    out[f"cache_ops[{i}].{f.name}"] = v
        return dict(sorted(out.items()))


__all__ = ["CacheOpFigures", "RunFigures"]
