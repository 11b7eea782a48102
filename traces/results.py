"""A run's results as typed data, units in the field names.

- :class:`GenerateMetrics` / :class:`GemvMetrics`: everything a run's ``metrics.json``
  holds, as frozen dataclasses: a run builds one (``sim.app.run``), and ``metrics.json``,
  the report, a sweep's row and ``kvsim regress`` read it (:func:`run_metrics` reads
  either back from a ``metrics.json``;
  ``.to_metrics()`` gives the same JSON tree back, keys and order unchanged;
  ``.columns()`` is the row a sweep writes).
- :class:`~traces.serving_results.ServingMetrics`: a serving run's ``metrics.json``
  (:func:`serving_metrics_of`), the same way.
- :class:`RunFigures`: the key figures ``kvsim regress`` compares. Taken from a run's typed
  result by :meth:`RunFigures.of`, or read from its ``metrics.json`` by
  :meth:`RunFigures.from_metrics`; :meth:`RunFigures.figures` gives
  them back under their ``metrics.json`` names (``prefill.ttft_s``,
  ``traffic_bytes.dram_read``, ...), the names a baseline file records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar

from .serving_results import ServingMetrics, serving_metrics_of
from .speculation_results import SpeculationFigures
from .typed_json import OPTIONAL, Record, ResultsError, decode


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
    client_ttft_s: float | None = None
    client_time_per_token_s: float | None = None
    sim_time_s: float | None = None
    traffic_bytes: tuple[tuple[str, int], ...] = ()
    traffic_by_kind_bytes: tuple[tuple[str, int], ...] = ()
    cache_ops: tuple[CacheOpFigures, ...] = ()

    #: field -> its ``metrics.json`` path (the scalar figures)
    SCALARS: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({
        "ttft_s": ("prefill", "ttft_s"), "time_per_token_s": ("decode", "time_per_token_s"),
        "decode_tokens_per_s": ("decode", "tokens_per_s"),
        "launch_time_s": ("launch", "time_s"),
        "client_ttft_s": ("client", "ttft_s"),
        "client_time_per_token_s": ("client", "time_per_token_s")})
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

    @classmethod
    def of(cls, m: RunMetrics) -> RunFigures:
        """The figures of a run's typed result (what :meth:`from_metrics` reads from its
        ``metrics.json``)."""
        if not isinstance(m, GenerateMetrics):  # the GEMV demo: its one program's time
            return cls(sim_time_s=m.sim_time_s, traffic_bytes=tuple(m.traffic_bytes.items()),
                       traffic_by_kind_bytes=tuple(m.traffic_by_kind_bytes.items()))
        return cls(ttft_s=m.prefill.ttft_s, time_per_token_s=m.decode.time_per_token_s,
                   decode_tokens_per_s=m.decode.tokens_per_s, launch_time_s=m.launch.time_s,
                   client_ttft_s=m.client.ttft_s,
                   client_time_per_token_s=m.client.time_per_token_s,
                   traffic_bytes=tuple(m.traffic_bytes.items()),
                   traffic_by_kind_bytes=tuple(m.traffic_by_kind_bytes.items()),
                   cache_ops=tuple(CacheOpFigures(time_s=op.time_s,
                                                  host_model_s=op.host_model_s,
                                                  pcie_bytes=op.pcie_bytes,
                                                  dram_bytes=op.dram_bytes)
                                   for op in m.cache_ops))

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




# --- everything metrics.json holds ------------------------------------------------------------

#: a field that is not a sweep column (bulky, or not a figure of the run)
NOT_A_COLUMN = MappingProxyType({"column": False})


def _key(name: str) -> Mapping[str, str]:
    """Field metadata: the field's ``metrics.json`` key (the field name adds the unit)."""
    return MappingProxyType({"key": name})


@dataclass(frozen=True)
class LaunchFigures(Record):
    """Loading the weights over the host link (``model.launch``)."""

    time_s: float
    pcie_h2d_bytes: int


@dataclass(frozen=True)
class ContextFigures(Record):
    """The cache a run starts from (``workload.context_tokens``) and what it holds."""

    tokens: int
    cache_holds: str


@dataclass(frozen=True)
class PrefillFigures(Record):
    ttft_s: float
    tokens: int
    calls: int
    tokens_per_s: float
    #: weight bytes the prefill calls streamed from DRAM per prompt token (once per token
    #: tile: the tile schedule's cost)
    weight_bytes_per_token: float


@dataclass(frozen=True)
class DecodeFigures(Record):
    tokens: int
    time_per_token_s: float
    tokens_per_s: float
    time_per_call_s: tuple[float, ...]


