"""Run configuration: a TOML file (or the embedded default) plus ``--set a.b=c`` overrides,
validated into a frozen :class:`RunConfig`. Unknown keys are errors, and every error
names the field path at fault.

``[hardware]`` takes ``preset`` plus any hardware field as an override, e.g.::

    [hardware]
    preset = "aries"
    dram.efficiency = 0.7
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from isa.errors import ConfigError

from .hw import HardwareConfig, build_hardware, preset_dict, set_dotted, validation_message

DEFAULT_CONFIG_TOML = """
# The embedded default scenario of `kvsim run`: one linear layer of Llama-3.2-1B's MLP
# (hidden 2048 -> intermediate 8192, INT8 weights) on the ARIES preset, with the input
# coming from the host over PCIe and the output going back.
[hardware]
preset = "aries"

[workload]
kind = "gemv"
k = 2048
n = 8192
w_bits = 8
tile_bytes = 262144
seed = 0

[sim]
fidelity = "functional"

[outputs]
trace = "ops"
"""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkloadConfig(_Section):
    kind: Literal["gemv"] = "gemv"
    k: int = Field(2048, ge=2, description="input features")
    n: int = Field(8192, ge=1, description="output features (rows of W)")
    w_bits: Literal[4, 8] = 8
    tile_bytes: int | None = Field(None, ge=64, description="weight tile; None = half of SRAM")
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _packing(self) -> WorkloadConfig:
        if self.w_bits == 4 and self.k % 2:
            raise ValueError(f"k must be even for 4-bit packed weights, got {self.k}")
        return self


class SimConfig(_Section):
    fidelity: Literal["functional", "timing"] = "functional"


class OutputsConfig(_Section):
    trace: Literal["off", "ops", "tiles"] = "ops"
    max_trace_events: int = Field(2_000_000, ge=0)
    counter_bins: int = Field(200, ge=1)


class RunConfig(_Section):
    hardware: HardwareConfig
    workload: WorkloadConfig = WorkloadConfig()
    sim: SimConfig = SimConfig()
    outputs: OutputsConfig = OutputsConfig()

    def resolved(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, strings, arrays); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_sets(tree: dict[str, Any], sets: list[str]) -> None:
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, _, value = item.partition("=")
        key = key.strip()
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"--set {item!r}: bad key {key!r}")
        set_dotted(tree, key, parse_value(value.strip()))


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flatten(v, path))
        else:
            out[path] = v
    return out


def resolve_hardware(section: Any) -> dict[str, Any]:
    """``{"preset": name, ...overrides}`` -> the full hardware dict."""
    if not isinstance(section, dict):
        raise ConfigError("hardware: must be a table with a 'preset' key")
    section = dict(section)
    name = section.pop("preset", "aries")
    if not isinstance(name, str):
        raise ConfigError("hardware.preset: must be a string")
    data = copy.deepcopy(preset_dict(name))
    for key, value in _flatten(section).items():
        set_dotted(data, key, value, root="hardware")
    return data


def load_tree(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return tomllib.loads(DEFAULT_CONFIG_TOML)
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a UTF-8 text file") from None


def build_run_config(tree: dict[str, Any]) -> RunConfig:
    tree = copy.deepcopy(tree)
    tree["hardware"] = resolve_hardware(tree.get("hardware", {"preset": "aries"}))
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(validation_message(err)) from None


def load_run_config(path: str | Path | None = None, sets: list[str] | None = None) -> RunConfig:
    """The embedded default (``path=None``) or a TOML file, with ``--set`` overrides."""
    tree = load_tree(path)
    apply_sets(tree, sets or [])
    return build_run_config(tree)
