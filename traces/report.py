"""The HTML reports of a run and of a sweep: self-contained (plotly.js embedded, works
offline).

Run: a timeline of every engine (Gantt), bandwidth over time per DRAM channel and per
host-link direction, traffic by kind and by link, engine utilization, and, when the run
has them, the cost of each cache operation. Sweep: each chosen metric against each axis,
and the table of results.
"""

from __future__ import annotations

import html
import json
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
<body><h1>{title}</h1>{summary}{figures}{after}</body></html>
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
    labels = [f"{i}: {o['op']}" + (f" at token {o['at_token']}" if "at_token" in o else "")
              for i, o in enumerate(ops)]
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


def render_page(title: str, summary: list[tuple[str, str]], figures: list[go.Figure], *,
                after: str = "") -> str:
    """A self-contained page: plotly.js is embedded once, with the first figure; ``after``
    is HTML placed after the figures."""
    parts = []
    for i, fig in enumerate(figures):
        parts.append('<div class="fig">' + pio.to_html(
            fig, full_html=False, include_plotlyjs=(i == 0), div_id=f"fig{i}",
            config={"displaylogo": False},
        ) + "</div>")
    return _PAGE.format(title=html.escape(title), summary=_summary_table(summary),
                        figures="".join(parts), after=after)


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


# --- sweeps -----------------------------------------------------------------------------------

#: Readable names of common metrics and config fields (others: the path, spelled out).
NAMES = {
    "prefill.ttft_s": "time to first token",
    "decode.time_per_token_s": "decode time per token",
    "decode.tokens_per_s": "decode throughput",
    "kv_cache.bytes_per_token": "KV cache per token",
    "kv_cache.capacity_tokens": "KV capacity",
    "kv_cache.compression_vs_bf16": "KV compression vs bf16",
    "traffic_by_kind.kv_cache": "KV-cache traffic",
    "traffic_by_kind.weights": "weight traffic",
    "launch.time_s": "launch time",
    "compiled.dram_bytes": "DRAM footprint",
    "compiled.weight_bytes": "weights in DRAM",
    "sim_time_s": "simulated time",
    "kv.format": "KV format",
    "bits.preset": "weight bits",
    "workload.prompt_tokens": "prompt tokens",
    "workload.output_tokens": "output tokens",
    "hardware.preset": "hardware",
    "model.preset": "model",
}

_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_BYTE_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "bytes"))


def _spelled(path: str) -> str:
    return path.replace(".", " ").replace("_", " ")


