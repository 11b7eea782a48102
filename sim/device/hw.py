"""Hardware configuration: validated, frozen, with the unit in every field name.

Presets are TOML data files in ``sim/device/presets/``. Every number in a preset is either traced
to a public source (``[sources]``) or labelled an assumption with its reasoning
(``[assumptions]``); ``kvsim hw show NAME`` prints both next to the derived figures.
"""

from __future__ import annotations

import re
import tomllib
from functools import cached_property
from importlib import resources
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from kvsim.errors import ConfigError
from models.schema import Frozen, validation_message
from sim.device.dram.standards import DramTiming, grade, grade_names, timing_from_config

PRESET_PACKAGE = "sim.device.presets"

#: Post-encoding data rate of one PCIe lane in transfers/s (GT/s) by generation.
#: PCI-SIG base specifications: Gen3 8 GT/s, Gen4 16 GT/s, Gen5 32 GT/s, all 128b/130b.
PCIE_GT_PER_S = {3: 8.0e9, 4: 16.0e9, 5: 32.0e9}
PCIE_ENCODING_EFFICIENCY = 128 / 130  # 128b/130b line code (Gen3 and later)


class DramConfig(Frozen):
    """Device DRAM (LPDDR4X on ARIES): its organisation, and in ``timing`` the protocol
    timing of its standard (a timing file of ``sim/device/dram/``, see ``standards.py``;
    a preset may name a speed grade there instead of writing the table)."""

    channels: int = Field(ge=1)
    bus_width_bits_per_channel: int = Field(ge=1)
    data_rate_mtps: float = Field(gt=0, description="mega-transfers per second per pin")
    model: Literal["protocol", "efficiency"] = Field(
        "efficiency", description="how a DMA chunk is timed: 'protocol' from the DRAM "
        "standard's timing in [dram.timing] (bank state, refresh, turnaround per channel), "
        "'efficiency' at efficiency x peak per channel")
    efficiency: float = Field(gt=0, le=1, description="sustained / peak for streaming access "
                              "(dram.model = 'efficiency' only)")
    access_latency_ns: float = Field(ge=0)
    capacity_bytes: int = Field(ge=1)
    interleave_bytes: int = Field(ge=64, description="address interleave granule across channels")
    timing: DramTiming | None = Field(
        None, description="protocol timing of the DRAM standard (dram.model = 'protocol'): "
        "its table, or the name of a speed grade (sim/device/dram/standards.py)")

    @model_validator(mode="after")
    def _page_holds_granule(self) -> DramConfig:
        t = self.timing
        if t is None:
            if self.model == "protocol":
                raise ValueError("model = 'protocol' needs a [dram.timing] table (see the "
                                 "aries preset), or set model = 'efficiency'")
            return self
        burst = t.burst_length * self.bus_width_bits_per_channel // 8
        if t.page_bytes % burst:
            raise ValueError(f"timing.page_bytes ({t.page_bytes}) must be a multiple of one "
                             f"burst ({burst} bytes = burst_length x bus width)")
        if t.row_run_bytes is not None and t.row_run_bytes % burst:
            raise ValueError(f"timing.row_run_bytes ({t.row_run_bytes}) must be a multiple "
                             f"of one burst ({burst} bytes)")
        if self.interleave_bytes % burst:
            raise ValueError(f"interleave_bytes ({self.interleave_bytes}) must be a multiple "
                             f"of one burst ({burst} bytes)")
        timing_from_config(self)  # the standard's checks against the data rate, at load
        return self

    @property
    def peak_bytes_per_s(self) -> float:
        return self.channels * self.bus_width_bits_per_channel / 8 * self.data_rate_mtps * 1e6

    @cached_property
    def streaming_efficiency(self) -> float:
        """Sustained / peak of a long sequential read stream: ``efficiency`` in the
        efficiency model, the protocol model's closed form (refresh stalls) otherwise."""
        if self.model == "efficiency":
            return self.efficiency
        return timing_from_config(self).sequential_efficiency()

    @property
    def effective_bytes_per_s(self) -> float:
        """Sustained bandwidth of a long sequential read stream (all channels)."""
        return self.peak_bytes_per_s * self.streaming_efficiency

    @property
    def bound_bytes_per_s(self) -> float:
        """The bandwidth a roofline divides by: never exceeded by any access. The protocol
        model can beat its long-stream figure on a burst shorter than one refresh
        interval, so its bound is the peak."""
        return self.effective_bytes_per_s if self.model == "efficiency" else \
            self.peak_bytes_per_s

    @property
    def channel_effective_bytes_per_s(self) -> float:
        return self.effective_bytes_per_s / self.channels


