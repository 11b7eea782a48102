"""The baseline file of ``kvsim regress`` (:mod:`sim.app.regress.regress`): its format, read
and checked
(every problem a :class:`RegressError` naming the entry or field), and written
atomically (sorted keys)::

    {"version": 1,
     "entries": [{"config": "tiny.toml",         # relative to the baseline's folder
                  "sets": ["workload.seed=1"],   # --set overrides of this entry
                  "figures": {"prefill.ttft_s": 0.000111533523, ...},
                  "tolerances": {"traffic_bytes.*": 0.01}}]}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.errors import KvsimError

BASELINE_VERSION = 1


class RegressError(KvsimError, ValueError):
    """A baseline file or a regress argument is invalid; the message names the entry or
    field at fault."""


def is_number(v: Any) -> bool:
    """An int or a float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class Entry:
    config: str | None  # relative to the baseline's folder; None: the embedded default
    sets: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    tolerances: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        name = self.config or "(embedded default)"
        return f"{name} [{' '.join(self.sets)}]" if self.sets else name

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "sets": list(self.sets), "figures": dict(self.figures),
                "tolerances": dict(self.tolerances)}


@dataclass
class Baseline:
    path: Path
    entries: list[Entry]

    def config_path(self, entry: Entry) -> Path | None:
        return None if entry.config is None else self.path.parent / entry.config

    def to_json(self) -> dict[str, Any]:
        return {"version": BASELINE_VERSION, "entries": [e.to_json() for e in self.entries]}

    def save(self) -> None:
        from kvsim.files import atomic_write_json

        atomic_write_json(self.path, self.to_json(), indent=1, sort_keys=True)


def check_tolerances(tols: Any, where: str) -> dict[str, float]:
    if not isinstance(tols, Mapping):
        raise RegressError(f"{where}: must be an object of figure name (or pattern) -> "
                           f"relative tolerance")
    out = {}
    for k, v in tols.items():
        if not isinstance(k, str) or not k:
            raise RegressError(f"{where}: figure names must be non-empty strings")
        if not is_number(v) or not math.isfinite(v) or v < 0:
            raise RegressError(f"{where}.{k}: tolerance must be a finite number >= 0, got "
                               f"{v!r}")
        out[k] = float(v)
    return out


def _entry(raw: Any, i: int, where: str) -> Entry:
    at = f"{where}: entries[{i}]"
    if not isinstance(raw, Mapping):
        raise RegressError(f"{at}: must be an object")
    unknown = sorted(set(raw) - {"config", "sets", "figures", "tolerances"})
    if unknown:
        raise RegressError(f"{at}.{unknown[0]}: unknown key")
    if "config" not in raw or "figures" not in raw:
        raise RegressError(f"{at}: needs 'config' and 'figures'")
    config = raw["config"]
    if config is not None and (not isinstance(config, str) or not config):
        raise RegressError(f"{at}.config: must be a path (string) or null")
    sets = raw.get("sets", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise RegressError(f"{at}.sets: must be a list of 'key=value' strings")
    figures = raw["figures"]
    if not isinstance(figures, Mapping):
        raise RegressError(f"{at}.figures: must be an object of name -> number")
    for k, v in figures.items():
        if not is_number(v) or not math.isfinite(v):
            raise RegressError(f"{at}.figures.{k}: must be a finite number, got {v!r}")
    return Entry(config, list(sets), dict(figures),
                 check_tolerances(raw.get("tolerances", {}), f"{at}.tolerances"))


def load_baseline(path: str | os.PathLike) -> Baseline:
    """Read and validate a baseline file (:class:`RegressError` on any problem)."""
    p = Path(path)
    if not p.is_file():
        raise RegressError(f"baseline {str(p)!r} does not exist "
                           f"(make one with: kvsim regress --create {p} CONFIG...)")
    try:
        data = json.loads(p.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise RegressError(f"{p}: not a JSON baseline file ({err})") from None
    if not isinstance(data, dict):
        raise RegressError(f"{p}: the top level must be an object")
    unknown = sorted(set(data) - {"version", "entries"})
    if unknown:
        raise RegressError(f"{p}: {unknown[0]}: unknown key")
    if data.get("version") != BASELINE_VERSION:
        raise RegressError(f"{p}: baseline version {data.get('version')!r} is not supported "
                           f"(this kvsim reads version {BASELINE_VERSION})")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        raise RegressError(f"{p}: entries: must be a non-empty list")
    return Baseline(p, [_entry(e, i, str(p)) for i, e in enumerate(entries)])


__all__ = ["BASELINE_VERSION", "Baseline", "Entry", "RegressError", "check_tolerances",
           "is_number", "load_baseline"]
