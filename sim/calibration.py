"""Calibration of the ``aries`` preset against the published Llama-3.2-1B point.

The published MLA100 measurement (FACTS.md; ``configs/validate-llama-3.2-1b.toml``) gives
two figures: TTFT for 240 prompt tokens and decode tokens/s per user. Two equations fit at
most two free parameters; every other parameter keeps its source or its assumption. The
two fitted here, each inside its physical bounds:

- ``dram.timing.row_run_bytes`` (decode): how many bytes of one stream a DRAM row serves
  before the other masters' accesses close it (eight cores, their KV and store streams and
  the host link share the channels). Bounds: one interleave granule (256 B: arbitration
  per request) to one page (2048 B: no interference, the JEDEC-ideal schedule). Decode is
  a weight stream, so it is the figure this parameter moves most.
- ``sram.bytes_per_core`` (TTFT): prefill re-streams the weights once per token tile and
  the tile is what the SRAM holds, so TTFT / decode fixes it. Bounds: 128–512 KiB per core
  (1–4 MiB per chip, the range of edge NPUs of this class; an assumption).

The fixed costs (``host.call_overhead_ns``, ``cores.program_launch_ns``,
``cores.dispatch_cycles``, ``cores.barrier_sync_ns``) are not fitted: one point cannot
separate them from the DRAM parameter (each adds time to both figures), and together they
are under 2 % of a token at their assumed values; a measurement of the same model at two
prompt lengths and with a one-layer model (per-call and per-layer costs apart from the
bytes) would.

Each figure is measured on the device directly (one forward program plus the runtime's
per-call host overhead, as ``infer`` does), without the launch, so a fit takes minutes;
``kvsim run configs/validate-llama-3.2-1b.toml`` confirms the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.config import load_preset

from .device import Device
from .hw import HardwareConfig, load_hardware
from .units import KiB, ns_to_ps

#: The published point (FACTS.md: MLA100 MXM, GenAI-Perf, 240 input and 10 output tokens,
#: INT8 weights): TTFT in seconds and decode seconds per token (1 / 30.73 tokens/s).
PUBLISHED_TTFT_S = 0.43056
PUBLISHED_DECODE_S = 1 / 30.73
PROMPT_TOKENS = 240

#: (field, lower bound, upper bound, step) of each fitted parameter.
RUN_BOUNDS = ("dram.timing.row_run_bytes", 256, 2048, 32)
SRAM_BOUNDS = ("sram.bytes_per_core", 128 * KiB, 512 * KiB, 4 * KiB)


@dataclass(frozen=True)
class Figures:
    ttft_s: float | None
    decode_s: float


@dataclass
class Fit:
    values: dict[str, int]
    figures: Figures
    tried: list[tuple[dict[str, int], Figures]] = field(default_factory=list)

    def residuals_pct(self) -> dict[str, float]:
        out = {"decode": (self.figures.decode_s / PUBLISHED_DECODE_S - 1) * 100}
        if self.figures.ttft_s is not None:
            out["ttft"] = (self.figures.ttft_s / PUBLISHED_TTFT_S - 1) * 100
        return out


def _compiled(hw: HardwareConfig, model: str):
    return compile_model(load_preset(model), build_bit_config({}), HardwareTarget.from_hw(hw),
                         kv="int8", core_mode="global8", max_seq=PROMPT_TOKENS,
                         cap=PROMPT_TOKENS + 16, functional=False)


def _program_s(hw: HardwareConfig, cm, tokens: int, cache_size: int) -> float:
    dev = Device(hw, functional=False)
    dev.set_layout(cm.layout(host_bytes=hw.host.memory_bytes))
    run = dev.run(cm.program(tokens=tokens, cache_size=cache_size), validate=False)
    return (run.duration_ps + ns_to_ps(hw.host.call_overhead_ns)) / 1e12


_COMPILED: dict[tuple, Any] = {}


def measure(overrides: dict[str, Any], *, ttft: bool = True,
            model: str = "llama-3.2-1b") -> Figures:
    """TTFT (prefill of 240 tokens) and decode seconds per token (one token at 240 cached)
    with ``overrides`` on the aries preset."""
    hw = load_hardware("aries", overrides)
    key = (model, HardwareTarget.from_hw(hw))  # the compiler sees only the target
    if key not in _COMPILED:
        _COMPILED.clear()
        _COMPILED[key] = _compiled(hw, model)
    cm = _COMPILED[key]
    decode = _program_s(hw, cm, 1, PROMPT_TOKENS)
    return Figures(_program_s(hw, cm, PROMPT_TOKENS, 0) if ttft else None, decode)


def _bisect(lo: int, hi: int, step: int, f, target: float, *, rising: bool,
            tried: list) -> int:
    """The grid value in [lo, hi] (multiples of ``step``) whose ``f`` is closest to
    ``target``, for ``f`` monotonic (rising or falling) in its argument."""
    best, best_err = None, float("inf")
    a, b = lo // step, hi // step
    while a <= b:
        mid = (a + b) // 2
        v = f(mid * step)
        tried.append((mid * step, v))
        if abs(v - target) < best_err:
            best, best_err = mid * step, abs(v - target)
        if (v < target) == rising:
            a = mid + 1
        else:
            b = mid - 1
    assert best is not None
    return best


def fit(*, log=print) -> Fit:
    """Fit ``row_run_bytes`` to the published decode, then ``sram.bytes_per_core`` to the
    published TTFT (the SRAM moves decode little; the run length is refit once after)."""
    tried: list = []
    sram = load_hardware("aries").sram.bytes_per_core

    def decode_at(run: int) -> float:
        d = measure({RUN_BOUNDS[0]: run, SRAM_BOUNDS[0]: sram}, ttft=False).decode_s
        log(f"  row_run_bytes {run:5d}, sram {sram // KiB} KiB: decode {d * 1e3:.3f} ms")
        return d

    def ttft_at(s: int) -> float:
        f = measure({RUN_BOUNDS[0]: run, SRAM_BOUNDS[0]: s})
        tried.append(({RUN_BOUNDS[0]: run, SRAM_BOUNDS[0]: s}, f))
        log(f"  sram {s // KiB} KiB, row_run_bytes {run}: TTFT {f.ttft_s * 1e3:.2f} ms, "
            f"decode {f.decode_s * 1e3:.3f} ms")
        return f.ttft_s

    _, lo, hi, step = RUN_BOUNDS
    run = _bisect(lo, hi, step, decode_at, PUBLISHED_DECODE_S, rising=False, tried=[])
    _, slo, shi, sstep = SRAM_BOUNDS
    sram = _bisect(slo, shi, sstep, ttft_at, PUBLISHED_TTFT_S, rising=False, tried=[])
    run = _bisect(lo, hi, step, decode_at, PUBLISHED_DECODE_S, rising=False, tried=[])
    values = {RUN_BOUNDS[0]: run, SRAM_BOUNDS[0]: sram}
    return Fit(values, measure(values), tried)


def main() -> int:
    log = print
    log("fitting the aries preset to the published Llama-3.2-1B point "
        f"(TTFT {PUBLISHED_TTFT_S * 1e3:.2f} ms, decode {PUBLISHED_DECODE_S * 1e3:.3f} ms/token)")
    res = fit(log=log)
    for (name, lo, hi, _), v in zip((RUN_BOUNDS, SRAM_BOUNDS), res.values.values(),
                                    strict=True):
        log(f"fitted {name} = {v}  (bounds {lo} .. {hi})")
    f = res.figures
    log(f"TTFT {f.ttft_s * 1e3:.2f} ms, decode {f.decode_s * 1e3:.3f} ms/token "
        f"({1 / f.decode_s:.2f} tokens/s)")
    log("residuals: " + ", ".join(f"{k} {v:+.2f} %" for k, v in res.residuals_pct().items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
