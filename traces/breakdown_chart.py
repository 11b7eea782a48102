""""Where the time went" for the sweep and serving reports (the run report draws its own,
with the critical path, in :mod:`traces.report`).

Sweep: per phase (prefill, decode per token), one stacked bar per point of what each
resource needed (the ``time_breakdown`` of its ``metrics.json``, flattened in the sweep's
rows), with the phase's elapsed time as a marker. Serving: per chip, its simulated
duration split into decode-only steps, steps with prompt tokens, KV swaps over the host
link and idle time. Time in ms throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go

from .page import is_number, layout

#: (key in a phase of ``time_breakdown``, legend name), in stacking order.
DEMANDS = (
    ("dram_weights_s", "DRAM: weight streaming"),
    ("dram_kv_cache_s", "DRAM: KV-cache reads + writes"),
    ("dram_activations_s", "DRAM: activations"),
    ("dram_host_io_s", "DRAM: host I/O buffers"),
    ("compute_s", "compute (busiest core, MXU + VPU)"),
    ("host_link_s", "host link (both directions)"),
    ("runtime_overhead_s", "runtime overhead (per call)"),
)
#: Phases of a sweep point shown, with their titles.
SWEEP_PHASES = (("prefill", "prefill"), ("decode_per_token", "decode, per token"))


def sweep_breakdowns(rows: Sequence[dict[str, Any]],
                     label: Callable[[dict[str, Any]], str]) -> list[go.Figure]:
    """One chart per phase that the points have; ``label(row)`` names a point."""
    figs = []
    ok = [r for r in rows if r.get("status") == "ok"]
    for phase, title in SWEEP_PHASES:
        have = [r for r in ok if is_number(r.get(f"time_breakdown.{phase}.elapsed_s"))]
        if not have:
            continue
        names = [label(r) for r in have]
        fig = go.Figure()
        for key, name in DEMANDS:
            col = f"time_breakdown.{phase}.{key}"
            xs = [r.get(col) * 1e3 if is_number(r.get(col)) else 0.0 for r in have]
            fig.add_trace(go.Bar(name=name, orientation="h", y=names, x=xs,
                                 hovertemplate=f"%{{y}}<br>{name}: %{{x:,.3f}} ms"
                                               "<extra></extra>"))
        fig.add_trace(go.Scatter(
            name="elapsed (wall of the phase)", mode="markers", y=names,
            x=[r[f"time_breakdown.{phase}.elapsed_s"] * 1e3 for r in have],
            marker={"symbol": "line-ns", "size": 22, "line": {"width": 3, "color": "#222"}},
            hovertemplate="%{y}<br>elapsed %{x:,.3f} ms<extra></extra>"))
        fig.update_layout(barmode="stack")
        fig.update_yaxes(autorange="reversed", type="category")
        fig = layout(fig, f"Where the time went, {title}: what each resource needed per "
                          "point (resources overlap; the bar | is the elapsed time)",
                     "time (ms)", "", height=140 + 28 * len(have))
        fig.update_layout(legend={"orientation": "v", "y": 1, "yanchor": "top", "x": 1.01,
                                  "xanchor": "left", "traceorder": "normal"},
                          margin={"l": 220, "r": 260})
        figs.append(fig)
    return figs


def serving_breakdown(steps: Sequence[Sequence[Any]], duration_s: float) -> go.Figure | None:
    """Each chip's simulated duration by what its steps did (``StepRecord``s), in ms (in s
    for a run of 10 s or more, as the serving report's other time axes)."""
    if not steps or not any(steps):
        return None
    unit, per_ps = ("s", 1e12) if duration_s >= 10 else ("ms", 1e9)
    parts = {"decode-only steps": [], "steps with prompt tokens": [],
             "KV swaps (host link)": [], "idle (no request ready)": []}
    chips = [f"chip {i}" for i in range(len(steps))]
    for chip in steps:
        swap = sum(s.swap_ps for s in chip)
        pre = sum(s.end_ps - s.start_ps - s.swap_ps for s in chip if s.prefill_tokens)
        dec = sum(s.end_ps - s.start_ps - s.swap_ps for s in chip if not s.prefill_tokens)
        busy = (swap + pre + dec) / per_ps
        parts["decode-only steps"].append(dec / per_ps)
        parts["steps with prompt tokens"].append(pre / per_ps)
        parts["KV swaps (host link)"].append(swap / per_ps)
        parts["idle (no request ready)"].append(max(0.0, duration_s * 1e12 / per_ps - busy))
    fig = go.Figure()
    colors = ("#2ca02c", "#1f77b4", "#d62728", "#d9d9d9")
    for (name, xs), color in zip(parts.items(), colors, strict=True):
        fig.add_trace(go.Bar(name=name, orientation="h", y=chips, x=xs,
                             marker={"color": color},
                             hovertemplate=f"%{{y}}<br>{name}: %{{x:,.3f}} {unit}"
                                           "<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed", type="category")
    fig = layout(fig, "Where the time went: each chip's simulated time by what its steps did",
                 f"simulated time ({unit})", "", height=max(250, 160 + 30 * len(chips)))
    fig.update_layout(legend={"orientation": "v", "y": 1, "yanchor": "top", "x": 1.01,
                              "xanchor": "left", "traceorder": "normal"},
                      margin={"r": 220})
    return fig


__all__ = ["DEMANDS", "SWEEP_PHASES", "serving_breakdown", "sweep_breakdowns"]
