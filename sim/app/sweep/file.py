"""A sweep file: a base run config and axes, validated into points (``sim.app.sweep.sweep``).

Each point is the base config with its axis values set as ``--set`` would set them, and
every point is validated (schema and :func:`sim.app.check.check_run`) before any runs: a bad
value is one error naming the point and the field.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from kvsim.errors import ConfigError
from models.schema import Frozen, validation_message
from sim.app.config import (
    apply_sets,
    build_run_config,
    load_tree,
    parse_value,
    set_field,
    split_assignment,
)

SWEEP_KEYS = ("base", "set", "axes", "outputs")
#: Metrics plotted when the sweep file names none (those the points have).
DEFAULT_METRICS = (
    "prefill.ttft_s",
    "decode.time_per_token_s",
    "decode.tokens_per_s",
    "kv_cache.bytes_per_token",
    "traffic_by_kind.kv_cache",
    "sim_time_s",
)


class SweepOutputs(Frozen):

    metrics: list[str] | None = Field(None, description="metrics plotted against each axis")
    save_points: bool = Field(False, description="write each point's run outputs too")


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, its axis values and its run-config tree."""

    index: int
    values: tuple[tuple[str, Any], ...]
    tree: dict[str, Any] = field(repr=False)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_literal(v)}" for k, v in self.values)

    @property
    def sets(self) -> list[str]:
        """The point as ``--set`` arguments of ``kvsim run``."""
        return [f"{k}={_literal(v)}" for k, v in self.values]


@dataclass(frozen=True)
class SweepConfig:
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    outputs: SweepOutputs
    points: list[Point]
    source: str | None = None
    base_file: str | None = None  # the run config file the base came from, if any
    base_sets: tuple[str, ...] = ()  # the overrides applied to it (the file's, then --set)

    def rerun_hint(self, point: Point) -> str:
        """How to run one point alone with ``kvsim run``."""
        sets = " ".join(f"--set {s}" for s in [*self.base_sets, *point.sets])
        if self.base_file is not None:
            return f"kvsim run {self.base_file} {sets}"
        where = f"of {self.source}" if self.source else ""
        return f"kvsim run with the [base] table {where} as the config, {sets}"

    @property
    def metrics(self) -> list[str]:
        return list(self.outputs.metrics) if self.outputs.metrics else list(DEFAULT_METRICS)


def _literal(value: Any) -> str:
    """A value as ``--set`` text (TOML): strings quoted only where a bare word would not
    parse back to the same string."""
    if isinstance(value, str):
        return value if parse_value(value) == value and value.strip() == value else json.dumps(
            value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def _axis_values(path: str, values: Any) -> list[Any]:
    if not isinstance(values, list):
        raise ConfigError(f"{path}: an axis is a list of values, got {_literal(values)}")
    if not values:
        raise ConfigError(f"{path}: an axis needs at least one value")
    seen: list[Any] = []
    for v in values:
        if v in seen:
            raise ConfigError(f"{path}: value {_literal(v)} is listed twice")
        seen.append(v)
    return values


def _flatten_axes(table: Any, prefix: str = "") -> dict[str, list[Any]]:
    """``{"kv": {"format": [...]}}`` (TOML dotted keys) -> ``{"kv.format": [...]}``."""
    if not isinstance(table, dict):
        raise ConfigError(f"axes{'.' + prefix if prefix else ''}: must be a table of config "
                          "fields -> lists of values")
    out: dict[str, list[Any]] = {}
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_flatten_axes(value, path))
        else:
            out[path] = _axis_values(f"axes.{path}", value)
    return out


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``--axis key=[v1, v2]`` -> ``(key, [v1, v2])`` (a single value is a one-point axis)."""
    key, parsed = split_assignment(text, "--axis", "key=[value, ...]")
    return key, _axis_values(f"--axis {key}", parsed if isinstance(parsed, list) else [parsed])


def _base_tree(data: dict[str, Any], folder: Path | None) -> tuple[dict[str, Any], str | None]:
    """The base run-config tree, and the file it came from (None: inline or default)."""
    base = data.get("base")
    if base is None:
        return load_tree(None), None
    if isinstance(base, str):
        p = Path(base)
        if not p.is_absolute() and folder is not None:
            p = folder / p
        if not p.is_file():
            raise ConfigError(f"base: run config file {str(p)!r} does not exist")
        return load_tree(p), str(p)
    if isinstance(base, dict):
        return copy.deepcopy(base), None
    raise ConfigError("base: give a run config file name or a [base] table")


def is_sweep_tree(tree: dict[str, Any]) -> bool:
    """Whether a TOML tree is a sweep file (it has axes) rather than a run config."""
    return "axes" in tree


def build_sweep(data: dict[str, Any], *, folder: Path | None = None,
                sets: list[str] | None = None, axes: list[str] | None = None,
                source: str | None = None) -> SweepConfig:
    """Validate a sweep tree: the base config with ``sets`` applied, the axes with
    ``axes`` (``--axis key=[...]``) replacing or adding axes, and every point."""
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key; a sweep file has "
                          f"{', '.join(SWEEP_KEYS)}")
    base, base_file = _base_tree(data, folder)
    file_sets = data.get("set", [])
    if not isinstance(file_sets, list) or not all(isinstance(x, str) for x in file_sets):
        raise ConfigError('set: a list of "key=value" overrides of the base config')
    base_sets = (*file_sets, *(sets or []))
    apply_sets(base, list(base_sets))
    table = _flatten_axes(data.get("axes", {}))
    for text in axes or []:
        key, values = parse_axis(text)
        table[key] = values
    if not table:
        raise ConfigError("axes: a sweep needs at least one axis (a config field and a list "
                          "of values)")
    try:
        outputs = SweepOutputs.model_validate(data.get("outputs", {}))
    except ValidationError as err:
        raise ConfigError(validation_message(err, "outputs")) from None
    points = []
    names = list(table)
    for index, combo in enumerate(itertools.product(*(table[k] for k in names))):
        tree = copy.deepcopy(base)
        values = tuple(zip(names, combo, strict=True))
        point = Point(index, values, tree)
        try:
            for key, value in values:
                set_field(tree, key, copy.deepcopy(value))
            validate_point(tree)
        except ConfigError as err:
            raise ConfigError(f"point {index} ({point.label}): {err}") from None
        points.append(point)
    return SweepConfig(base, table, outputs, points, source, base_file, base_sets)


def validate_point(tree: dict[str, Any]):
    """A point's run config, validated as ``kvsim check`` does."""
    from sim.app.check import check_run

    cfg = build_run_config(tree)
    check_run(cfg)
    return cfg


def load_sweep(path: str | Path, sets: list[str] | None = None,
               axes: list[str] | None = None) -> SweepConfig:
    """A sweep file, with ``--set`` overrides of the base and ``--axis`` overrides."""
    p = Path(path)
    data = load_tree(p)
    return build_sweep(data, folder=p.parent, sets=sets, axes=axes, source=str(p))