class SramConfig(Frozen):
    """On-chip SRAM, one bank group per core."""

    bytes_per_core: int = Field(ge=1024)
    ports_per_core: int = Field(ge=1)
    port_bytes_per_cycle: int = Field(ge=1)


class DmaConfig(Frozen):
    """DMA engines: each core has a load queue (DRAM->SRAM) and a store queue (SRAM->DRAM);
    one device-wide engine does DRAM->DRAM copies."""

    chunk_bytes: int = Field(ge=64)
    max_outstanding_chunks: int = Field(ge=1)
    setup_latency_ns: float = Field(ge=0)


class PcieConfig(Frozen):
    generation: Literal[3, 4, 5]
    lanes: Literal[1, 2, 4, 8, 16]
    max_payload_bytes: Literal[128, 256, 512, 1024, 2048, 4096]
    max_read_request_bytes: Literal[128, 256, 512, 1024, 2048, 4096]
    write_tlp_overhead_bytes: int = Field(ge=0, description="framing+seq+LCRC+header per MWr")
    completion_tlp_overhead_bytes: int = Field(ge=0, description="per read completion (CplD)")
    dllp_overhead_fraction: float = Field(ge=0, lt=1, description="ACK/FC DLLPs + idle")
    latency_ns: float = Field(ge=0, description="per transfer: doorbell, descriptor, round trip")
    chunk_bytes: int = Field(ge=256, description="granularity of link events in the simulation")

    @property
    def lane_bytes_per_s(self) -> float:
        return PCIE_GT_PER_S[self.generation] * PCIE_ENCODING_EFFICIENCY / 8

    @property
    def raw_bytes_per_s(self) -> float:
        return self.lane_bytes_per_s * self.lanes

    @property
    def d2h_effective_bytes_per_s(self) -> float:
        """Device writes host memory with posted MWr TLPs of ``max_payload_bytes``."""
        p = self.max_payload_bytes
        return self.raw_bytes_per_s * p / (p + self.write_tlp_overhead_bytes) * (
            1 - self.dllp_overhead_fraction
        )

    @property
    def h2d_effective_bytes_per_s(self) -> float:
        """Device reads host memory: data returns in completions no larger than
        min(max payload, max read request)."""
        p = min(self.max_payload_bytes, self.max_read_request_bytes)
        return self.raw_bytes_per_s * p / (p + self.completion_tlp_overhead_bytes) * (
            1 - self.dllp_overhead_fraction
        )


class SharedDramLinkConfig(Frozen):
    """Host CPU on the same SoC as the NPU, sharing its DRAM (REGULUS): a host<->device
    "transfer" is a memory copy by the host CPU through the same DRAM channels."""

    host_copy_bytes_per_s: float = Field(gt=0, description="host CPU memcpy bandwidth")
    latency_ns: float = Field(ge=0, description="per transfer: cache maintenance, syscall")
    chunk_bytes: int = Field(ge=256)


class HostLinkConfig(Frozen):
    kind: Literal["pcie", "shared_dram"]
    pcie: PcieConfig | None = None
    shared_dram: SharedDramLinkConfig | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> HostLinkConfig:
        if self.kind == "pcie" and self.pcie is None:
            raise ValueError("kind = 'pcie' needs a [host_link.pcie] table")
        if self.kind == "shared_dram" and self.shared_dram is None:
            raise ValueError("kind = 'shared_dram' needs a [host_link.shared_dram] table")
        return self

    @property
    def h2d_effective_bytes_per_s(self) -> float:
        if self.kind == "pcie":
            return self.pcie.h2d_effective_bytes_per_s
        return self.shared_dram.host_copy_bytes_per_s

    @property
    def d2h_effective_bytes_per_s(self) -> float:
        if self.kind == "pcie":
            return self.pcie.d2h_effective_bytes_per_s
        return self.shared_dram.host_copy_bytes_per_s

    @property
    def latency_ns(self) -> float:
        return self.pcie.latency_ns if self.kind == "pcie" else self.shared_dram.latency_ns

    @property
    def chunk_bytes(self) -> int:
        return self.pcie.chunk_bytes if self.kind == "pcie" else self.shared_dram.chunk_bytes


