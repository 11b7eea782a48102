"""Calibration of the ``aries`` preset against the two published MLA100 points.

The published measurements (FACTS.md; ``configs/validate-llama-3.2-1b.toml``): NVIDIA
GenAI-Perf against an OpenAI-compatible server on an MLA100 MXM, 240 input and 10 output
tokens, W8 builds. Llama-3.2-1B-Instruct: TTFT 430.56 ms, 30.73 output tokens/s per user;
Llama-3.1-8B-Instruct: TTFT 4,430.71 ms, 5.81 tokens/s. A client measures the card's time
plus the serving stack's (``hardware.stack``), so each figure here is the card's
(the runtime's calls, as ``kvsim run`` times them) plus the stack's costs:

- TTFT = ``stack.request_ns`` + the prefill calls (240 tokens in host chunks of
  ``compile.max_sequence_length`` = 128, the model zoo's ``npu_prefill_chunk_size``
  default) + ``stack.token_ns``;
- time per output token (1 / tokens per second per user: GenAI-Perf's inter-token
  latency) = one decode call + ``stack.token_ns``.

Four figures, fitted at once with the numerics and the schedule the validation config runs
(its ``[bits]`` and ``[compile]``), by five parameters, each with a unit, bounds and the
figures that fix it (the preset's ``[fitted]`` table, ``kvsim hw show aries``):

- the decode's slope in bytes: ``dram.timing.row_run_bytes`` (how many bytes of one stream
  a DRAM row serves before the other masters close it; a whole number of reopens per row)
  and ``dma.setup_latency_ns`` (descriptor fetch and address translation, once per
  transfer: with a weight tile per transfer, also a cost per byte). The difference of the
  two decode figures (8B minus 1B, 139.6 ms: 6.3 GB more weights per token) fixes their
  joint effect; the two points cannot tell them apart, so the row run is the coarse step
  (a reopen more or less per row) and the set-up the fine one.
- ``stack.token_ns``: the rest of a 1B decode token (the 8B follows from the slope).
- ``sram.bytes_per_core``: prefill streams the weights once per token tile, and the tile
  is what the SRAM holds at the model's width, so the SRAM fixes how TTFT grows with width
  (the 8B TTFT against the 1B's).
- ``stack.request_ns``: the rest of the 1B TTFT.

What the two points cannot separate (each scales like a fitted one): the runtime's per-call
cost (``host.call_overhead_ns``, per call as ``stack.token_ns`` is per token), the per-layer
and per-instruction costs on the card (``cores.barrier_sync_ns``, ``cores.dispatch_cycles``;
16 and 32 layers differ in bytes as much as in layers) and a lower controller efficiency of
any other kind (against the row run and the set-up). They keep their sourced or assumed
values. What would separate them: decode of one model at two context lengths, a one-layer
build, and a raw DMA bandwidth test on the card.

Each figure is measured on the device directly (the runtime's call programs and per-call
overhead, as ``infer`` does), without the launch, so a fit takes minutes; ``kvsim run
configs/validate-llama-3.2-1b.toml`` (and with ``--set
model.hf_config=configs/models/llama-3.1-8b.json``) confirms it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.app.check import run_source
from sim.app.config import RunConfig, load_run_config
from sim.app.run import ready_for_run
from sim.device.device import Device
from sim.units import KiB, ns_to_ps

ROOT = Path(__file__).resolve().parents[3]
VALIDATION_CONFIG = ROOT / "configs" / "validate-llama-3.2-1b.toml"
MODEL_CONFIGS = ROOT / "configs" / "models"


@dataclass(frozen=True)
class Published:
    """One published point (FACTS.md): TTFT and output tokens/s per user at the client."""

    name: str
    model_sets: tuple[str, ...]  # the --set lines that select the model
    ttft_s: float
    tokens_per_s: float

    @property
    def decode_s(self) -> float:
        return 1.0 / self.tokens_per_s


#: The published points (FACTS.md: MLA100 MXM, GenAI-Perf, 240 input + 10 output tokens, W8).
POINTS = (
    Published("llama-3.2-1b", (), 0.43056, 30.73),
    Published("llama-3.1-8b", (f"model.hf_config={MODEL_CONFIGS / 'llama-3.1-8b.json'}",),
              4.43071, 5.81),
)

#: The fitted fields (their bounds, units and reasons are in the preset's ``[fitted]``).
SRAM_FIELD = "sram.bytes_per_core"
RUN_FIELD = "dram.timing.row_run_bytes"
SETUP_FIELD = "dma.setup_latency_ns"
TOKEN_FIELD = "stack.token_ns"
REQUEST_FIELD = "stack.request_ns"
BURST_BYTES = 32  # aries: BL16 x 16 bits
PAGE_BYTES = 2048
SRAM_STEP = 4 * KiB


def run_lengths(lo: int = 256, hi: int = 2048, page_bytes: int = PAGE_BYTES) -> list[int]:
    """The distinct row runs within ``lo .. hi``, one per reopen count ``k = ceil(page /
    run) - 1`` (0, 1, 2, ...): the shortest whole number of bursts that gives ``k``, so the
    decode time rises along the list."""
    out = []
    for k in range(page_bytes // lo):
        run = -(-page_bytes // (k + 1) // BURST_BYTES) * BURST_BYTES
        run = max(lo, min(hi, run))
        if -(-page_bytes // run) - 1 == k:
            out.append(run)
    return out


@dataclass(frozen=True)
class Card:
    """A model's figures on the card alone (the runtime's calls, per-call overhead in)."""

    ttft_s: float | None
    decode_s: float


def run_config(point: Published, hw: dict[str, Any], extra: tuple[str, ...] = ()) -> RunConfig:
    """The validation config for ``point`` with hardware overrides ``hw``."""
    sets = [*point.model_sets, *extra, "outputs.trace=off"]
    sets += [f"hardware.{k}={v!r}" if isinstance(v, str) else f"hardware.{k}={v}"
             for k, v in hw.items()]
    return load_run_config(VALIDATION_CONFIG, sets)


def _compiled(cfg: RunConfig):
    """The compiled model of ``cfg``, as ``kvsim run`` compiles it
    (:func:`sim.runtime.ready.ready_model` keeps it: the compiler sees only the target, so
    runs that change DRAM, DMA, fixed or stack costs share one compile)."""
    return ready_for_run(cfg, run_source(cfg)).compiled


def _call_s(cfg: RunConfig, cm, tokens: int, cache_size: int) -> float:
    hw = cfg.hardware
    dev = Device(hw, functional=False)
    dev.set_layout(cm.layout(host_bytes=hw.host.memory_bytes))
    run = dev.run(cm.program(tokens=tokens, cache_size=cache_size), validate=False)
    return (run.duration_ps + ns_to_ps(hw.host.call_overhead_ns)) / 1e12


def card(cfg: RunConfig, *, ttft: bool = True) -> Card:
    """The card's TTFT (the prompt in calls of at most ``max_sequence_length`` tokens, as
    ``kvsim run`` makes them) and its decode time per token (one call with the whole prompt
    cached)."""
    cm = _compiled(cfg)
    n = cfg.workload.prompt_tokens
    decode = _call_s(cfg, cm, 1, n)
    if not ttft:
        return Card(None, decode)
    t = sum(_call_s(cfg, cm, min(cm.max_seq, n - t0), t0) for t0 in range(0, n, cm.max_seq))
    return Card(t, decode)


def client(cfg: RunConfig, c: Card) -> tuple[float | None, float]:
    """``(TTFT, time per token)`` at the client: the card's plus the stack's costs."""
    req, tok = cfg.hardware.stack.request_ns / 1e9, cfg.hardware.stack.token_ns / 1e9
    return (None if c.ttft_s is None else req + c.ttft_s + tok), c.decode_s + tok


def passes(cfg: RunConfig) -> int:
    """Weight passes of the prompt: one per token tile of each host chunk."""
    cm = _compiled(cfg)
    n = cfg.workload.prompt_tokens
    return sum(-(-min(cm.max_seq, n - t0) // cm.m_tile) for t0 in range(0, n, cm.max_seq))


def bounds(name: str) -> tuple[float, float]:
    from sim.device.hw import load_hardware

    f = load_hardware("aries").fitted[name]
    return f.low, f.high


# --- the fit ---------------------------------------------------------------------------------


@dataclass
class Fit:
    """The fitted values (by field), the figures at them and what the search tried."""

    values: dict[str, Any]
    cards: dict[str, Card]
    clients: dict[str, tuple[float, float]]
    tried: list[str]

    def residuals_pct(self) -> dict[str, float]:
        out = {}
        for p in POINTS:
            ttft, dec = self.clients[p.name]
            out[f"{p.name} TTFT"] = (ttft / p.ttft_s - 1) * 100
            out[f"{p.name} tokens/s"] = (1 / dec / p.tokens_per_s - 1) * 100
        return out


def _decodes(hw: dict[str, Any]) -> tuple[Card, Card]:
    p1, p8 = POINTS
    return card(run_config(p1, hw), ttft=False), card(run_config(p8, hw), ttft=False)


def fit_setup(hw: dict[str, Any], run: int, *, log=print) -> float | None:
    """The DMA set-up (bisection, 1 ns) whose decode slope at row run ``run`` (8B minus 1B
    time per token, the stack's cost the same in both) is the published one; None when no
    set-up inside its bounds reaches it (the run is too fast or too slow for any)."""
    p1, p8 = POINTS
    want = p8.decode_s - p1.decode_s
    lo_s, hi_s = bounds(SETUP_FIELD)

    def slope(setup: float) -> float:
        c1, c8 = _decodes({**hw, RUN_FIELD: run, SETUP_FIELD: setup})
        d = c8.decode_s - c1.decode_s
        log(f"  row_run_bytes {run:5d}, setup {setup:6.1f} ns: decode 1B {c1.decode_s * 1e3:.3f}"
            f" ms, 8B {c8.decode_s * 1e3:.3f} ms, slope {d * 1e3:.3f} ms (want {want * 1e3:.3f})")
        return d

    if slope(hi_s) < want or slope(lo_s) > want:
        return None
    a, b = lo_s, hi_s
    while b - a > 1.0:
        mid = float(round((a + b) / 2))
        if slope(mid) < want:
            a = mid
        else:
            b = mid
    return a


def _ttft_gap(hw: dict[str, Any], *, log=print) -> float:
    """8B minus 1B card TTFT, less the published difference (the stack's request and token
    costs are the same in both, so they cancel): what the SRAM must bring to zero."""
    p1, p8 = POINTS
    c1, c8 = (card(run_config(p, hw)) for p in POINTS)
    gap = (c8.ttft_s - c1.ttft_s) - (p8.ttft_s - p1.ttft_s)
    log(f"  sram {hw[SRAM_FIELD] // KiB} KiB: passes 1B {passes(run_config(p1, hw))}, 8B "
        f"{passes(run_config(p8, hw))}; TTFT card 1B {c1.ttft_s * 1e3:.2f} ms, 8B "
        f"{c8.ttft_s * 1e3:.2f} ms; gap {gap * 1e3:+.2f} ms")
    return gap


#: How far around the bisection's bracket the SRAM search looks for other pass counts
#: (the 1B's passes fall as the 8B's do, so the gap is not monotone between them).
SRAM_LOOK_AROUND = 8 * SRAM_STEP


def fit_sram(hw: dict[str, Any], *, log=print) -> list[int]:
    """The SRAM sizes per core (on its 4 KiB grid, inside its bounds) whose TTFT slope with
    width may be nearest the published one. More SRAM, longer token tiles, fewer weight
    passes, and the wider model gains more, so the gap falls as the SRAM grows: a bisection
    brackets the sign change; then one size per pair of pass counts (1B, 8B) found on the
    grid around the bracket (the 1B's passes fall too, so the gap is not
    monotone between them): the caller tries each with its own decode fit."""
    lo, hi = (int(v) // SRAM_STEP for v in bounds(SRAM_FIELD))
    seen: dict[int, float] = {}

    def gap(k: int) -> float:
        if k not in seen:
            seen[k] = _ttft_gap({**hw, SRAM_FIELD: k * SRAM_STEP}, log=log)
        return seen[k]

    a, b = lo, hi
    while b - a > 1:
        mid = (a + b) // 2
        if gap(mid) > 0:
            a = mid
        else:
            b = mid
    return [k * SRAM_STEP for k in sram_candidates(hw, a, b)]


def sram_candidates(hw: dict[str, Any], a: int, b: int) -> list[int]:
    """One SRAM size (in grid steps) per pair of pass counts (1B, 8B) within
    :data:`SRAM_LOOK_AROUND` of the bracket ``a .. b``, the smallest of each."""
    lo, hi = (int(v) // SRAM_STEP for v in bounds(SRAM_FIELD))
    step = SRAM_LOOK_AROUND // SRAM_STEP
    pairs: dict[tuple[int, ...], int] = {}
    for k in range(max(lo, a - step), min(hi, b + step) + 1):
        key = tuple(passes(run_config(p, {**hw, SRAM_FIELD: k * SRAM_STEP})) for p in POINTS)
        pairs.setdefault(key, k)
    return sorted(pairs.values())


def fit(*, log=print, runs: list[int] | None = None) -> Fit:
    """For each row run (fewest reopens first) whose decode slope some DMA set-up inside
    its bounds reaches: that set-up, the SRAM from the TTFT slope, the set-up again at that
    SRAM (its tiles move decode a little); the row run whose TTFT slope comes nearest wins.
    Then the stack's token and request costs from the 1B figures."""
    from sim.device.hw import load_hardware

    p1, p8 = POINTS
    aries = load_hardware("aries")
    tried: list[str] = []

    def note(line: str) -> None:
        tried.append(line)
        log(line)

    lo_r, hi_r = bounds(RUN_FIELD)
    best: tuple[float, dict[str, Any]] | None = None
    start = aries.sram.bytes_per_core
    for run in runs or run_lengths(int(lo_r), int(hi_r)):
        # from the best SRAM so far: the decode tile, and so the slope, follows the SRAM
        hw: dict[str, Any] = {SRAM_FIELD: best[1][SRAM_FIELD] if best else start,
                              RUN_FIELD: run}
        # a first set-up (its lower bound when none reaches the slope at this SRAM yet),
        # the SRAM, then the set-up again
        hw[SETUP_FIELD] = fit_setup(hw, run, log=note) or bounds(SETUP_FIELD)[0]
        for sram in fit_sram(hw, log=note):  # each with the set-up of its own decode tiles
            cand = {**hw, SRAM_FIELD: sram}
            setup = fit_setup(cand, run, log=note)
            if setup is None:
                continue
            cand[SETUP_FIELD] = setup
            g = _ttft_gap(cand, log=note)
            note(f"  row run {run} B: set-up {setup:g} ns, sram {sram // KiB} KiB, "
                 f"TTFT gap {g * 1e3:+.1f} ms")
            if best is None or abs(g) < abs(best[0]):
                best = (g, cand)
    if best is None:
        raise AssertionError("no row run reaches the decode slope with a set-up in bounds")
    hw = best[1]
    c1, c8 = (card(run_config(p, hw)) for p in POINTS)
    hw[TOKEN_FIELD] = float(round((p1.decode_s - c1.decode_s) * 1e9))
    hw[REQUEST_FIELD] = float(round((p1.ttft_s - c1.ttft_s) * 1e9) - hw[TOKEN_FIELD])
    cards = {p1.name: c1, p8.name: c8}
    clients = {p.name: client(run_config(p, hw), cards[p.name]) for p in POINTS}
    return Fit(hw, cards, clients, tried)
