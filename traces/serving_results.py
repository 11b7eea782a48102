"""A serving run's results (``kvsim serve``, ``sim.app.serve.run``) as typed data, units in
the field names: :func:`serving_metrics_of` reads its ``metrics.json`` into a frozen
:class:`ServingMetrics`; ``.to_metrics()`` gives the same tree back, keys and order
unchanged. Times of requests (TTFT, time per output token, end to end) are the 50th,
90th and 99th percentiles and the mean over the requests that have them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .typed_json import Record, ResultsError

NOT_A_COLUMN = MappingProxyType({"column": False})


@dataclass(frozen=True)
class KvPoolFigures(Record):
    """The paged KV block pool of one chip (``sim.serving.blocks.KvGeometry``)."""

    block_tokens: int
    block_bytes: int
    num_blocks: int
    capacity_bytes: int
    capacity_tokens: int
    reserved_bytes: int
    bytes_per_token: float
    compression_vs_bf16: float


@dataclass(frozen=True)
class ChipFigures(Record):
    chip: int
    requests: int
    steps: int
    busy_s: float
    utilization: float


@dataclass(frozen=True)
class OccupancySeries(Record):
    """A chip's blocks in use at the end of its steps (at most a fixed number of points;
    the trace has every step)."""

    t_s: tuple[float, ...]
    used_blocks: tuple[int, ...]


@dataclass(frozen=True)
class ServingFigures(Record):
    """What a serving run served, how fast, and what memory pressure cost it
    (``sim.app.serve.run.serving_metrics``)."""

    requests: int
    finished_requests: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    total_tokens_per_s: float
    ttft_s_p50: float
    ttft_s_p90: float
    ttft_s_p99: float
    ttft_s_mean: float
    tpot_s_p50: float
    tpot_s_p90: float
    tpot_s_p99: float
    tpot_s_mean: float
    e2e_s_p50: float
    e2e_s_p90: float
    e2e_s_p99: float
    e2e_s_mean: float
    num_preemptions: int
    preempted_requests: int
    recomputed_tokens: int
    swapped_out_bytes: int
    swapped_in_bytes: int
    swapped_bytes: int
    swap_time_s: float
    computed_tokens: int
    prompt_tokens_computed: int
    decode_tokens_computed: int
    prefill_tokens: int
    steps: int
    mean_batch_tokens: float
    mean_decode_batch: float
    kv: KvPoolFigures
    kv_peak_used_blocks: int
    kv_peak_occupancy: float
    kv_mean_occupancy: float
    chips: tuple[ChipFigures, ...]
    kv_occupancy: Mapping[str, OccupancySeries] = field(metadata=NOT_A_COLUMN)


@dataclass(frozen=True)
class ServingCompiledFigures(Record):
    m_tile_tokens: int = field(metadata=MappingProxyType({"key": "m_tile"}))
    cache_tokens: int = field(metadata=MappingProxyType({"key": "cache_length"}))
    weight_bytes: int = field()
    max_step_tokens: int = field()


@dataclass(frozen=True)
class ServingWallFigures(Record):
    """Wall time of this process on this machine (not simulated time; not a figure of
    kvsim's model)."""

    total: float
    compile: float
    cost_model: float
    simulation: float


@dataclass(frozen=True)
class ServingCpuFigures(Record):
    """Processor time of this process (a shared machine's wall time is not the code's)."""

    simulation: float


@dataclass(frozen=True)
class ServingMetrics(Record):
    """A serving run's ``metrics.json``. ``config``: the resolved serving config as
    ``ServeConfig.resolved()`` writes it; ``cost_model``: the step-cost model's own
    description (``sim.serving.costs.StepCostModel.describe``: mode, grid, cache file and,
    when asked, its validation on the run), kept as that class writes it."""

    config: Mapping[str, Any] = field(metadata=NOT_A_COLUMN)
    scenario: str = field()
    serving: ServingFigures = field()
    cost_model: Mapping[str, Any] = field(metadata=NOT_A_COLUMN)
    compiled: ServingCompiledFigures = field()
    wall_s: ServingWallFigures = field(metadata=NOT_A_COLUMN)
    cpu_s: ServingCpuFigures = field(metadata=NOT_A_COLUMN)


@dataclass(frozen=True)
class ServerFigures(Record):
    """What ``kvsim serve --http`` adds: its pacing (``lag_max_s`` and ``late_steps`` under
    ``pace = "real"`` only: wall seconds the simulator fell behind the clock and the steps
    it was late on), where its text came from, and how its requests ended."""

    pace: str
    time_scale: float
    fidelity: str
    text: str
    tokenizer: str
    max_model_len: int
    finish_reasons: Mapping[str, int] = field(metadata=NOT_A_COLUMN)
    lag_max_s: float | None
    late_steps: int | None
    lag_tolerance_s: float
    failed: str | None


@dataclass(frozen=True)
class ServerWallFigures(Record):
    """Wall time of the server process on this machine (not simulated time)."""

    total: float
    compile: float
    cost_model: float


@dataclass(frozen=True)
class HttpServingMetrics(Record):
    """``metrics.json`` of ``kvsim serve --http``: a serving run's figures over the
    requests its clients sent, and the server's own (:class:`ServerFigures`)."""

    config: Mapping[str, Any] = field(metadata=NOT_A_COLUMN)
    scenario: str = field()
    serving: ServingFigures = field()
    server: ServerFigures = field()
    cost_model: Mapping[str, Any] = field(metadata=NOT_A_COLUMN)
    compiled: ServingCompiledFigures = field()
    wall_s: ServerWallFigures = field(metadata=NOT_A_COLUMN)


def serving_metrics_of(metrics: Mapping[str, Any],
                       where: str = "metrics.json") -> ServingMetrics:
    """The typed result of a serving run's metrics (:class:`ResultsError` naming the entry
    that does not fit)."""
    if not isinstance(metrics, Mapping):
        raise ResultsError(f"{where}: expected an object, got {type(metrics).__name__}")
    return ServingMetrics.from_metrics(metrics, where)


__all__ = ["ChipFigures", "HttpServingMetrics", "KvPoolFigures", "OccupancySeries",
           "ServerFigures", "ServerWallFigures", "ServingCompiledFigures", "ServingCpuFigures",
           "ServingFigures", "ServingMetrics", "ServingWallFigures", "serving_metrics_of"]