_PRECISION_KEY = re.compile(r"^w(2|4|8|16)a(8|16)$")


class CoresConfig(Frozen):
    clusters: int = Field(ge=1)
    cores_per_cluster: int = Field(ge=1)
    clock_hz: float = Field(gt=0)
    macs_per_cycle: dict[str, int] = Field(
        description="MACs per cycle per core for each (weight bits, activation bits) pair, "
        "keys like 'w8a8'"
    )
    vector_lanes: int = Field(ge=1, description="elementwise integer ops per cycle per core")
    issue_latency_cycles: int = Field(ge=0, description="compute pipeline fill of one matrix "
                                      "or vector instruction, cycles (part of its duration)")
    dispatch_cycles: int = Field(0, ge=0, description="per instruction on every engine queue "
                                 "(DMA, compute, host link; not the flag-joining nop): fetch "
                                 "and decode before it waits for its flags, core cycles")
    program_launch_ns: float = Field(0.0, ge=0, description="device cost of starting one "
                                     "program (doorbell to the engines' first instruction)")
    barrier_sync_ns: float = Field(0.0, ge=0, description="cost of one cross-core "
                                   "synchronisation: paid by an instruction that waits on a "
                                   "flag another core signals, once its flags are in")

    @field_validator("macs_per_cycle")
    @classmethod
    def _keys(cls, v: dict[str, int]) -> dict[str, int]:
        for key, macs in v.items():
            if not _PRECISION_KEY.match(key):
                raise ValueError(f"key {key!r} is not of the form 'w<bits>a<bits>' (e.g. 'w8a8')")
            if macs < 1:
                raise ValueError(f"{key} must be >= 1, got {macs}")
        if "w8a8" not in v:
            raise ValueError("must define 'w8a8'")
        return v

    @property
    def num_cores(self) -> int:
        return self.clusters * self.cores_per_cluster

    def peak_ops_per_s(self, precision: str) -> float:
        """Peak ops/s of all cores (1 MAC = 2 ops)."""
        return 2 * self.macs_per_cycle[precision] * self.clock_hz * self.num_cores


class HostConfig(Frozen):
    """The host computer and the cost model of host-side work on the cache."""

    memory_bytes: int = Field(ge=1)
    call_overhead_ns: float = Field(ge=0, description="runtime/driver cost of one device call")
    edit_bytes_per_s: float = Field(gt=0, description="host throughput editing decoded caches")
    edit_overhead_ns: float = Field(ge=0, description="fixed cost of one host-side edit")


class StackConfig(Frozen):
    """The serving stack between a benchmark client and the card (an OpenAI-compatible
    server: HTTP streaming, chat template, tokenizer and detokenizer, the server's
    scheduler and its generate loop), apart from the card's own time and the runtime's
    per-call cost (``host.call_overhead_ns``). A client such as GenAI-Perf measures TTFT
    as ``request_ns`` + the prefill calls + ``token_ns`` (the first token sampled, detokenized
    and streamed), and each later token as one decode call + ``token_ns``."""

    request_ns: float = Field(0.0, ge=0, description="once per request, at the client: "
                              "HTTP request and first response, chat template and "
                              "tokenization of the prompt, admission by the scheduler")
    token_ns: float = Field(0.0, ge=0, description="once per output token: sampling from "
                            "the logits on the host, the generate loop's step, "
                            "detokenization and one streamed HTTP event")


class FittedParam(Frozen):
    """A parameter fitted to published measurements: its physical bounds (in the unit of
    the field) and what sets them (``python -m sim.app.calibration fit``)."""

    low: float
    high: float
    unit: str
    fitted_to: str = Field(description="the published figures that fix it")

    @model_validator(mode="after")
    def _ordered(self) -> FittedParam:
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) must be <= high ({self.high:g})")
        return self


