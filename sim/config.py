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

from .hw import HardwareConfig, preset_dict, set_dotted, validation_message

DEFAULT_CONFIG_TOML = """
# The embedded default scenario of `kvsim run`: Qwen2.5-0.5B (synthetic weights, INT8
# weights and INT8 KV cache) on the ARIES preset: prefill a 240-token prompt, then decode
# 8 tokens, every call through the host runtime (embeddings in and logits out over PCIe).
[hardware]
preset = "aries"

[model]
preset = "qwen2.5-0.5b"

[bits]
preset = "W8"

[kv]
format = "int8"

[workload]
kind = "generate"
prompt_tokens = 240
output_tokens = 8
seed = 0

[sim]
fidelity = "timing"

[outputs]
trace = "ops"
"""

class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSection(_Section):
    """A model preset or a Hugging Face ``config.json`` (exactly one)."""

    preset: str | None = None
    hf_config: str | None = None
    weights_seed: int = Field(0, ge=0, description="seed of the synthetic weights")
    safetensors: str | None = Field(None, description="real weights (file or folder)")

    @model_validator(mode="after")
    def _one(self) -> ModelSection:
        if (self.preset is None) == (self.hf_config is None):
            raise ValueError("give exactly one of 'preset' and 'hf_config'")
        return self


class BitsSection(_Section):
    """Weight bits: a preset (``W8``, ``W4V8``) and optional per-projection overrides."""

    preset: str = "W8"
    weights: dict[str, int] = Field(default_factory=dict)


class KvSection(_Section):
    format: str = "int8"


class CompileSection(_Section):
    core_mode: Literal["single", "global4", "global8"] = "global8"
    max_sequence_length: int = Field(512, ge=1, description="most tokens per infer call")
    cache_length: int | None = Field(None, ge=1, description="KV capacity in tokens; "
                                     "default: prompt + output rounded up to 256")
    cache_slots: int = Field(1, ge=1)
    tile_bytes: int | None = Field(None, ge=64)


class WorkloadConfig(_Section):
    kind: Literal["generate", "gemv"] = "generate"
    # generate: prefill then decode through the runtime
    prompt_tokens: int = Field(240, ge=1)
    output_tokens: int = Field(16, ge=0)
    seed: int = Field(0, ge=0)
    # gemv: the hand-written demo layer (one GEMV with double-buffered weight streaming)
    k: int = Field(2048, ge=2, description="gemv: input features")
    n: int = Field(8192, ge=1, description="gemv: output features (rows of W)")
    w_bits: Literal[4, 8] = 8
    tile_bytes: int | None = Field(None, ge=64, description="gemv: weight tile bytes")

    @model_validator(mode="after")
    def _packing(self) -> WorkloadConfig:
        if self.w_bits == 4 and self.k % 2:
            raise ValueError(f"k must be even for 4-bit packed weights, got {self.k}")
        return self


class SimConfig(_Section):
    fidelity: Literal["functional", "timing"] = "timing"


class OutputsConfig(_Section):
    trace: Literal["off", "ops", "tiles"] = "ops"
    max_trace_events: int = Field(2_000_000, ge=0)
    counter_bins: int = Field(200, ge=1)


class RunConfig(_Section):
    hardware: HardwareConfig
    model: ModelSection = ModelSection(preset="qwen2.5-0.5b")
    bits: BitsSection = BitsSection()
    kv: KvSection = KvSection()
    compile: CompileSection = CompileSection()
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
        # a model is named one way: setting one way replaces the other
        other = {"model.preset": "hf_config", "model.hf_config": "preset"}.get(key)
        if other and isinstance(tree.get("model"), dict):
            tree["model"].pop(other, None)


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
