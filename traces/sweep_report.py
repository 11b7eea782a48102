"""The HTML report of a sweep: one chart per metric, the swept numeric axis along x (a
log axis where it spans a factor of 8 or more) and every combination of the other axes
(formats, bit configs, ...) as a series on that chart; where the time went per point
(:mod:`traces.breakdown_chart`); then the table of results.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.graph_objects as go

from .breakdown_chart import sweep_breakdowns
from .page import Card, Figure, fmt_number, is_number, layout, render_page

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

_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star")
_DASHES = ("solid", "dash", "dot", "dashdot")
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


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if is_number(v):
        return fmt_number(v)
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True)
    return str(v)


def x_axis(axes: dict[str, list[Any]]) -> str:
    """The axis drawn along x: the numeric axis with the most values, else the axis with
    the most values (the others become series)."""
    numeric = [a for a, v in axes.items() if all(is_number(x) for x in v)]
    pool = numeric or list(axes)
    return max(pool, key=lambda a: len(axes[a]))


def _sweep_figure(metric: str, axis: str, axes: dict[str, list[Any]],
                  rows: list[dict[str, Any]]) -> go.Figure | None:
    ok = [r for r in rows if r["status"] == "ok" and is_number(r.get(metric))]
    if not ok:
        return None
    ylabel, scale = quantity(metric, [r[metric] for r in ok])
    values = axes[axis]
    numeric = all(is_number(v) for v in values)
    others = [a for a in axes if a != axis]
    # series keyed by the other axes' value indices (values may be unhashable tables)
    lines: dict[tuple[int, ...], list[float | None]] = {}
    for r in rows:
        key = tuple(axes[a].index(r[a]) for a in others)
        y = r.get(metric)
        ys = lines.setdefault(key, [None] * len(values))
        ys[values.index(r[axis])] = y / scale if r["status"] == "ok" and is_number(y) else None
    fig = go.Figure()
    xs = values if numeric else [_fmt(v) for v in values]
    for n, (key, ys) in enumerate(lines.items()):
        name = ", ".join(f"{NAMES.get(a, a)} {_fmt(axes[a][i])}"
                         for a, i in zip(others, key, strict=True))
        # a marker shape and dash per series: series that coincide stay visible
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=name or NAMES.get(metric, metric),
            marker={"symbol": _SYMBOLS[n % len(_SYMBOLS)], "size": 9},
            line={"dash": _DASHES[n % len(_DASHES)]},
            hovertemplate=f"{html.escape(name)}<br>%{{x}}: %{{y:,.4~r}}<extra></extra>"))
    xlabel, _ = quantity(axis, [v for v in values if is_number(v)])
    if not numeric:
        xlabel = NAMES.get(axis, axis)
    fig.update_layout(showlegend=bool(others))
    if numeric:
        log = min(values) > 0 and max(values) / min(values) >= 8
        fig.update_xaxes(type="log" if log else "linear", tickvals=values,
                         ticktext=[f"{v:,}" for v in values])
    else:
        fig.update_xaxes(type="category")
    fig.update_yaxes(rangemode="tozero")
    return layout(fig, f"{ylabel.rsplit(' (', 1)[0]} vs {xlabel.rsplit(' (', 1)[0]}", xlabel,
                  ylabel)


def _scaled(v: Any, unit: tuple[str, float] | None) -> Any:
    return v / unit[1] if unit is not None and is_number(v) else v


def _results_table(axes: dict[str, list[Any]], rows: list[dict[str, Any]],
                   metrics: list[str]) -> str:
    cols = ["index", *axes, "status", *metrics]
    units = {m: quantity(m, [r[m] for r in rows if is_number(r.get(m))]) for m in metrics}
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


#: A series "pays" against the first one where its headline metric is at least this much
#: better (a fraction of the first's value), at that point and at every larger one: a
#: difference under 1 % is within what a reader of a latency table calls the same (an
#: assumption; the README reads the kv-bits sweep with it).
PAYS_BY = 0.01
#: Metric name endings for which more is better (for the rest, less is: times, bytes).
MORE_IS_BETTER = ("tokens_per_s", "requests_per_s", "capacity_tokens", "compression_vs_bf16",
                  "top1_agreement")


def _gain(metric: str, base: float, v: float) -> float:
    """How much better ``v`` is than ``base``, as a fraction of ``base``."""
    if not base:
        return 0.0
    sign = 1 if metric.endswith(MORE_IS_BETTER) else -1
    return sign * (v - base) / abs(base)


def _series_name(axes: dict[str, list[Any]], names: list[str], key: tuple[int, ...]) -> str:
    return ", ".join(_fmt(axes[a][i]) for a, i in zip(names, key, strict=True))


def _conclusion_cards(metric: str, axes: dict[str, list[Any]],
                      rows: list[dict[str, Any]]) -> list[Card]:
    """The sweep's conclusion on ``metric``, one card per series against the first series
    (the first value of each axis but the x axis): from which x value on it pays (at least
    :data:`PAYS_BY` better there and at every larger x), or, without a numeric axis, how
    much better or worse it is. Empty when there is nothing to compare."""
    ok = {tuple(axes[a].index(r[a]) for a in axes): r[metric] for r in rows
          if r["status"] == "ok" and is_number(r.get(metric))}
    if not ok or not axes:
        return []
    axis = x_axis(axes)
    numeric = all(is_number(v) for v in axes[axis])
    names = [a for a in axes if a != axis] if numeric else list(axes)
    if not names:
        return []
    label, scale = quantity(metric, list(ok.values()))
    what, _, unit = label.partition(" (")
    unit = unit.rstrip(")")
    words = ("higher", "lower") if metric.endswith(MORE_IS_BETTER) else ("lower", "higher")
    pos = list(axes).index(axis)

    def value(key: tuple[int, ...], x: int | None) -> float | None:
        full = key if x is None else (*key[:pos], x, *key[pos:])
        return ok.get(full)

    keys = sorted({tuple(k[i] for i, a in enumerate(axes) if a in names) for k in ok})
    base = keys[0]
    cards = []
    for key in keys[1:]:
        title = f"{_series_name(axes, names, key)} vs {_series_name(axes, names, base)}"
        if not numeric:
            b, v = value(base, None), value(key, None)
            if b is None or v is None:
                continue
            g = _gain(metric, b, v)
            text = f"{abs(g):.1%} {words[0] if g >= 0 else words[1]} {what}".replace("%", " %")
            cards.append(Card(title, text, note=f"{fmt_number(v / scale)} {unit} against "
                                                f"{fmt_number(b / scale)} {unit}".strip(),
                              metric=metric))
            continue
        xs = [(i, _gain(metric, b, v)) for i in range(len(axes[axis]))
              if (b := value(base, i)) is not None and (v := value(key, i)) is not None]
        if not xs:
            continue
        start = None
        for i, g in reversed(xs):  # the smallest x from which every larger one pays
            if g < PAYS_BY:
                break
            start = i
        xunit = "tokens" if axis.endswith("tokens") else NAMES.get(axis, axis)
        last_i, last_g = xs[-1]
        last = f"{_fmt(axes[axis][last_i])} {xunit}"
        if start is None:
            text = f"does not pay up to {last}"
        else:
            text = f"pays from {_fmt(axes[axis][start])} {xunit}"
        change = f"{abs(last_g):.1%} {words[0] if last_g >= 0 else words[1]}".replace("%", " %")
        cards.append(Card(title, text, metric=metric, note=(
            f"{what} at least {PAYS_BY:.0%} {words[0]} from there on; " if start is not None
            else f"{what} not at least {PAYS_BY:.0%} {words[0]} from any point on; ").replace(
                "%", " %") + f"{change} at {last}"))
    return cards


def _range_card(metric: str, axes: dict[str, list[Any]], rows: list[dict[str, Any]]) -> Card:
    ok = [r for r in rows if r["status"] == "ok" and is_number(r.get(metric))]
    vals = [r[metric] for r in ok]
    low = min(ok, key=lambda r: r[metric])
    where = ", ".join(f"{NAMES.get(a, a)} {_fmt(low[a])}" for a in axes)
    label, scale = quantity(metric, vals)
    name, _, unit = label.partition(" (")
    unit = unit.rstrip(")")
    lo, hi = min(vals) / scale, max(vals) / scale
    text = (f"{fmt_number(lo)} {unit}" if lo == hi
            else f"{fmt_number(lo)} – {fmt_number(hi)} {unit}").strip()
    note = f"lowest at {where}" if lo != hi and where else f"over {len(vals)} points"
    return Card(name, text, note=note, metric=metric)


def sweep_report(title: str, axes: dict[str, list[Any]], rows: list[dict[str, Any]],
                 metrics: list[str]) -> str:
    """The report of a sweep as an HTML string: one chart per metric (see the module
    docstring), then the table of results."""
    shown = [m for m in metrics if any(is_number(r.get(m)) for r in rows)]
    axis = x_axis(axes) if axes else ""
    figs = [Figure(f) for m in shown if (f := _sweep_figure(m, axis, axes, rows))]
    figs += [Figure(f, wide=True) for f in sweep_breakdowns(rows, lambda r: ", ".join(
        f"{NAMES.get(a, a)} {_fmt(r.get(a))}" for a in axes))]
    failed = sum(r["status"] != "ok" for r in rows)
    cards = [Card("points", f"{len(rows) - failed} of {len(rows)}",
                  note=f"{failed} failed" if failed else "all ran")]
    ranges = [_range_card(m, axes, rows) for m in shown
              if any(r["status"] == "ok" and is_number(r.get(m)) for r in rows)]
    # the conclusion first: where each series pays against the first, on the first metric
    conclusion = _conclusion_cards(shown[0], axes, rows) if shown else []
    cards += conclusion or ranges[:1]
    details = [("axes", "; ".join(f"{NAMES.get(a, a)} = {', '.join(map(_fmt, v))}"
                                  for a, v in axes.items()))]
    details += [(f"range of {c.label}", f"{c.text} ({c.note})") for c in ranges]
    missing = [m for m in metrics if m not in shown]
    if missing:
        details.append(("metrics without values", ", ".join(missing)))
    shape = " × ".join(f"{len(v)} {NAMES.get(a, a)}" for a, v in axes.items())
    subtitle = f"{len(rows)} points ({shape}); simulated times" if axes else ""
    return render_page(title, subtitle=subtitle, cards=cards, details=details, figures=figs,
                       after=_results_table(axes, rows, shown))
