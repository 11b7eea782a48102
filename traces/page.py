"""The page every report shares: headline figures first (large, each beside its bound),
a table of details, then the charts; self-contained (plotly.js embedded once, so the
page works offline). Also the units and number formats the reports and the CLI share.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em 2em;color:#222;max-width:1500px}
h1{font-size:1.35em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .3em}
.sub{color:#555;margin:0 0 1em}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:0 0 1em}
.card{border:1px solid #d5d9e0;border-radius:8px;padding:10px 14px;min-width:170px;
 background:#f8fafc}
.card .label{font-size:.85em;color:#555}
.card .value{font-size:1.7em;font-weight:600;margin:.1em 0}
.card .note{font-size:.8em;color:#666}
table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
details{margin:.5em 0 1em} summary{cursor:pointer;color:#345}
/* auto-fill, not auto-fit: a chart drawn while alone in its grid keeps one column */
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(620px,1fr));gap:0 16px}
.fig{margin:.4em 0;min-width:0}
.wide{grid-column:1/-1}
.texts td{white-space:pre-wrap;font-family:ui-monospace,monospace}
"""


@dataclass(frozen=True)
class Card:
    """A headline figure: ``value`` is shown as ``text``; ``metric`` names where it comes
    from in metrics.json (kept on the page as ``data-metric`` / ``data-value``)."""

    label: str
    text: str
    note: str = ""
    metric: str = ""
    value: float | None = None


@dataclass(frozen=True)
class Figure:
    """A chart of the page; ``wide`` ones take the full width, others share a row."""

    fig: go.Figure
    wide: bool = False


def layout(fig: go.Figure, title: str, x: str, y: str, height: int = 400) -> go.Figure:
    """The house look: a title, one unit per axis (in its title), no SI suffixes on
    numbers ("50k"), the legend above the plot so it never covers data."""
    fig.update_layout(
        title={"text": title, "x": 0, "xanchor": "left"}, xaxis_title=x, yaxis_title=y,
        height=height, template="plotly_white",
        margin={"l": 80, "r": 20, "t": 80, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0, "xanchor": "left"},
        hoverlabel={"namelength": -1},
    )
    fig.update_xaxes(exponentformat="none", separatethousands=True)
    fig.update_yaxes(exponentformat="none", separatethousands=True)
    return fig


def _cards(cards: list[Card]) -> str:
    out = []
    for c in cards:
        data = ""
        if c.metric:
            data = f' data-metric="{html.escape(c.metric)}"'
            if c.value is not None:
                data += f' data-value="{c.value!r}"'
        note = f'<div class="note">{html.escape(c.note)}</div>' if c.note else ""
        out.append(f'<div class="card"{data}><div class="label">{html.escape(c.label)}</div>'
                   f'<div class="value">{html.escape(c.text)}</div>{note}</div>')
    return f'<div class="cards">{"".join(out)}</div>'


def table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                    for k, v in rows)
    return f"<table>{cells}</table>"


def render_page(title: str, *, subtitle: str = "", cards: list[Card] | None = None,
                details: list[tuple[str, str]] | None = None,
                figures: list[Figure | go.Figure] | None = None, after: str = "",
                before: str = "") -> str:
    """A self-contained page: plotly.js is embedded once, with the first figure; figures
    get ids ``fig0``, ``fig1``, ...; ``before`` is HTML placed after the cards (before the
    details and the figures), ``after`` HTML placed after the figures."""
    parts = []
    for i, f in enumerate(figures or []):
        f = f if isinstance(f, Figure) else Figure(f, wide=True)
        div = pio.to_html(f.fig, full_html=False, include_plotlyjs=(i == 0), div_id=f"fig{i}",
                          config={"displaylogo": False, "responsive": True})
        parts.append(f'<div class="fig{" wide" if f.wide else ""}">{div}</div>')
    body = [f"<h1>{html.escape(title)}</h1>"]
    if subtitle:
        body.append(f'<p class="sub">{html.escape(subtitle)}</p>')
    if cards:
        body.append(_cards(cards))
    if before:
        body.append(before)
    if details:
        body.append(f"<details><summary>details</summary>{table(details)}</details>")
    body.append(f'<div class="grid">{"".join(parts)}</div>{after}')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


# --- units and numbers ------------------------------------------------------------------

_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_BYTE_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "bytes"))


def fmt_number(v: float) -> str:
    """A figure for a table: 4 significant digits, thousands separated, no exponent above
    1,000."""
    if isinstance(v, int) or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def time_unit(seconds: float) -> tuple[str, float]:
    """``(unit, seconds per unit)`` that shows ``seconds`` with 1 to 3 integer digits."""
    return next(((u, s) for s, u in _TIME_UNITS if abs(seconds) >= s), ("ns", 1e-9))


def fmt_time(seconds: float, unit: str | None = None) -> str:
    """``seconds`` as e.g. ``106.67 ms`` (in ``unit`` if given: s, ms, µs, ns)."""
    scale = dict((u, s) for s, u in _TIME_UNITS)
    u = unit or time_unit(seconds)[0]
    return f"{seconds / scale[u]:,.2f} {u}"


def byte_unit(n: float) -> tuple[str, float]:
    """``(unit, bytes per unit)`` that shows ``n`` bytes with 1 to 3 integer digits."""
    return next(((u, s) for s, u in _BYTE_UNITS if abs(n) >= s), ("bytes", 1.0))


def fmt_bytes(n: float) -> str:
    """``n`` bytes as e.g. ``6.48 GB`` (decimal units), or ``512 bytes``."""
    scale, unit = next(((s, u) for s, u in _BYTE_UNITS if abs(n) >= s), _BYTE_UNITS[-1])
    return f"{n:,.0f} bytes" if unit == "bytes" else f"{n / scale:,.2f} {unit}"


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
