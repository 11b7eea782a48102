"""How much each hardware parameter matters: TTFT and decode time at +-10 % of each.

``kvsim hw sensitivity --model M`` runs a run config (the embedded default, or ``--config
FILE``) once as given and twice per numeric hardware field, at ``(1 - f)`` and ``(1 + f)``
times its value (integers rounded; a DRAM size taken in whole bursts, e.g.
``dram.timing.row_run_bytes``, snapped outward to whole bursts), through the sweep
machinery (``sim.app.sweep.sweep.execute``: a local process pool or Dask). A perturbed
value the hardware config rejects (out of range, not one of a fixed set) or that rounds
back to the same integer is reported, not run. The DRAM model's unused fields are left out
(they would move nothing): ``dram.efficiency`` under ``dram.model = "protocol"``, the
``[dram.timing]`` table under ``"efficiency"``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kvsim.errors import ConfigError
from sim.app.config import resolve_hardware, set_field
from sim.device.hw import build_hardware

#: Hardware fields that are not numbers of the hardware.
NOT_PERTURBED_PREFIXES = ("name", "description", "sources.", "assumptions.", "fitted.",
                          "host_link.kind")
#: Fields the engine does not use, by ``dram.model``.
UNUSED_BY_DRAM_MODEL = {"protocol": ("dram.efficiency",), "efficiency": ("dram.timing.",)}

#: The figures the table reports, per workload kind.
GENERATE_FIGURES = ("prefill.ttft_s", "decode.time_per_token_s")
#: ... and as a client of the serving stack measures them, when the preset has one
CLIENT_FIGURES = ("client.ttft_s", "client.time_per_token_s")
GEMV_FIGURES = ("sim_time_s",)
#: Byte sizes the DRAM config takes in whole bursts only (``sim.device.hw.DramConfig``).
IN_BURSTS = ("dram.timing.page_bytes", "dram.timing.row_run_bytes", "dram.interleave_bytes")


@dataclass(frozen=True)
class Perturbation:
    field: str  # dotted hardware field, e.g. "dram.efficiency"
    base: float | int
    low: float | int | None  # None: not run (see note)
    high: float | int | None
    note: str = ""


@dataclass(frozen=True)
class SensitivityRow:
    field: str
    base: float | int
    low: float | int | None
    high: float | int | None
    change_pct: dict[str, tuple[float | None, float | None]]  # figure -> (at low, at high)
    note: str = ""

    @property
    def largest_pct(self) -> float:
        vals = [abs(v) for pair in self.change_pct.values() for v in pair if v is not None]
        return max(vals, default=0.0)


@dataclass(frozen=True)
class SensitivityResult:
    fraction: float
    figures: tuple[str, ...]
    base: dict[str, float]
    rows: list[SensitivityRow]

    def to_json(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "base": self.base,
                "rows": [{"field": r.field, "base": r.base, "low": r.low, "high": r.high,
                          "note": r.note,
                          "change_pct": {k: {"low": lo, "high": hi}
                                         for k, (lo, hi) in r.change_pct.items()}}
                         for r in self.rows]}


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_leaves(v, path))
        else:
            out[path] = v
    return out


def _perturbed(value: float | int, factor: float) -> float | int:
    if isinstance(value, int):
        return int(round(value * factor))
    return value * factor


def _snapped(value: int, v: int, quantum: int) -> int:
    """``v`` (a perturbed ``value``) moved outward, away from ``value``, to a whole number
    of ``quantum``: the nearest size the DRAM config takes on that side."""
    if v < value:
        return max(quantum, (v // quantum) * quantum)
    return -(-v // quantum) * quantum


def _hardware_with(tree: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    t = copy.deepcopy(tree)
    set_field(t, f"hardware.{field}", value)
    return t


def perturbations(tree: dict[str, Any], fraction: float,
                  only: list[str] | None = None) -> list[Perturbation]:
    """Every numeric hardware field of the run config ``tree`` (or those starting with one of
    ``only``), with the values to run at, checked against the hardware config."""
    if not 0 < fraction < 1:
        raise ConfigError(f"--fraction: must be between 0 and 1, got {fraction}")
    resolved = resolve_hardware(tree.get("hardware", {"preset": "aries"}))
    skip = NOT_PERTURBED_PREFIXES + UNUSED_BY_DRAM_MODEL[
        build_hardware(resolved).dram.model]
    fields = _leaves(resolved)
    dram = build_hardware(resolved).dram
    burst = (dram.timing.burst_length * dram.bus_width_bits_per_channel // 8
             if dram.timing is not None else None)
    out = []
    for path, value in fields.items():
        if path.startswith(skip) or path in skip:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if only and not any(path == o or path.startswith(o.rstrip(".") + ".") for o in only):
            continue
        ends: list[float | int | None] = []
        notes = []
        for sign, factor in (("-", 1 - fraction), ("+", 1 + fraction)):
            v = _perturbed(value, factor)
            if path in IN_BURSTS and burst and v != value and v % burst:
                snapped = _snapped(value, v, burst)
                notes.append(f"{sign}{fraction:.0%}: {v:g} B snapped to {snapped} B "
                             f"(whole {burst} B bursts)")
                v = snapped
            if v == value:
                ends.append(None)
                notes.append(f"{sign}{fraction:.0%}: rounds back to {value}")
                continue
            try:
                build_hardware(resolve_hardware(_hardware_with(tree, path, v)["hardware"]))
            except ConfigError as err:
                ends.append(None)
                notes.append(f"{sign}{fraction:.0%} ({v:g}): {err}")
                continue
            ends.append(v)
        out.append(Perturbation(path, value, ends[0], ends[1], "; ".join(notes)))
    if only:
        unknown = [o for o in only if not any(p.field == o or p.field.startswith(
            o.rstrip(".") + ".") for p in out)]
        if unknown:
            raise ConfigError(f"--param: no numeric hardware field {unknown[0]!r} (fields "
                              f"look like dram.efficiency, cores.clock_hz)")
    return out


def run_sensitivity(tree: dict[str, Any], *, fraction: float = 0.1,
                    only: list[str] | None = None, workers: int | None = None,
                    executor: str = "local", scheduler: str | None = None,
                    progress: bool = False) -> SensitivityResult:
    """Run the base config and every perturbation (``workers``: processes, default one
    per CPU; ``progress``: show the points done, which the caller enables on a terminal
    only); changes in percent of the base."""
    from sim.app.sweep.sweep import Point, SweepConfig, SweepOutputs, execute, validate_point

    validate_point(copy.deepcopy(tree))
    perts = perturbations(tree, fraction, only)
    points = [Point(0, (), copy.deepcopy(tree))]
    where: dict[tuple[str, str], int] = {}
    for p in perts:
        for side, v in (("low", p.low), ("high", p.high)):
            if v is None:
                continue
            key = f"hardware.{p.field}"
            where[(p.field, side)] = len(points)
            points.append(Point(len(points), ((key, v),), _hardware_with(tree, p.field, v)))
    sweep = SweepConfig(base=tree, axes={}, outputs=SweepOutputs(), points=points)
    results = execute(sweep, executor=executor, workers=workers, scheduler=scheduler,
                      progress=progress, label="hardware points")
    base_res = results[0]
    if base_res["error"]:
        raise ConfigError(f"the base run failed: {base_res['error']}")
    figures = GENERATE_FIGURES if GENERATE_FIGURES[0] in base_res["metrics"] else GEMV_FIGURES
    m0 = base_res["metrics"]
    if figures == GENERATE_FIGURES and m0.get(CLIENT_FIGURES[0], m0[figures[0]]) != m0[
            figures[0]]:  # a serving stack in front of the card: its figures too
        figures = GENERATE_FIGURES + CLIENT_FIGURES
    base = {f: float(base_res["metrics"][f]) for f in figures}
    rows = []
    for p in perts:
        change: dict[str, tuple[float | None, float | None]] = {}
        notes = [p.note] if p.note else []
        pair: dict[str, list[float | None]] = {f: [None, None] for f in figures}
        for i, side in enumerate(("low", "high")):
            idx = where.get((p.field, side))
            if idx is None:
                continue
            res = results[idx]
            if res["error"]:
                notes.append(f"{side}: {res['error']}")
                continue
            for f in figures:
                pair[f][i] = (float(res["metrics"][f]) / base[f] - 1) * 100 if base[f] else 0.0
        for f in figures:
            change[f] = (pair[f][0], pair[f][1])
        rows.append(SensitivityRow(p.field, p.base, p.low, p.high, change, "; ".join(notes)))
    rows.sort(key=lambda r: (-r.largest_pct, r.field))
    return SensitivityResult(fraction, figures, base, rows)
