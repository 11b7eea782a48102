""""Where the time went" in the reports.

Run (:func:`run_breakdown`): per phase, the elapsed time, the critical path read from the
event log (:mod:`traces.critical`) by what was on it, and what each resource needed (the
run's ``time_breakdown``; resources overlap, so the largest demand bounds the phase).
Sweep: per phase (prefill, decode per token), one stacked bar per point of what each
resource needed (the ``time_breakdown`` of its ``metrics.json``, flattened in the sweep's
rows), with the phase's elapsed time as a marker. Serving: per chip, its simulated
duration split into decode-only steps, steps with prompt tokens, KV swaps over the host
link and idle time. Time in ms (serving: in s for runs of 10 s or more).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from .critical import GROUPS, path_columns, time_by_group
from .page import is_number, layout
from .recorder import Recorder
from .results import PhaseTime, RunMetrics

PS_PER_S = 1e12

#: (key in time_breakdown, row, legend name) of the run's breakdown chart, drawing order.
_DEMANDS = (
    ("elapsed_s", "elapsed", "elapsed (wall of the phase)"),
    ("dram_weights_s", "DRAM", "weight streaming"),
    ("dram_kv_cache_s", "DRAM", "KV-cache reads + writes"),
    ("dram_activations_s", "DRAM", "activations"),
    ("dram_host_io_s", "DRAM", "host I/O buffers"),
    ("compute_s", "compute", "compute (busiest core, MXU + VPU)"),
    ("host_link_s", "host link", "host link (both directions)"),
    ("runtime_overhead_s", "runtime", "runtime overhead (per call)"),
    ("program_launch_s", "fixed", "program launch (per program)"),
    ("dispatch_s", "fixed", "instruction dispatch (busiest engine)"),
    ("barrier_sync_s", "fixed", "cross-core barriers (most-waiting engine)"),
)
#: Colours of the demands (fixed: the critical path's bars come first in the figure, and
#: plotly's colour cycle would otherwise give the two legends look-alike colours).
_DEMAND_COLORS = {"elapsed_s": "#b0b0b0", "dram_weights_s": "#ef553b",
                  "dram_kv_cache_s": "#00cc96", "dram_activations_s": "#ab63fa",
                  "dram_host_io_s": "#ffa15a", "compute_s": "#19d3f3",
                  "host_link_s": "#ff6692", "runtime_overhead_s": "#b6e880",
                  "program_launch_s": "#fecb52", "dispatch_s": "#8c564b",
                  "barrier_sync_s": "#7f7f7f"}
_CRITICAL_ROW = {"dram": "DRAM", "compute": "compute", "host_link": "host link",
                 "runtime_overhead": "runtime", "program_launch": "fixed",
                 "dispatch": "fixed", "barrier_sync": "fixed"}


def _phase_name(phase: str, row: PhaseTime) -> str:
    if phase == "decode_per_token":
        return "decode, per token"
    if phase == "decode":
        return f"decode, all {row.calls} steps"
    return phase.replace("_", " ") + (f" ({row.calls} calls)" if row.calls > 1 else "")


#: Colours of the critical path's groups (traces.critical.GROUPS).
_PATH_COLORS = dict(zip(GROUPS, ("#08519c", "#4292c6", "#e6550d", "#fd8d3c", "#756bb1",
                                 "#31a354", "#969696", "#bcbd22", "#d9d9d9"),
                            strict=True))


def _path_rows(metrics: RunMetrics, recorder: Recorder) -> dict[str, dict[str, float]]:
    """Seconds of the critical path per group in each breakdown phase (decode per token:
    the decode phase's over its calls)."""
    calls = metrics.calls
    if not calls:
        return {}
    path = path_columns(recorder.spans)
    if not len(path):
        return {}
    windows = [(c.phase, round(c.start_s * PS_PER_S), round(c.end_s * PS_PER_S))
               for c in calls]
    rows = {p: {g: ps / PS_PER_S for g, ps in r.items()}
            for p, r in time_by_group(path, windows).items()}
    n = sum(1 for c in calls if c.phase == "decode")
    if "decode" in rows and n:
        rows["decode_per_token"] = {g: v / n for g, v in rows["decode"].items()}
    return rows


def _demand_bar(tb: Mapping[str, PhaseTime], phases: list[str], key: str, row: str,
                name: str) -> go.Bar:
    return go.Bar(
        name=name, orientation="h", y=[[_phase_name(p, tb[p]) for p in phases],
                                       [row] * len(phases)],
        x=[getattr(tb[p], key) * 1e3 for p in phases],
        marker={"color": _DEMAND_COLORS.get(key)},
        legendgroup="demand", legendgrouptitle_text="what each resource needed",
        hovertemplate=f"{name}<br>%{{x:,.3f}} ms<extra></extra>")


def run_breakdown(metrics: RunMetrics, recorder: Recorder) -> go.Figure | None:
    """The run report's chart: per phase, the elapsed time, the critical path by group and
    each resource's demand (``time_breakdown``), the largest demand marked."""
    tb = metrics.time_breakdown
    phases = [p for p in tb if p != "decode"]  # per token reads better than the sum
    if not phases:
        return None
    path = _path_rows(metrics, recorder)
    rows = ["elapsed", "critical path", "DRAM", "compute", "host link", "runtime", "fixed"]
    if not path:
        rows.remove("critical path")
    fig = go.Figure()
    for key, row, name in _DEMANDS[:1]:
        fig.add_trace(_demand_bar(tb, phases, key, row, name))
    for group in GROUPS:  # the rows appear in the order of their first bar
        have = [p for p in phases if group in path.get(p, {})]
        if not have:
            continue
        fig.add_trace(go.Bar(
            name=group, orientation="h",
            y=[[_phase_name(p, tb[p]) for p in have], ["critical path"] * len(have)],
            x=[path[p][group] * 1e3 for p in have], marker={"color": _PATH_COLORS[group]},
            legendgroup="path", legendgrouptitle_text="on the critical path",
            hovertemplate=f"critical path: {group}<br>%{{x:,.3f}} ms<extra></extra>"))
    for key, row, name in _DEMANDS[1:]:
        fig.add_trace(_demand_bar(tb, phases, key, row, name))
    for p in phases:  # each row's total at its end; the largest demand marked
        big = _CRITICAL_ROW[tb[p].critical]
        for row in rows:
            if row == "critical path":
                total = sum(path.get(p, {}).values()) * 1e3
            else:
                total = sum(getattr(tb[p], k) for k, r, _ in _DEMANDS if r == row) * 1e3
            mark = " ◀ largest demand" if row == big else ""
            shown = f"{total:,.2f}" if total >= 1 else f"{total:.3g}"  # 3 digits below 1 ms
            fig.add_annotation(x=total, y=[_phase_name(p, tb[p]), row],
                               text=f" {shown} ms{mark}", showarrow=False,
                               xanchor="left", font={"size": 10, "color": "#333"})
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed", categoryorder="array",
                     categoryarray=rows)
    fig = layout(fig, "Where the time went, per phase: the critical path (the chain of "
                      "work that ends the phase) and what each resource needed",
                 "time (ms)", "", height=120 + 26 * len(rows) * len(phases))
    fig.update_layout(legend={"orientation": "v", "y": 1, "yanchor": "top", "x": 1.01,
                              "xanchor": "left", "traceorder": "grouped"},
                      margin={"l": 190, "r": 260, "t": 50})
    return fig


#: (key in a phase of ``time_breakdown``, legend name), in stacking order.
DEMANDS = (
    ("dram_weights_s", "DRAM: weight streaming"),
    ("dram_kv_cache_s", "DRAM: KV-cache reads + writes"),
    ("dram_activations_s", "DRAM: activations"),
    ("dram_host_io_s", "DRAM: host I/O buffers"),
    ("compute_s", "compute (busiest core, MXU + VPU)"),
    ("host_link_s", "host link (both directions)"),
    ("runtime_overhead_s", "runtime overhead (per call)"),
    ("program_launch_s", "fixed: program launch"),
    ("dispatch_s", "fixed: instruction dispatch"),
    ("barrier_sync_s", "fixed: cross-core barriers"),
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


__all__ = ["DEMANDS", "SWEEP_PHASES", "run_breakdown", "serving_breakdown",
           "sweep_breakdowns"]
