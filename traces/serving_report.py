"""Traces and figures of a serving run (``kvsim serve``).

- :func:`serving_trace`: Chrome Trace Event JSON (Perfetto): one process per chip, a track
  of steps (``X`` events: tokens, decoding sequences, prompt tokens, preemptions) and of
  swaps, and counters: KV blocks in use, running/waiting/swapped requests.
- :func:`occupancy_figure`, :func:`latency_figures`, :func:`batch_figure`: plotly figures.
- :func:`serving_report_html`: a self-contained page (plotly.js embedded once).

Step records are duck-typed (``chip``, ``start_ps``, ``end_ps``, ``swap_ps``, ``tokens``,
``decode_seqs``, ``prefill_tokens``, ``preempted``, ``used_blocks``, ``running``,
``waiting``, ``swapped``); the KV geometry gives ``num_blocks``, ``block_tokens``,
``block_bytes``. Nothing here knows about hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from .breakdown_chart import serving_breakdown
from .page import Card, Figure, fmt_time, render_page, time_unit
from .page import layout as _layout
from .serving_results import ServingMetrics

PS_PER_US = 1e6
PS_PER_S = 1e12
#: Most points drawn per line (long runs are thinned to the largest value per bin).
MAX_POINTS = 5000


def serving_trace(steps: Sequence[Sequence[Any]], geometry: Any) -> dict[str, Any]:
    """Chrome Trace Event JSON of a serving run (``ts`` in µs)."""
    ev: list[dict[str, Any]] = []
    for chip, recs in enumerate(steps):
        pid = chip + 1
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": f"chip{chip}"}})
        for tid, name in ((1, "steps"), (2, "swaps")):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        for s in recs:
            t0 = s.start_ps / PS_PER_US
            if s.swap_ps:
                ev.append({"ph": "X", "name": "swap", "pid": pid, "tid": 2, "ts": t0,
                           "dur": s.swap_ps / PS_PER_US,
                           "args": {"out_bytes": s.swap_out_bytes,
                                    "in_bytes": s.swap_in_bytes}})
            ev.append({"ph": "X", "name": "step", "pid": pid, "tid": 1,
                       "ts": t0 + s.swap_ps / PS_PER_US,
                       "dur": (s.end_ps - s.start_ps - s.swap_ps) / PS_PER_US,
                       "args": {"tokens": s.tokens, "decoding": s.decode_seqs,
                                "prompt_tokens": s.prefill_tokens,
                                "preempted": list(s.preempted)}})
            t1 = s.end_ps / PS_PER_US
            ev.append({"ph": "C", "name": "kv_blocks_used", "pid": pid, "ts": t1,
                       "args": {"used": s.used_blocks,
                                "free": geometry.num_blocks - s.used_blocks}})
            ev.append({"ph": "C", "name": "requests", "pid": pid, "ts": t1,
                       "args": {"running": s.running, "waiting": s.waiting,
                                "swapped": s.swapped}})
    return {"traceEvents": ev}


def _thin(x: list[float], y: list[float]) -> tuple[list[float], list[float]]:
    if len(x) <= MAX_POINTS:
        return x, y
    k = -(-len(x) // MAX_POINTS)
    return ([x[min(i + k, len(x)) - 1] for i in range(0, len(x), k)],
            [max(y[i:i + k]) for i in range(0, len(y), k)])


def _clock(steps: Sequence[Sequence[Any]]) -> tuple[str, float]:
    """The time unit of the run's axes: ms, or s for a run of 10 s or more (ticks such as
    "120k ms" read badly), as ``(unit, ps per unit)``."""
    end_ps = max((recs[-1].end_ps for recs in steps if recs), default=0)
    return ("s", PS_PER_S) if end_ps >= 10 * PS_PER_S else ("ms", PS_PER_S / 1e3)


def occupancy_figure(steps: Sequence[Sequence[Any]], geometry: Any) -> go.Figure:
    """KV blocks in use (% of the pool) over time, one line per chip; preemptions marked."""
    fig = go.Figure()
    unit, per = _clock(steps)
    n = max(1, geometry.num_blocks)
    for chip, recs in enumerate(steps):
        t = [0.0] + [s.end_ps / per for s in recs]
        u = [0.0] + [100 * s.used_blocks / n for s in recs]
        t, u = _thin(t, u)
        fig.add_trace(go.Scatter(x=t, y=u, mode="lines", line_shape="hv",
                                 name=f"chip{chip}"))
        pre = [s for s in recs if s.preempted]
        if pre:
            fig.add_trace(go.Scatter(
                x=[s.end_ps / per for s in pre],
                y=[100 * s.used_blocks / n for s in pre], mode="markers",
                marker={"symbol": "x", "size": 7}, name=f"chip{chip} preemptions",
                text=[f"preempted {list(s.preempted)}" for s in pre]))
    title = (f"KV cache occupancy ({geometry.num_blocks:,} blocks of "
             f"{geometry.block_tokens} tokens, {geometry.block_bytes:,} B each)")
    fig.update_yaxes(rangemode="tozero")
    return _layout(fig, title, f"simulated time ({unit})", "blocks in use (%)")


def latency_figures(rows: Sequence[dict[str, Any]]) -> list[go.Figure]:
    """Cumulative distributions of TTFT and of time per output token: one chart each
    (their scales differ by orders of magnitude), each in the unit of its largest value
    (s for waits of seconds, ms, µs), the axis from 0 to that value."""
    figs = []
    for key, name in (("ttft_s", "time to first token"), ("tpot_s", "time per output token")):
        secs = np.sort([r[key] for r in rows if r.get(key) is not None])
        unit, per = time_unit(float(secs[-1]) if len(secs) else 0.0)
        v = secs / per
        fig = go.Figure()
        if len(v):
            fig.add_trace(go.Scatter(x=v, y=np.arange(1, len(v) + 1) / len(v) * 100,
                                     mode="lines", line_shape="hv", name=name,
                                     hovertemplate="%{y:.1f} % of requests within "
                                                   f"%{{x:,.3f}} {unit}<extra></extra>"))
            fig.update_xaxes(range=[0, float(v[-1])])
        fig.update_yaxes(range=[0, 100])
        figs.append(_layout(fig, f"Distribution of {name} over requests", f"{name} ({unit})",
                            "requests (%)", height=340))
    return figs


def batch_figure(steps: Sequence[Sequence[Any]]) -> go.Figure:
    """Tokens per step over time, stacked: one per decoding sequence, and prompt tokens
    (including recomputed ones)."""
    fig = go.Figure()
    unit, per = _clock(steps)
    for chip, recs in enumerate(steps):
        t = [s.end_ps / per for s in recs]
        for attr, name in (("decode_seqs", "decode tokens"),
                           ("prefill_tokens", "prompt tokens")):
            x, y = _thin(t, [float(getattr(s, attr)) for s in recs])
            prefix = f"chip{chip} " if len(steps) > 1 else ""
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=prefix + name,
                                     line_shape="hv", stackgroup=f"chip{chip}",
                                     hovertemplate=f"{prefix}{name}: %{{y:,.0f}}"
                                                   "<extra></extra>"))
    fig.update_layout(hovermode="x unified")
    return _layout(fig, "Tokens computed per step (stacked)", f"simulated time ({unit})",
                   "tokens in the step")


def serving_report_html(metrics: ServingMetrics, rows: Sequence[dict[str, Any]],
                        steps: Sequence[Sequence[Any]], geometry: Any) -> str:
    """The report page of a serving run (its typed results, request rows and steps):
    headline cards (throughput, latency percentiles, preemptions, KV occupancy), then
    where each chip's time went, KV occupancy over time, batch composition, and the
    latency distributions."""
    s = metrics.serving

    def pct(key: str) -> tuple[str, str]:
        """The median in the unit of the median, and the percentiles in that unit."""
        unit, per = time_unit(getattr(s, f"{key}_p50"))
        return unit, " / ".join(f"{getattr(s, f'{key}_p{q}') / per:,.2f}" for q in (50, 90, 99))

    (ttft_unit, ttft), (tpot_unit, tpot) = pct("ttft_s"), pct("tpot_s")
    cards = [
        Card("output throughput", f"{s.output_tokens_per_s:,.1f} tokens/s",
             note=f"{s.requests_per_s:,.2f} requests/s",
             metric="serving.output_tokens_per_s", value=s.output_tokens_per_s),
        Card("time to first token, median", fmt_time(s.ttft_s_p50, ttft_unit),
             note=f"p50 / p90 / p99: {ttft} {ttft_unit}", metric="serving.ttft_s_p50",
             value=s.ttft_s_p50),
        Card("time per output token, median", fmt_time(s.tpot_s_p50, tpot_unit),
             note=f"p50 / p90 / p99: {tpot} {tpot_unit}", metric="serving.tpot_s_p50",
             value=s.tpot_s_p50),
        Card("preemptions", f"{s.num_preemptions:,}",
             note=f"{s.recomputed_tokens:,} tokens recomputed, "
                  f"{s.swapped_bytes:,} bytes swapped",
             metric="serving.num_preemptions", value=s.num_preemptions),
        Card("KV cache peak occupancy", f"{100 * s.kv_peak_occupancy:.2f} %",
             note=f"mean {100 * s.kv_mean_occupancy:.2f} % of "
                  f"{geometry.num_blocks:,} blocks",
             metric="serving.kv_peak_occupancy", value=s.kv_peak_occupancy),
    ]
    details = [
        ("scenario", metrics.scenario),
        ("requests finished", f"{s.finished_requests:,} of {s.requests:,}"),
        ("simulated duration", fmt_time(s.duration_s)),
        ("tokens computed (prompt + decode + recomputed)",
         f"{s.computed_tokens:,} = {s.prompt_tokens_computed:,} + "
         f"{s.decode_tokens_computed:,} + {s.recomputed_tokens:,}"),
    ]
    sp = s.speculation
    if sp is not None:  # speculative decoding (sim.serving.speculate)
        details += [
            ("speculation", f"{sp.drafter}: acceptance {sp.acceptance_rate:.3f}, "
                            f"{sp.tokens_per_verification:.2f} tokens per verification"),
            ("drafted / accepted / rejected tokens",
             f"{sp.drafted_tokens:,} / {sp.accepted_tokens:,} / "
             f"{sp.rejected_tokens:,} (the rejected ones computed, then cut)"),
            ("drafting, tail cuts", f"{fmt_time(sp.draft_s)}, {fmt_time(sp.tail_cut_s)}"
                                    f" ({sp.tail_cuts:,} filter_cache_tail calls)")]
    went = serving_breakdown(steps, s.duration_s)
    figs = [*([Figure(went, wide=True)] if went is not None else []),
            Figure(occupancy_figure(steps, geometry), wide=True),
            Figure(batch_figure(steps), wide=True),
            *(Figure(f) for f in latency_figures(rows))]
    return render_page(f"kvsim serving report: {metrics.scenario or 'serving run'}",
                       subtitle="simulated times; hover any chart for its values",
                       cards=cards, details=details, figures=figs)