class HardwareConfig(Frozen):
    name: str
    description: str = ""
    dram: DramConfig
    sram: SramConfig
    dma: DmaConfig
    host_link: HostLinkConfig
    cores: CoresConfig
    host: HostConfig
    stack: StackConfig = StackConfig()
    sources: dict[str, str] = Field(default_factory=dict)
    assumptions: dict[str, str] = Field(default_factory=dict)
    #: the fitted parameters by dotted field, with their bounds (``kvsim hw show``)
    fitted: dict[str, FittedParam] = Field(default_factory=dict)

    def field_value(self, dotted: str) -> Any:
        """The value of a dotted field (``"sram.bytes_per_core"``)."""
        node: Any = self
        for part in dotted.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        return node

    @model_validator(mode="after")
    def _fitted_fields_exist(self) -> HardwareConfig:
        for name in self.fitted:
            try:
                value = self.field_value(name)
            except (AttributeError, KeyError):
                raise ValueError(f"fitted: {name!r} is not a hardware field") from None
            if value is not None and not isinstance(value, int | float):
                raise ValueError(f"fitted: {name!r} is not a number")
        return self

    def fitted_outside(self) -> list[str]:
        """The fitted fields whose value lies outside their bounds (an override may put
        them there; the fit never does)."""
        return [n for n, f in self.fitted.items()
                if (v := self.field_value(n)) is None or not f.low <= v <= f.high]

    @model_validator(mode="before")
    @classmethod
    def _timing_grade(cls, data: Any) -> Any:
        """``dram.timing = "GRADE"``: the grade's table, its sources and assumptions (the
        preset's own entries first)."""
        dram = data.get("dram") if isinstance(data, dict) else None
        name = dram.get("timing") if isinstance(dram, dict) else None
        if not isinstance(name, str):
            return data
        try:
            g = grade(name)
        except KeyError:
            raise ValueError(f"dram.timing: unknown speed grade {name!r}; valid: "
                             f"{', '.join(grade_names())} (or a [dram.timing] table)") from None
        return {**data, "dram": {**dram, "timing": g.table},
                "sources": {**g.sources, **data.get("sources", {})},
                "assumptions": {**g.assumptions, **data.get("assumptions", {})}}

    @cached_property
    def derived(self) -> dict[str, float]:
        """Figures computed from the physical parameters (all per second)."""
        out: dict[str, float] = {
            f"peak_ops_per_s_{k}": self.cores.peak_ops_per_s(k)
            for k in sorted(self.cores.macs_per_cycle)
        }
        out["dram_peak_bytes_per_s"] = self.dram.peak_bytes_per_s
        out["dram_effective_bytes_per_s"] = self.dram.effective_bytes_per_s
        out["pcie_h2d_effective_bytes_per_s"] = self.host_link.h2d_effective_bytes_per_s
        out["pcie_d2h_effective_bytes_per_s"] = self.host_link.d2h_effective_bytes_per_s
        if self.host_link.kind == "pcie":
            out["pcie_raw_bytes_per_s"] = self.host_link.pcie.raw_bytes_per_s
        out["sram_port_bytes_per_s"] = self.sram.port_bytes_per_cycle * self.cores.clock_hz
        return out


def set_dotted(tree: dict[str, Any], dotted: str, value: Any, *, root: str = "") -> None:
    """Set ``tree['a']['b'] = value`` for ``dotted='a.b'``, creating no new tables silently
    where the path walks through a non-table."""
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        elif not isinstance(nxt, dict):
            where = ".".join([root, *parts[: i + 1]] if root else parts[: i + 1])
            raise ConfigError(f"{where}: is a value, not a table; cannot set {dotted}")
        node = nxt
    node[parts[-1]] = value


def preset_names() -> list[str]:
    files = resources.files(PRESET_PACKAGE).iterdir()
    return sorted(f.name[: -len(".toml")] for f in files if f.name.endswith(".toml"))


def preset_dict(name: str) -> dict[str, Any]:
    names = preset_names()
    if name not in names:
        raise ConfigError(f"hardware.preset: unknown preset {name!r}; valid: {', '.join(names)}")
    text = resources.files(PRESET_PACKAGE).joinpath(f"{name}.toml").read_text()
    return tomllib.loads(text)


def build_hardware(data: dict[str, Any], *, where: str = "hardware") -> HardwareConfig:
    try:
        return HardwareConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(validation_message(err, where)) from None


def load_hardware(
    name: str, overrides: dict[str, Any] | None = None, *, where: str = "hardware"
) -> HardwareConfig:
    """A preset by name with dotted-path overrides, e.g. ``{"dram.efficiency": 0.6}``."""
    import copy

    data = copy.deepcopy(preset_dict(name))
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value, root=where)
    return build_hardware(data, where=where)