@dataclass(frozen=True)
class ClientFigures(Record):
    """The run as a client of the serving stack measures it (``hardware.stack``):
    ``ttft_s`` = request + the card's TTFT + one token's stack cost; ``time_per_token_s``
    and ``tokens_per_s`` only with decode calls."""

    ttft_s: float
    stack_request_s: float
    stack_token_s: float
    time_per_token_s: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class KvCacheFigures(Record):
    """The stored cache at the end of the run (all layers), against bf16, and how many
    tokens fit in the DRAM the model leaves free."""

    format: str
    context_tokens: int
    bytes: int
    bytes_per_token: float
    bf16_bytes: int
    compression_vs_bf16: float
    capacity_tokens: int


@dataclass(frozen=True)
class Bound(Record):
    """A roofline: ``max(DRAM bytes / DRAM bandwidth, ops / peak ops)``, seconds."""

    dram_bound_s: float
    compute_bound_s: float
    bound_s: float


@dataclass(frozen=True)
class RooflineFigures(Record):
    prefill: Bound
    decode_per_token: Bound
    bound_s: float
    dram_bytes_per_s: float
    peak_ops_per_s: float


@dataclass(frozen=True)
class PhaseTime(Record):
    """Where a phase's time went (``sim.app.breakdown.time_breakdown``): each resource's
    demand in seconds and the largest one (``critical``). A speculative run's phases are
    ``prefill``, ``draft``, ``verify`` and ``tail_cut``."""

    calls: int
    elapsed_s: float
    dram_weights_s: float
    dram_kv_cache_s: float
    dram_activations_s: float
    dram_host_io_s: float
    compute_s: float
    host_link_s: float
    runtime_overhead_s: float
    program_launch_s: float
    dispatch_s: float
    barrier_sync_s: float
    critical: str
    #: host-side work that is no runtime call (a prompt-lookup draft); only where some is
    host_work_s: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class CallRow(Record):
    """One runtime call (``sim.app.breakdown.call_rows``); times from the simulation's start."""

    op: str
    phase: str
    step: int
    tokens: int
    start_s: float
    end_s: float
    time_s: float
    cache_tokens: int
    kv_cache_bytes: int
    dram_bytes: int
    dram_bytes_by_kind: Mapping[str, int]
    pcie_h2d_bytes: int
    pcie_d2h_bytes: int
    ops: int


@dataclass(frozen=True)
class CompiledFigures(Record):
    core_mode: str
    max_sequence_tokens: int = field(metadata=_key("max_sequence_length"))
    cache_tokens: int = field(metadata=_key("cache_length"))
    m_tile_tokens: int = field(metadata=_key("m_tile"))
    weight_tile_bytes: int = field()  # a prefill pass's weight tile buffer (two per core)
    decode_tile_bytes: int = field()  # a decode pass's
    dram_bytes: int = field()
    weight_bytes: int = field()


@dataclass(frozen=True)
class WeightsFigures(Record):
    kind: str | None
    real: bool


