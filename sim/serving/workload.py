"""Serving workloads: ``N`` requests with prompt and output lengths (fixed, drawn from a
distribution, or read from a JSONL trace with ``arrival_s``, ``prompt_tokens``,
``output_tokens`` per line), arriving all at once or as a Poisson process at a given rate.
Every draw comes from one generator seeded by ``seed``, so a workload is reproducible.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from kvsim.errors import ConfigError
from models.schema import Frozen
from sim.serving.scheduler import Request
from sim.units import s_to_ps


class _Section(Frozen):
    pass


class LengthDist(_Section):
    """Token counts drawn per request, rounded and clipped to ``[min, max]``:
    ``uniform`` (integers in ``[min, max]``), ``normal`` (``mean``, ``std``),
    ``lognormal`` (``median``, ``sigma`` of the log), ``exponential`` (``mean``)."""

    dist: Literal["uniform", "normal", "lognormal", "exponential"]
    min: int = Field(1, ge=1)
    max: int = Field(ge=1)
    mean: float | None = Field(None, gt=0)
    std: float | None = Field(None, ge=0)
    median: float | None = Field(None, gt=0)
    sigma: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _params(self) -> LengthDist:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) < min ({self.min})")
        need = {"uniform": (), "normal": ("mean", "std"), "lognormal": ("median", "sigma"),
                "exponential": ("mean",)}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist {self.dist!r} needs {', '.join(missing)}")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "uniform":
            x = rng.integers(self.min, self.max + 1, size=n)
        elif self.dist == "normal":
            x = rng.normal(self.mean, self.std, size=n)
        elif self.dist == "lognormal":
            x = rng.lognormal(np.log(self.median), self.sigma, size=n)
        else:
            x = rng.exponential(self.mean, size=n)
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64)


class WorkloadSpec(_Section):
    requests: int = Field(100, ge=1, description="number of requests (a trace: the first N)")
    prompt_tokens: int | LengthDist = 512
    output_tokens: int | LengthDist = 128
    arrival: Literal["all_at_once", "poisson"] = "all_at_once"
    rate_per_s: float | None = Field(None, gt=0, description="poisson: requests per second")
    trace: str | None = Field(None, description="JSONL: arrival_s, prompt_tokens, "
                                                "output_tokens per line")
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _arrival(self) -> WorkloadSpec:
        if self.arrival == "poisson" and self.rate_per_s is None and self.trace is None:
            raise ValueError("arrival = 'poisson' needs rate_per_s")
        for name in ("prompt_tokens", "output_tokens"):
            v = getattr(self, name)
            if isinstance(v, int) and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        return self


def _lengths(spec: int | LengthDist, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(n, spec, np.int64)
    return spec.draw(rng, n)


def _shown(v: object) -> str:
    """A trace value as the JSON line wrote it (``NaN``, ``true``, ``'16'``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return json.dumps(v)  # NaN, Infinity, -Infinity
    return repr(v)


def _trace_row(d: object, where: str) -> tuple[float, int, int]:
    """One trace line's ``(arrival_s, prompt_tokens, output_tokens)``: JSON numbers only
    (no strings or booleans), a finite arrival >= 0, whole token counts >= 1 (``16.0``
    is 16; ``16.9`` is refused, not rounded)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a JSON object with arrival_s, prompt_tokens, "
                          f"output_tokens, got {type(d).__name__}")
    missing = [k for k in ("arrival_s", "prompt_tokens", "output_tokens") if k not in d]
    if missing:
        raise ConfigError(f"{where}: lacks {', '.join(missing)}")
    t = d["arrival_s"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not (
            math.isfinite(t) and t >= 0):
        raise ConfigError(f"{where}: arrival_s must be a finite number >= 0, got {_shown(t)}")
    counts = []
    for key in ("prompt_tokens", "output_tokens"):
        v = d[key]
        whole = (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
        if isinstance(v, bool) or not whole or v < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {_shown(v)}")
        counts.append(int(v))
    return float(t), counts[0], counts[1]


def read_trace(path: str | Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """``(arrival_s, prompt_tokens, output_tokens)`` of each line of a JSONL trace (UTF-8
    text; each bad line is a :class:`ConfigError` naming the file, line and field)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"serving.workload.trace: {str(p)!r} does not exist")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"serving.workload.trace: {str(p)!r} is not a UTF-8 text file "
                          f"(byte 0x{data[err.start]:02x} at offset {err.start}); expected "
                          f"JSON lines of arrival_s, prompt_tokens, output_tokens") from None
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError as err:
            raise ConfigError(f"{p}:{i}: not a JSON line ({err})") from None
        out.append(_trace_row(d, f"{p}:{i}"))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ConfigError(f"{p}: no requests")
    return out


#: Latest arrival a serving run accepts, seconds (a sanity bound, not a hardware fact:
#: about 32 years; a rate of 1e-300 requests/s would otherwise overflow the clock).
MAX_ARRIVAL_S = 1e9


def make_requests(spec: WorkloadSpec) -> list[Request]:
    """The workload's requests, ids in arrival order (ties: in generation order)."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0x5E2E]))
    if spec.trace is not None:
        rows = read_trace(spec.trace, spec.requests)
        rows.sort(key=lambda r: r[0])
    else:
        n = spec.requests
        prompts = _lengths(spec.prompt_tokens, rng, n)
        outputs = _lengths(spec.output_tokens, rng, n)
        if spec.arrival == "poisson":
            gaps = rng.exponential(1.0 / spec.rate_per_s, size=n)
            times = np.cumsum(gaps) - gaps[0]  # the first request at t = 0
        else:
            times = np.zeros(n)
        rows = list(zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True))
    last = max((r[0] for r in rows), default=0.0)
    if not last <= MAX_ARRIVAL_S:  # also NaN/inf
        where = ("serving.workload.trace" if spec.trace is not None
                 else "serving.workload.rate_per_s")
        raise ConfigError(f"{where}: the last request arrives at {last:.3g} s, past the "
                          f"{MAX_ARRIVAL_S:.0e} s a serving run simulates")
    return [Request(rid=i, arrival_ps=s_to_ps(t), prompt_tokens=int(p), output_tokens=int(o))
            for i, (t, p, o) in enumerate(rows)]