def quantity(name: str, values: list[float]) -> tuple[str, float]:
    """``(label with unit, scale)`` of a metric or config field: values are divided by
    ``scale``; the unit is chosen from the name's suffix and the values' magnitude."""
    top = max((abs(v) for v in values), default=0.0)
    leaf = name.rsplit(".", 1)[-1]
    base = NAMES.get(name)
    if leaf.endswith("bytes_per_s"):
        return f"{base or _spelled(name.removesuffix('_bytes_per_s'))} (GB/s)", 1e9
    if leaf.endswith("tokens_per_s"):
        return f"{base or _spelled(name.removesuffix('_tokens_per_s'))} (tokens/s)", 1.0
    if leaf.endswith("_s") or leaf == "s":
        scale, unit = next(((s, u) for s, u in _TIME_UNITS if top >= s), _TIME_UNITS[-1])
        return f"{base or _spelled(name.removesuffix('_s'))} ({unit})", scale
    if leaf.endswith("bytes_per_token"):
        return f"{base or _spelled(name)} (bytes/token)", 1.0
    if "bytes" in leaf or name.startswith(("traffic_bytes.", "traffic_by_kind.")):
        scale, unit = next(((s, u) for s, u in _BYTE_UNITS if top >= s), _BYTE_UNITS[-1])
        return f"{base or _spelled(name.removesuffix('_bytes'))} ({unit})", scale
    if leaf.endswith("tokens"):
        label = base or _spelled(name.removesuffix("_tokens"))
        return (label if label.endswith("tokens") else f"{label} (tokens)"), 1.0
    if leaf.startswith("compression"):
        return f"{base or _spelled(name)} (×)", 1.0
    if name.startswith("engine_utilization."):
        return f"{_spelled(name)} (%)", 0.01
    return base or _spelled(name), 1.0


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _sweep_figure(metric: str, axis: str, axes: dict[str, list[Any]],
                  rows: list[dict[str, Any]]) -> go.Figure | None:
    ok = [r for r in rows if r["status"] == "ok" and _number(r.get(metric))]
    if not ok:
        return None
    ylabel, scale = quantity(metric, [r[metric] for r in ok])
    values = axes[axis]
    numeric = all(_number(v) for v in values)
    others = [a for a in axes if a != axis]
    # lines keyed by the other axes' value indices (values may be unhashable tables)
    lines: dict[tuple[int, ...], list[float | None]] = {}
    for r in rows:
        key = tuple(axes[a].index(r[a]) for a in others)
        y = r.get(metric)
        ys = lines.setdefault(key, [None] * len(values))
        ys[values.index(r[axis])] = y / scale if r["status"] == "ok" and _number(y) else None
    fig = go.Figure()
    xs = values if numeric else [_fmt(v) for v in values]
    for key, ys in lines.items():
        name = ", ".join(f"{NAMES.get(a, a)}={_fmt(axes[a][i])}"
                         for a, i in zip(others, key, strict=True))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers",
                                 name=name or NAMES.get(metric, metric)))
    xlabel, _ = quantity(axis, [v for v in values if _number(v)])
    if not numeric:
        xlabel = NAMES.get(axis, axis)
    fig.update_layout(showlegend=bool(others))
    if numeric:
        # ticks at the swept values; a log axis where they span a factor of 8 or more
        log = min(values) > 0 and max(values) / min(values) >= 8
        fig.update_xaxes(type="log" if log else "linear", tickvals=values,
                         ticktext=[f"{v:,}" for v in values])
    else:
        fig.update_xaxes(type="category")
    return _layout(fig, f"{ylabel.rsplit(' (', 1)[0]} vs {xlabel.rsplit(' (', 1)[0]}", xlabel,
                   ylabel)


def fmt_number(v: float) -> str:
    """A figure for a table: 4 significant digits, thousands separated, no exponent above
    1,000."""
    if isinstance(v, int) or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if _number(v):
        return fmt_number(v)
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _scaled(v: Any, unit: tuple[str, float] | None) -> Any:
    return v / unit[1] if unit is not None and _number(v) else v


def _results_table(axes: dict[str, list[Any]], rows: list[dict[str, Any]],
                   metrics: list[str]) -> str:
    cols = ["index", *axes, "status", *metrics]
    units = {m: quantity(m, [r[m] for r in rows if _number(r.get(m))]) for m in metrics}
    head = "".join(f"<th>{html.escape(units[c][0] if c in units else NAMES.get(c, c))}</th>"
                   for c in cols)
    body = []
    for r in rows:
        cells = "".join(f"<td>{html.escape(_fmt(_scaled(r.get(c), units.get(c))))}</td>"
                        for c in cols)
        body.append(f"<tr>{cells}</tr>")
        if r["status"] != "ok":
            body.append(f'<tr><td></td><td colspan="{len(cols) - 1}">error: '
                        f"{html.escape(r['error'])}</td></tr>")
    return f"<h2>Results</h2><table><tr>{head}</tr>{''.join(body)}</table>"


def sweep_report(title: str, axes: dict[str, list[Any]], rows: list[dict[str, Any]],
                 metrics: list[str]) -> str:
    """The report of a sweep as an HTML string: each metric against each axis (the other
    axes' combinations as separate lines), then the table of results."""
    shown = [m for m in metrics if any(_number(r.get(m)) for r in rows)]
    figs = [f for m in shown for a in axes if (f := _sweep_figure(m, a, axes, rows))]
    failed = sum(r["status"] != "ok" for r in rows)
    summary = [
        ("points", f"{len(rows)} ({failed} failed)" if failed else str(len(rows))),
        ("axes", "; ".join(f"{a} = {', '.join(map(str, v))}" for a, v in axes.items())),
    ]
    missing = [m for m in metrics if m not in shown]
    if missing:
        summary.append(("metrics without values", ", ".join(missing)))
    return render_page(title, summary, figs, after=_results_table(axes, rows, shown))