@dataclass(frozen=True)
class TextFigures(Record):
    """The text of a functional run (``sim.app.run_text.text_figures``): the prompt, the
    generated text and, where the float reference ran (``reference_compared``), its
    continuation and the first output token where the two differ (None: none differs).
    ``degenerate``: what the degenerate-output guard found, if anything."""

    prompt: str | None
    generated_text: str | None
    reference_compared: bool
    reference_text: str | None
    first_difference_token: int | None
    degenerate: str | None

    @classmethod
    def from_json(cls, tree: Any, where: str) -> TextFigures:
        if not isinstance(tree, Mapping):
            raise ResultsError(f"{where}: expected an object, got {tree!r}")
        compared = "reference_text" in tree
        keys = ["prompt", "generated_text",
                *(["reference_text", "first_difference"] if compared else []), "degenerate"]
        unknown = [k for k in tree if k not in keys]
        if unknown:
            raise ResultsError(f"{where}.{unknown[0]}: unknown key (known: "
                               f"{', '.join(keys)})")
        missing = [k for k in keys if k not in tree]
        if missing:
            raise ResultsError(f"{where}.{missing[0]}: missing")
        text = str | None
        return cls(decode(text, tree["prompt"], f"{where}.prompt"),
                   decode(text, tree["generated_text"], f"{where}.generated_text"), compared,
                   decode(text, tree.get("reference_text"), f"{where}.reference_text"),
                   decode(int | None, tree.get("first_difference"),
                          f"{where}.first_difference"),
                   decode(text, tree["degenerate"], f"{where}.degenerate"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": self.prompt, "generated_text": self.generated_text}
        if self.reference_compared:
            out["reference_text"] = self.reference_text
            out["first_difference"] = self.first_difference_token
        out["degenerate"] = self.degenerate
        return out


@dataclass(frozen=True)
class CacheOpRecord(Record):
    """One scheduled cache operation (``workload.cache_ops``) as it ran: where, its
    simulated time, the host model's part of it and the measured host wall time (that of
    the machine, not of kvsim), the bytes it moved and the cache size after it."""

    at_token: int
    op: str
    where: str
    time_s: float
    pcie_bytes: int
    dram_bytes: int
    host_model_s: float
    host_measured_s: float
    new_cache_size: int


@dataclass(frozen=True)
class TraceFigures(Record):
    level: str
    dropped_events: int


@dataclass(frozen=True)
class GenerateMetrics(Record):
    """A ``workload.kind = "generate"`` run (``sim.app.run.run_generate``). ``config``: the
    resolved run config as ``RunConfig.resolved()`` writes it (typed by
    ``sim.app.config.RunConfig``), kept as read."""

    config: Mapping[str, Any] = field(metadata=NOT_A_COLUMN)
    scenario: str = field()
    sim_time_s: float = field()
    launch: LaunchFigures = field()
    context: ContextFigures = field()
    prefill: PrefillFigures = field()
    decode: DecodeFigures = field()
    client: ClientFigures = field()
    traffic_bytes: Mapping[str, int] = field()
    traffic_by_kind_bytes: Mapping[str, int] = field(metadata=_key("traffic_by_kind"))
    kv_cache: KvCacheFigures = field()
    roofline: RooflineFigures = field()
    calls: tuple[CallRow, ...] = field(metadata=NOT_A_COLUMN)
    time_breakdown: Mapping[str, PhaseTime] = field()
    engine_busy_s: Mapping[str, float] = field()
    engine_utilization: Mapping[str, float] = field()
    instructions: int = field()
    compiled: CompiledFigures = field()
    generated_tokens: tuple[int, ...] = field()
    weights: WeightsFigures = field()
    text: TextFigures | None = field()
    cache_ops: tuple[CacheOpRecord, ...] = field()
    functional: bool = field()
    trace: TraceFigures = field()
    #: a run with ``[speculate]`` only (:mod:`traces.speculation_results`)
    speculation: SpeculationFigures | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class GemvMetrics(Record):
    """A ``workload.kind = "gemv"`` run (``sim.app.run.run_gemv``): the demo layer on the
    device, no runtime."""

    config: Mapping[str, Any] = field(metadata=NOT_A_COLUMN)
    scenario: str = field()
    sim_time_s: float = field()
    traffic_bytes: Mapping[str, int] = field()
    traffic_by_kind_bytes: Mapping[str, int] = field(metadata=_key("traffic_by_kind"))
    engine_busy_s: Mapping[str, float] = field()
    engine_utilization: Mapping[str, float] = field()
    instructions: int = field()
    ops: int = field()
    weight_bytes: int = field()
    weight_stream_bytes_per_s: float = field()
    roofline: Bound = field()
    calls: tuple[CallRow, ...] = field(metadata=NOT_A_COLUMN)
    time_breakdown: Mapping[str, PhaseTime] = field()
    functional_check: str | None = field()
    trace: TraceFigures = field()


#: The typed result of a run, either kind.
RunMetrics = GenerateMetrics | GemvMetrics


def run_metrics(metrics: Mapping[str, Any],
                where: str = "metrics.json") -> GenerateMetrics | GemvMetrics:
    """The typed result of a run's metrics: a generate run (it has ``prefill``) or the
    GEMV demo."""
    if not isinstance(metrics, Mapping):
        raise ResultsError(f"{where}: expected an object, got {type(metrics).__name__}")
    cls = GenerateMetrics if "prefill" in metrics else GemvMetrics
    return cls.from_metrics(metrics, where)


__all__ = ["Bound", "CacheOpFigures", "CacheOpRecord", "CallRow", "ClientFigures",
           "CompiledFigures",
           "ContextFigures", "DecodeFigures", "GemvMetrics", "GenerateMetrics",
           "KvCacheFigures", "LaunchFigures", "PhaseTime", "PrefillFigures", "ResultsError",
           "RooflineFigures", "RunFigures", "RunMetrics", "ServingMetrics", "SpeculationFigures",
           "TextFigures",
           "TraceFigures",
           "WeightsFigures", "run_metrics", "serving_metrics_of"]
