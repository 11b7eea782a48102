"""The config of ``kvsim serve``: a TOML file with the run config's ``[hardware]``,
``[model]``, ``[bits]``, ``[kv]`` sections, a ``[compile]`` section (core mode, weight tile
size) and a ``[serving]`` section (scheduler, chips and router, ``[serving.workload]``,
``[serving.cost]``), plus ``--set a.b=c`` overrides. Unknown keys are errors naming the
field. An MLA400 card is ``serving.chips = 4`` with the ``aries`` hardware per chip (each
chip its own DRAM, PCIe link and replica of the model).
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from kvsim.errors import ConfigError
from models.schema import Frozen, validation_message
from sim.app.config import (
    ModelOnHardware,
    apply_sets,
    load_tree,
    resolve_hardware,
)
from sim.app.spec_config import SpeculateSection
from sim.serving.workload import WorkloadSpec


class _Section(Frozen):
    pass


class ServeCompileSection(_Section):
    core_mode: Literal["single", "global4", "global8"] = "global8"
    tile_bytes: int | None = Field(None, ge=64, description="weight tile buffer bytes")


class CostSection(_Section):
    """How step latencies come from the device model."""

    mode: Literal["grid", "direct"] = Field(
        "grid", description="grid: simulate a grid of tile shapes once and interpolate "
        "(cached on disk); direct: simulate every step's program")
    extrapolate_layers: bool = Field(True, description="simulate a few layers per grid "
                                     "point and extrapolate to all")
    cache_dir: str | None = Field(None, description="grid cache folder (default "
                                  "$KVSIM_CACHE_DIR/step-costs or ~/.cache/kvsim/step-costs; "
                                  "'' = no cache)")
    jobs: int | None = Field(None, ge=1, description="processes that build the grid")
    validate_steps: int = Field(0, ge=0, description="after the run, simulate this many of "
                                "its steps directly and report the grid model's error")


class ServingSection(_Section):
    chips: int = Field(1, ge=1, description="data-parallel replicas (MLA400: 4)")
    router: Literal["round_robin", "least_loaded"] = "round_robin"
    block_tokens: int = Field(16, ge=1, description="tokens per KV block (vLLM: 16)")
    kv_budget_bytes: int | None = Field(None, ge=1, description="KV cache bytes per chip; "
                                        "default: the DRAM left by weights and buffers")
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1, description="token budget per step")
    chunked_prefill: bool = True
    preemption: Literal["recompute", "swap"] = "recompute"
    max_model_len: int | None = Field(None, ge=2, description="cache length compiled for; "
                                      "default: the longest request")
    workload: WorkloadSpec = WorkloadSpec()
    cost: CostSection = CostSection()
    speculate: SpeculateSection | None = Field(None, description="speculative decoding "
                                               "([serving.speculate]: a drafter and its "
                                               "acceptance rate or measured counts)")


class ServeOutputs(_Section):
    trace: bool = Field(True, description="trace.json: steps and KV occupancy per chip")
    report: bool = Field(True, description="report.html")
    requests_csv: bool = True


class ServeConfig(ModelOnHardware):
    compile: ServeCompileSection = ServeCompileSection()
    serving: ServingSection = ServingSection()
    outputs: ServeOutputs = ServeOutputs()


DEFAULT_SERVE_TOML = """
# kvsim serve without a config: 64 requests of 512 prompt and 128 output tokens, all at
# once, on one ARIES chip, Qwen2.5-0.5B (W8, int8 KV cache).
[hardware]
preset = "aries"
[model]
preset = "qwen2.5-0.5b"
[kv]
format = "int8"
[serving.workload]
requests = 64
prompt_tokens = 512
output_tokens = 128
"""


def load_serve_config(path: str | Path | None = None,
                      sets: list[str] | None = None) -> ServeConfig:
    """A serving config from ``path`` (TOML; None: the embedded default) and overrides."""
    tree = tomllib.loads(DEFAULT_SERVE_TOML) if path is None else load_tree(path)
    apply_sets(tree, sets or [])
    return build_serve_config(tree)


def build_serve_config(tree: dict[str, Any]) -> ServeConfig:
    tree = copy.deepcopy(tree)
    tree["hardware"] = resolve_hardware(tree.get("hardware", {"preset": "aries"}))
    try:
        cfg = ServeConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(validation_message(err)) from None
    sp = cfg.serving.speculate
    if sp is not None:
        if not sp.given_profile():
            raise ConfigError("serving.speculate: the serving simulator has no logits to "
                              "accept drafts with: give acceptance_rate, acceptance_counts "
                              "or acceptance_file")
        if cfg.serving.cost.mode != "grid":
            raise ConfigError("serving.cost.mode: speculation is costed on the grid model "
                              "(a verification's every-position logits are the grid's head "
                              "rows); use mode = 'grid'")
        if cfg.serving.cost.validate_steps:
            raise ConfigError("serving.cost.validate_steps: the validation replays steps of "
                              "one token per decoding request; it is not built for "
                              "speculation (set it to 0)")
    return cfg
