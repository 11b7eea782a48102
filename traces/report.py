"""The HTML report of a run: self-contained (plotly.js embedded, works offline).

Figures: a timeline of every engine (Gantt), bandwidth over time per DRAM channel and per
host-link direction, traffic by kind and by link, engine utilization, and, when the run
has them, the cost of each cache operation.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from .chrome import _block_key, bandwidth_series
from .recorder import Recorder

PS_PER_US = 1e6
#: Most bars drawn in the timeline; longer runs are merged per lane (see ``_timeline``).
MAX_TIMELINE_BARS = 20_000

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}}
h1{{font-size:1.4em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left}}
.fig{{margin:1em 0}}</style></head>
<body><h1>{title}</h1>{summary}{figures}</body></html>
"""


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=title, xaxis_title=x, yaxis_title=y, height=height, template="plotly_white",
        margin={"l": 90, "r": 20, "t": 50, "b": 50},
    )
    return fig


def _timeline(recorder: Recorder) -> go.Figure | None:
    spans = [s for s in recorder.spans if not s.name.endswith("chunk")
             and s.block != "dram"]
    if not spans:
        return None
    lanes = sorted({(s.block, s.lane) for s in spans}, key=lambda bl: (_block_key(bl[0]), bl[1]))
    label = {bl: f"{bl[0]}.{bl[1]}" for bl in lanes}
    if len(spans) > MAX_TIMELINE_BARS:
        # merge consecutive spans of a lane whose gap is below the bin width
        width = (max(s.end_ps for s in spans) - min(s.start_ps for s in spans)) / (
            MAX_TIMELINE_BARS / max(1, len(lanes))
        )
        merged: dict[tuple[str, str], list[list]] = defaultdict(list)
        for s in sorted(spans, key=lambda s: (s.block, s.lane, s.start_ps)):
            rows = merged[(s.block, s.lane)]
            if rows and s.start_ps - rows[-1][1] <= width:
                rows[-1][1] = max(rows[-1][1], s.end_ps)
                rows[-1][3] += 1
            else:
                rows.append([s.start_ps, s.end_ps, s.name, 1])
        items = [(bl, a, b, f"{n} ops" if k > 1 else n) for bl, rows in merged.items()
                 for a, b, n, k in rows]
    else:
        items = [((s.block, s.lane), s.start_ps, s.end_ps, s.name) for s in spans]
    by_name: dict[str, list] = defaultdict(list)
    for bl, a, b, name in items:
        by_name[name.split()[0] if " ops" not in str(name) else "merged"].append(
            (label[bl], a / PS_PER_US, (b - a) / PS_PER_US, name)
        )
    fig = go.Figure()
    for name in sorted(by_name):
        rows = by_name[name]
        fig.add_trace(go.Bar(
            name=name, orientation="h", y=[r[0] for r in rows], x=[max(r[2], 1e-6) for r in rows],
            base=[r[1] for r in rows], text=[r[3] for r in rows],
            hovertemplate="%{y}<br>%{text}<br>start %{base:.3f} µs<br>%{x:.3f} µs<extra></extra>",
        ))
    fig.update_yaxes(categoryorder="array", categoryarray=[label[bl] for bl in reversed(lanes)])
    fig.update_layout(barmode="overlay")
    return _layout(fig, "Timeline of every engine", "simulated time (µs)", "engine",
                   height=max(300, 22 * len(lanes) + 120))


def _bandwidth(recorder: Recorder, bins: int) -> go.Figure | None:
    series = bandwidth_series(recorder, bins=bins)
    if not series:
        return None
    fig = go.Figure()
    for (block, lane), (t, bps) in sorted(series.items(), key=lambda kv: (_block_key(kv[0][0]),
                                                                          kv[0][1])):
        fig.add_trace(go.Scatter(x=t / PS_PER_US, y=bps / 1e9, name=f"{block} {lane}",
                                 mode="lines", line={"shape": "hv"}))
    return _layout(fig, "Bandwidth over time per DRAM channel and host-link direction",
                   "simulated time (µs)", "bandwidth (GB/s)")


def _traffic(metrics: dict[str, Any]) -> go.Figure | None:
    by_kind = metrics.get("traffic_by_kind") or {}
    by_link = metrics.get("traffic_bytes") or {}
    if not by_kind and not by_link:
        return None
    fig = go.Figure()
    fig.add_trace(go.Bar(name="by kind", x=list(by_kind), y=[v / 1e6 for v in by_kind.values()]))
    fig.add_trace(go.Bar(name="by link", x=list(by_link), y=[v / 1e6 for v in by_link.values()]))
    return _layout(fig, "Traffic by kind and by link", "kind / link", "bytes moved (MB)")


def _utilization(metrics: dict[str, Any]) -> go.Figure | None:
    util = metrics.get("engine_utilization") or {}
    if not util:
        return None
    fig = go.Figure(go.Bar(x=list(util), y=[100 * v for v in util.values()]))
    return _layout(fig, "Engine utilization", "engine", "busy (% of simulated time)")


def _cache_ops(metrics: dict[str, Any]) -> go.Figure | None:
    ops = metrics.get("cache_ops") or []
    if not ops:
        return None
    labels = [f"{i}: {o['op']}" for i, o in enumerate(ops)]
    fig = go.Figure(go.Bar(x=labels, y=[o["time_s"] * 1e3 for o in ops],
                           customdata=[[o.get("pcie_bytes", 0), o.get("dram_bytes", 0)]
                                       for o in ops],
                           hovertemplate="%{x}<br>%{y:.3f} ms<br>PCIe %{customdata[0]} B"
                                         "<br>DRAM %{customdata[1]} B<extra></extra>"))
    return _layout(fig, "Cost of each cache operation", "operation", "time (ms)")


def _summary_table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                    for k, v in rows)
    return f"<table>{cells}</table>"


def render_page(title: str, summary: list[tuple[str, str]], figures: list[go.Figure]) -> str:
    """A self-contained page: plotly.js is embedded once, with the first figure."""
    parts = []
    for i, fig in enumerate(figures):
        parts.append('<div class="fig">' + pio.to_html(
            fig, full_html=False, include_plotlyjs=(i == 0), div_id=f"fig{i}",
            config={"displaylogo": False},
        ) + "</div>")
    return _PAGE.format(title=html.escape(title), summary=_summary_table(summary),
                        figures="".join(parts))


def run_report(metrics: dict[str, Any], recorder: Recorder, *, bins: int = 200) -> str:
    """The report of one run as an HTML string."""
    figs = [f for f in (
        _timeline(recorder),
        _bandwidth(recorder, bins),
        _traffic(metrics),
        _utilization(metrics),
        _cache_ops(metrics),
    ) if f is not None]
    summary = [
        ("scenario", str(metrics.get("scenario", ""))),
        ("simulated time", f"{metrics.get('sim_time_s', 0) * 1e6:,.3f} µs"),
    ]
    if "roofline" in metrics:
        summary.append(("roofline bound", f"{metrics['roofline']['bound_s'] * 1e6:,.3f} µs"))
    if recorder.dropped:
        summary.append(("trace events dropped", f"{recorder.dropped:,} (event limit reached)"))
    return render_page(f"kvsim report: {metrics.get('scenario', 'run')}", summary, figs)
