"""The HTML report of a run, built around the questions a run answers, and (re-exported
from :mod:`traces.sweep_report`) the report of a sweep. Self-contained: plotly.js is
embedded, so the page works offline.

Run report, top to bottom: the headline figures (TTFT, time per output token, tokens/s,
each beside its roofline bound; KV bytes per token and capacity); where the time went per
phase; a timeline with a lane of runtime calls (phase and step labels) and a lane of
layers (the compiler's marks: instruction ranges per layer and token tile) above the
engines; a roofline chart of every program; total DRAM bandwidth with the channels
stacked; the host link per direction; KV-cache occupancy; traffic by kind and by link;
engine utilization; the cost of each cache operation. Every chart has one unit; every
time axis is in ms.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from itertools import compress
from operator import itemgetter

import numpy as np
import plotly.graph_objects as go

from .breakdown_chart import run_breakdown
from .chrome import _block_key, bandwidth_series
from .page import (
    Card,
    Figure,
    byte_unit,
    fmt_bytes,
    fmt_time,
    layout,
    render_page,
    table,
    time_unit,
)
from .recorder import Recorder, span_times
from .results import CallRow, GenerateMetrics, RooflineFigures, RunMetrics
from .speculation_chart import SPECULATION_COLORS, speculation_chart
from .sweep_report import NAMES, fmt_number, quantity, sweep_report

__all__ = ["NAMES", "RUN_CHARTS", "Chart", "fmt_number", "quantity", "run_report",
           "sweep_report"]

PS_PER_MS = 1e9
#: Most bars drawn in the timeline; longer runs are merged per lane (see ``_timeline``).
MAX_TIMELINE_BARS = 20_000
#: Most runtime calls labelled one by one in the timeline (more: phases only).
MAX_CALL_LABELS = 60
PHASE_COLORS = {"launch": "#7f7f7f", "prefill": "#1f77b4", "decode": "#2ca02c",
                "cache_op": "#d62728", **SPECULATION_COLORS}


def _call_label(c: CallRow, phase_calls: int) -> str:
    if c.phase == "launch":
        return "launch"
    if c.phase == "prefill":
        chunk = f" chunk {c.step + 1}/{phase_calls}" if phase_calls > 1 else ""
        return f"prefill{chunk} ({c.tokens} tokens)"
    if c.phase == "decode":
        return f"decode step {c.step}"
    if c.phase in ("draft", "verify", "tail_cut"):  # speculative decoding's rounds
        return f"{c.phase.replace('_', ' ')} {c.step} ({c.op})"
    return f"cache op {c.step}: {c.op}"


def _calls_lane(calls: Sequence[CallRow]) -> list[go.Bar]:
    counts: dict[str, int] = defaultdict(int)
    for c in calls:
        counts[c.phase] += 1
    by_phase: dict[str, list[CallRow]] = defaultdict(list)
    for c in calls:
        by_phase[c.phase].append(c)
    labelled = len(calls) <= MAX_CALL_LABELS
    bars = []
    for phase, cs in by_phase.items():
        names = [_call_label(c, counts[phase]) for c in cs]
        bars.append(go.Bar(
            name=phase, orientation="h", y=["runtime calls"] * len(cs),
            x=[c.time_s * 1e3 for c in cs], base=[c.start_s * 1e3 for c in cs],
            marker={"color": PHASE_COLORS.get(phase, "#9467bd"),
                    "line": {"color": "white", "width": 1}},
            text=names if labelled else None, textposition="inside",
            insidetextanchor="middle", textfont={"size": 11}, width=0.9, customdata=names,
            legendgroup="calls",
            legendgrouptitle_text="runtime calls",
            hovertemplate="%{customdata}<br>start %{base:,.3f} ms<br>%{x:,.3f} ms"
                          "<extra></extra>"))
    return bars


def _layers_lane(recorder: Recorder) -> list[go.Bar]:
    """The compiler's layer marks (``runtime``/``layers`` spans), even and odd layers in
    two shades so that the boundaries show; labelled where the label fits."""
    marks = [s for s in recorder.spans if s.block == "runtime" and s.lane == "layers"]
    marks = marks[:MAX_TIMELINE_BARS]
    bars = []
    for parity, color in ((0, "#9ecae1"), (1, "#6baed6")):
        rows = [s for s in marks if int(s.name.split()[-1]) % 2 == parity]
        if not rows:
            continue
        bars.append(go.Bar(
            name="layers" if parity == 0 else "layers (odd)", showlegend=parity == 0,
            orientation="h", y=["layers"] * len(rows),
            x=[max((r.end_ps - r.start_ps) / PS_PER_MS, 1e-9) for r in rows],
            base=[r.start_ps / PS_PER_MS for r in rows],
            marker={"color": color, "line": {"color": "white", "width": 0.5}},
            text=[r.name.split()[-1] for r in rows], textposition="inside",
            insidetextanchor="middle", textfont={"size": 10}, width=0.9,
            customdata=[r.name for r in rows], legendgroup="layers",
            legendgrouptitle_text="compiler marks",
            hovertemplate="%{customdata}<br>start %{base:,.4f} ms<br>%{x:,.4f} ms"
                          "<extra></extra>"))
    return bars


def _binned_lanes(spans: list, per_lane: int) -> dict[str, list[tuple]]:
    """A long run's lanes cut into ``per_lane`` equal bins: per bin, how busy the lane
    was (fraction), how many instructions started in it, and the instruction that took
    most of its time. Returns ``{instruction: [(lane, start ms, width ms, busy, count)]}``
    (empty bins left out)."""
    # columns one field at a time, each distinct name split once (a long run: millions)
    n = len(spans)
    block_lane = itemgetter(0, 1)
    lanes = sorted(set(map(block_lane, spans)))
    word = {m: m.split()[0] for m in set(map(itemgetter(2), spans))}
    names = sorted(set(word.values()))
    lane_id = {bl: i for i, bl in enumerate(lanes)}
    name_id = {m: names.index(w) for m, w in word.items()}
    start, end = span_times(spans)
    lane = np.fromiter(map(lane_id.__getitem__, map(block_lane, spans)), np.int64, n)
    name = np.fromiter(map(name_id.__getitem__, map(itemgetter(2), spans)), np.int64, n)
    t0 = int(start.min())
    width = max(1, -(-(int(end.max()) - t0) // per_lane))
    k0 = (start - t0) // width
    k1 = (np.maximum(end - 1, start) - t0) // width
    nbins = int(k1.max()) + 1
    busy = np.zeros((len(lanes), nbins, len(names)), np.int64)
    count = np.zeros((len(lanes), nbins), np.int64)
    np.add.at(count, (lane, k0), 1)
    one = k0 == k1  # nearly every span: its whole time in one bin
    np.add.at(busy, (lane[one], k0[one], name[one]), end[one] - start[one])
    for i in np.flatnonzero(~one):  # the few spans across bins, split at the edges
        for k in range(int(k0[i]), int(k1[i]) + 1):
            lo, hi = t0 + k * width, t0 + (k + 1) * width
            busy[lane[i], k, name[i]] += min(int(end[i]), hi) - max(int(start[i]), lo)
    total = busy.sum(axis=2)
    top = busy.argmax(axis=2)
    out: dict[str, list[tuple]] = defaultdict(list)
    for li, k in zip(*np.nonzero((total > 0) | (count > 0)), strict=True):
        out[names[top[li, k]]].append((lanes[li], (t0 + int(k) * width) / PS_PER_MS,
                                       width / PS_PER_MS, min(1.0, total[li, k] / width),
                                       int(count[li, k])))
    return out


def _timeline(recorder: Recorder, calls: Sequence[CallRow]) -> go.Figure | None:
    # the engines' work: not the chunks, DRAM bursts or runtime calls (decided once per
    # distinct name and block, the spans kept in C-level maps: a long run has millions)
    name_block = itemgetter(2, 0)
    shown = {(n, b): not n.endswith("chunk") and b not in ("dram", "runtime")
             for n, b in set(map(name_block, recorder.spans))}
    spans = list(compress(recorder.spans, map(shown.__getitem__,
                                              map(name_block, recorder.spans))))
    if not spans and not calls:
        return None
    lanes = sorted(set(map(itemgetter(0, 1), spans)),
                   key=lambda bl: (_block_key(bl[0]), bl[1]))
    label = {bl: f"{bl[0]} {bl[1]}" for bl in lanes}
    layers = _layers_lane(recorder)
    fig = go.Figure(_calls_lane(calls) + layers)
    if len(spans) > MAX_TIMELINE_BARS:
        bins = _binned_lanes(spans, max(1, MAX_TIMELINE_BARS // max(1, len(lanes))))
        for name in sorted(bins):
            rows = bins[name]
            fig.add_trace(go.Bar(
                name=name, orientation="h", y=[label[r[0]] for r in rows],
                x=[r[2] for r in rows], base=[r[1] for r in rows],
                marker={"opacity": [max(0.15, r[3]) for r in rows], "line": {"width": 0}},
                customdata=[[100 * r[3], r[4]] for r in rows], legendgroup="engines",
                legendgrouptitle_text="engine work (mostly)",
                hovertemplate="%{y}<br>from %{base:,.3f} ms for %{x:,.3f} ms<br>busy "
                              "%{customdata[0]:.0f} %, %{customdata[1]:,} instructions, "
                              f"mostly {name}<extra></extra>"))
    else:
        by_name: dict[str, list] = defaultdict(list)
        for sp in spans:
            by_name[sp.name.split()[0]].append(sp)
        for name in sorted(by_name):
            rows = by_name[name]
            fig.add_trace(go.Bar(
                name=name, orientation="h", y=[label[(r.block, r.lane)] for r in rows],
                x=[max((r.end_ps - r.start_ps) / PS_PER_MS, 1e-9) for r in rows],
                base=[r.start_ps / PS_PER_MS for r in rows],
                customdata=[r.name for r in rows], legendgroup="engines",
                legendgrouptitle_text="engine work",
                hovertemplate="%{y}<br>%{customdata}<br>start %{base:,.4f} ms<br>"
                              "%{x:,.4f} ms<extra></extra>"))
    order = ([label[bl] for bl in reversed(lanes)] + (["layers"] if layers else [])
             + (["runtime calls"] if calls else []))
    fig.update_yaxes(categoryorder="array", categoryarray=order)
    fig.update_layout(barmode="overlay", uniformtext={"minsize": 8, "mode": "hide"})
    title = ("Timeline: runtime calls (phase, step), layers and the work of every engine"
             if calls else "Timeline: the work of every engine")
    fig = layout(fig, title,
                 "simulated time (ms)", "", height=max(320, 20 * len(order) + 170))
    fig.update_layout(legend={"orientation": "v", "y": 1, "yanchor": "top", "x": 1.01,
                              "xanchor": "left"}, margin={"r": 220, "t": 50})
    return fig


def _roofline(metrics: RunMetrics) -> go.Figure | None:
    roof = metrics.roofline
    if not isinstance(roof, RooflineFigures):  # the GEMV demo: one bound, no peaks
        return None
    calls = [c for c in metrics.calls if c.ops > 0 and c.dram_bytes > 0]
    peak, bw = roof.peak_ops_per_s, roof.dram_bytes_per_s
    if not calls or not peak or not bw:
        return None
    intensity = [c.ops / c.dram_bytes for c in calls]
    lo, hi = min(intensity) / 4, max(max(intensity) * 4, 4 * peak / bw)
    ridge = peak / bw
    xs = [lo, ridge, hi]
    fig = go.Figure(go.Scatter(x=xs, y=[min(peak, bw * x) / 1e12 for x in xs], mode="lines",
                               name="roofline (DRAM bandwidth, peak compute)",
                               line={"color": "#444", "dash": "dash"}, hoverinfo="skip"))
    counts: dict[str, int] = defaultdict(int)
    for c in calls:
        counts[c.phase] += 1
    for phase in dict.fromkeys(c.phase for c in calls):
        cs = [c for c in calls if c.phase == phase]
        fig.add_trace(go.Scatter(
            x=[c.ops / c.dram_bytes for c in cs],
            y=[c.ops / c.time_s / 1e12 for c in cs], mode="markers", name=phase,
            marker={"size": 9, "color": PHASE_COLORS.get(phase)},
            customdata=[_call_label(c, counts[phase]) for c in cs],
            hovertemplate="%{customdata}<br>%{x:,.2f} ops/byte<br>%{y:,.3f} TOPS"
                          "<extra></extra>"))
    fig.update_xaxes(type="log", dtick=1)
    fig.update_yaxes(type="log", dtick=1)
    return layout(fig, "Roofline of every program (one point per runtime call)",
                  "arithmetic intensity (integer ops per DRAM byte)",
                  "achieved throughput (TOPS)")


def _bandwidth(recorder: Recorder, bins: int, metrics: RunMetrics
               ) -> tuple[go.Figure | None, go.Figure | None]:
    series = bandwidth_series(recorder, bins=bins)
    if not series:
        return None, None
    dram = go.Figure()
    link = go.Figure()
    for (block, lane), (t, bps) in sorted(series.items(), key=lambda kv: (_block_key(kv[0][0]),
                                                                          kv[0][1])):
        x = t / PS_PER_MS
        if block == "dram":
            dram.add_trace(go.Scatter(x=x, y=bps / 1e9, name=lane, mode="lines",
                                      stackgroup="dram", line={"shape": "hv", "width": 0.5},
                                      hovertemplate=f"{lane}: %{{y:,.2f}} GB/s<extra></extra>"))
        else:
            link.add_trace(go.Scatter(x=x, y=bps / 1e9, name=f"{block} {lane}", mode="lines",
                                      line={"shape": "hv"},
                                      hovertemplate=f"{block} {lane}: %{{y:,.3f}} GB/s"
                                                    "<extra></extra>"))
    bw = (metrics.roofline.dram_bytes_per_s if isinstance(metrics.roofline, RooflineFigures)
          else None)
    if bw:
        dram.add_hline(y=bw / 1e9, line={"dash": "dash", "color": "#444", "width": 1},
                       annotation_text=f"effective DRAM bandwidth {bw / 1e9:,.1f} GB/s",
                       annotation_position="top left")
    dram.update_layout(hovermode="x unified")
    out_dram = layout(dram, "DRAM bandwidth over time (channels stacked: the top is the total)",
                      "simulated time (ms)", "bandwidth (GB/s)") if dram.data else None
    out_link = layout(link, "Host link bandwidth over time, per direction",
                      "simulated time (ms)", "bandwidth (GB/s)") if link.data else None
    return out_dram, out_link


def _occupancy(metrics: RunMetrics) -> go.Figure | None:
    calls = metrics.calls
    if not calls:
        return None
    x = [0.0] + [c.end_s * 1e3 for c in calls]
    unit, scale = byte_unit(max(c.kv_cache_bytes for c in calls))
    y = [0.0] + [c.kv_cache_bytes / scale for c in calls]
    tokens = [0] + [c.cache_tokens for c in calls]
    fig = go.Figure(go.Scatter(x=x, y=y, mode="lines+markers", line={"shape": "hv"},
                               customdata=tokens, name="KV cache",
                               hovertemplate=f"%{{y:,.3f}} {unit}<br>%{{customdata:,}} tokens "
                                             "in the "
                                             "cache<br>at %{x:,.3f} ms<extra></extra>"))
    fig.update_yaxes(rangemode="tozero")
    title = "KV cache in DRAM over the run"
    if isinstance(metrics, GenerateMetrics) and metrics.kv_cache.format:
        title += f" ({metrics.kv_cache.format})"
    return layout(fig, title, "simulated time (ms)", f"KV cache ({unit})", height=340)


def _bars(values: Mapping[str, float], title: str, x: str) -> go.Figure | None:
    if not values:
        return None
    fig = go.Figure(go.Bar(x=list(values), y=[v / 1e6 for v in values.values()],
                           text=[fmt_bytes(v) for v in values.values()],
                           textposition="outside", cliponaxis=False,
                           hovertemplate="%{x}: %{y:,.3f} MB<extra></extra>"))
    return layout(fig, title, x, "bytes moved (MB)", height=340)


def _utilization(metrics: RunMetrics) -> go.Figure | None:
    """Busy % per engine kind: one bar per kind with the cores' mean, and the busiest and
    least busy core in the hover (8 cores x 4 engines would be 32 unreadable bars)."""
    util = metrics.engine_utilization
    if not util:
        return None
    groups: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for key, v in util.items():
        block, _, lane = key.partition(".")
        core = block.startswith("core") and block[4:].isdigit()
        groups[f"cores' {lane}" if core else key].append((block, 100 * v))
    names = list(groups)
    means = [sum(v for _, v in groups[n]) / len(groups[n]) for n in names]
    hover = []
    for n in names:
        vals = sorted(groups[n], key=lambda bv: bv[1])
        hover.append(f"{len(vals)} engines: {vals[0][0]} {vals[0][1]:.1f} % to "
                     f"{vals[-1][0]} {vals[-1][1]:.1f} %" if len(vals) > 1 else "")
    fig = go.Figure(go.Bar(x=names, y=means, customdata=hover,
                           text=[f"{m:.1f} %" for m in means], textposition="outside",
                           cliponaxis=False,
                           hovertemplate="%{x}: mean %{y:,.1f} %<br>%{customdata}"
                                         "<extra></extra>"))
    fig.update_yaxes(range=[0, 100])
    return layout(fig, "Engine utilization over the run (mean over cores)", "engine",
                  "busy (% of simulated time)", height=340)


def _cache_ops(metrics: RunMetrics) -> go.Figure | None:
    ops = metrics.cache_ops if isinstance(metrics, GenerateMetrics) else ()
    if not ops:
        return None
    labels = [f"{i}: {o.op} at token {o.at_token}" for i, o in enumerate(ops)]
    fig = go.Figure(go.Bar(x=labels, y=[o.time_s * 1e3 for o in ops],
                           customdata=[[o.pcie_bytes, o.dram_bytes] for o in ops],
                           hovertemplate="%{x}<br>%{y:,.3f} ms<br>PCIe %{customdata[0]:,} B"
                                         "<br>DRAM %{customdata[1]:,} B<extra></extra>"))
    return layout(fig, "Cost of each cache operation", "operation", "time (ms)", height=340)


def _cards(m: RunMetrics) -> list[Card]:
    if not isinstance(m, GenerateMetrics):  # the GEMV demo: no prefill or decode
        t, bound = m.sim_time_s, m.roofline.bound_s
        return [Card("simulated time", fmt_time(t), note=_vs_bound(t, bound),
                     metric="sim_time_s", value=t)]
    roof = m.roofline
    ttft = m.prefill.ttft_s
    cards = [Card("time to first token (TTFT)", fmt_time(ttft),
                  note=_vs_bound(ttft, roof.prefill.bound_s), metric="prefill.ttft_s",
                  value=ttft)]
    if m.decode.tokens:
        tpot = m.decode.time_per_token_s
        bound = roof.decode_per_token.bound_s
        cards.append(Card("time per output token", fmt_time(tpot),
                          note=_vs_bound(tpot, bound), metric="decode.time_per_token_s",
                          value=tpot))
        tps = m.decode.tokens_per_s
        note = f"bound {1 / bound:,.1f} tokens/s" if bound else ""
        cards.append(Card("decode throughput", f"{tps:,.1f} tokens/s", note=note,
                          metric="decode.tokens_per_s", value=tps))
    kv = m.kv_cache
    cards.append(Card(f"KV cache per token ({kv.format})", f"{kv.bytes_per_token:,.0f} bytes",
                      note=f"{kv.compression_vs_bf16:.2f}× smaller than bf16",
                      metric="kv_cache.bytes_per_token", value=kv.bytes_per_token))
    cards.append(Card("KV capacity", f"{kv.capacity_tokens:,} tokens",
                      note="fit in the DRAM the model leaves free",
                      metric="kv_cache.capacity_tokens", value=kv.capacity_tokens))
    if m.speculation is not None:
        spec = m.speculation.summary
        cards.append(Card("draft acceptance", f"{spec.acceptance_rate:.3f}",
                          note=f"{spec.accepted_tokens:,} of {spec.drafted_tokens:,} "
                               f"drafted tokens ({spec.drafter}, k={spec.k})",
                          metric="speculation.summary.acceptance_rate",
                          value=spec.acceptance_rate))
        cards.append(Card("tokens per verification call",
                          f"{spec.tokens_per_verify_call:.2f}",
                          note=f"tail cuts {spec.tail_cut_share:.1%} of decode time "
                               f"(cut={spec.cut})",
                          metric="speculation.summary.tokens_per_verify_call",
                          value=spec.tokens_per_verify_call))
    cards.append(Card("launch (weights over the host link)", fmt_time(m.launch.time_s),
                      note=fmt_bytes(m.launch.pcie_h2d_bytes), metric="launch.time_s",
                      value=m.launch.time_s))
    return cards


def _vs_bound(t: float, bound: float | None) -> str:
    """The roofline bound in the unit ``t`` is shown in."""
    if not bound:
        return ""
    return f"roofline bound {fmt_time(bound, time_unit(t)[0])} ({t / bound:.2f}× the bound)"


def _weights(m: RunMetrics) -> str:
    """Real or synthetic, as the run recorded it (``weights``: the kind of the compiled
    model's weights: gguf, safetensors, synthetic)."""
    if isinstance(m, GenerateMetrics) and m.weights.real:
        return f"real ({m.weights.kind})"
    seed = (m.config.get("model") or {}).get("weights_seed")
    return "synthetic" + (f" (seed {seed})" if seed is not None else "")


def _texts(m: RunMetrics) -> str:
    """A run of a prompt text: the prompt, what the NPU wrote, the float reference's
    continuation and where they first differ (HTML; empty for a run without text)."""
    t = m.text if isinstance(m, GenerateMetrics) else None
    if t is None or t.generated_text is None:
        return ""
    diff = t.first_difference_token
    rows = [("prompt", t.prompt or ""), ("NPU", t.generated_text)]
    if t.reference_compared:
        rows += [("float reference", t.reference_text or ""),
                 ("first difference", "none: the same tokens" if diff is None
                  else f"at generated token {diff}")]
    if t.degenerate:
        rows.append(("degenerate output", t.degenerate))
    return f'<h2>Text</h2><div class="texts">{table(rows)}</div>'  # line breaks kept


def _details(m: RunMetrics, recorder: Recorder) -> list[tuple[str, str]]:
    rows = [("scenario", m.scenario),
            ("simulated time (prefill + decode)", fmt_time(m.sim_time_s))]
    if isinstance(m, GenerateMetrics):
        rows.append(("prefill throughput", f"{m.prefill.tokens_per_s:,.1f} tokens/s"))
    rows.append(("instructions executed", f"{m.instructions:,}"))
    rows.append(("weights", _weights(m)))
    for k, v in m.traffic_bytes.items():
        rows.append((f"traffic {k}", fmt_bytes(v)))
    sp = m.speculation if isinstance(m, GenerateMetrics) else None
    if sp is not None:
        s = sp.summary
        rows.append(("speculative decoding", f"{sp.spec}: {s.drafter}, cut={s.cut}"))
        rows.append(("rounds: drafted / accepted tokens",
                     f"{s.verify_calls:,}: {s.drafted_tokens:,} / "
                     f"{s.accepted_tokens:,} ({sp.acceptance})"))
        rows.append(("decode time: draft / verify / tail cut",
                     " / ".join(fmt_time(t) for t in (s.draft_s, s.verify_s, s.cut_s))))
        if sp.dram is not None:
            d = sp.dram
            rows.append(("self-draft in DRAM", f"reads {fmt_bytes(d.draft_shared_weight_bytes)}"
                         f" of the model's weights in place; its own parameters "
                         f"{fmt_bytes(d.draft_own_bytes)}; weights copied "
                         f"{fmt_bytes(d.draft_copied_weight_bytes)}"))
    if recorder.dropped:
        rows.append(("trace events dropped", f"{recorder.dropped:,} (event limit reached)"))
    return rows


# --- the charts of the run report ------------------------------------------------------------
#
# A chart is one function ``(metrics, recorder, bins) -> its figures`` (none when the run has
# nothing to show), listed in RUN_CHARTS in page order: a new chart is its function here
# and one entry there.

Chart = Callable[[RunMetrics, Recorder, int], list[Figure]]


def _figures(fig: go.Figure | None, *, wide: bool = False) -> list[Figure]:
    return [] if fig is None else [Figure(fig, wide=wide)]


def breakdown_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """Where the time went per phase: critical path and each resource's demand."""
    return _figures(run_breakdown(metrics, recorder), wide=True)


def timeline_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """Runtime calls, layers and the engines' work on one time axis."""
    return _figures(_timeline(recorder, metrics.calls), wide=True)


def roofline_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """Each runtime call against the roofline."""
    return _figures(_roofline(metrics))


def occupancy_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """The KV cache's bytes in DRAM over the run."""
    return _figures(_occupancy(metrics))


def bandwidth_charts(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """DRAM bandwidth (channels stacked, full width) and the host link per direction."""
    dram, link = _bandwidth(recorder, bins, metrics)
    return _figures(dram, wide=True) + _figures(link)


def traffic_charts(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """Bytes moved by kind (all links) and by link."""
    return (_figures(_bars(metrics.traffic_by_kind_bytes, "Traffic by kind (all links)",
                           "kind"))
            + _figures(_bars(metrics.traffic_bytes, "Traffic by link", "link")))


def utilization_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """Busy share of each engine kind."""
    return _figures(_utilization(metrics))


def cache_ops_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """The cost of each scheduled cache operation."""
    return _figures(_cache_ops(metrics))


#: The run report's charts, in page order.
RUN_CHARTS: tuple[Chart, ...] = (breakdown_chart, timeline_chart, roofline_chart,
                                 occupancy_chart, bandwidth_charts, traffic_charts,
                                 utilization_chart, cache_ops_chart, speculation_chart)


def run_report(metrics: RunMetrics, recorder: Recorder, *, bins: int = 200) -> str:
    """The report of one run (its typed results and its events) as an HTML string: the
    headline cards, the details and the figures of :data:`RUN_CHARTS` (those without data
    are left out)."""
    figs = [f for chart in RUN_CHARTS for f in chart(metrics, recorder, bins)]
    subtitle = metrics.scenario
    return render_page(f"kvsim run report: {metrics.scenario or 'run'}",
                       subtitle="" if not subtitle else
                       "simulated times; hover any chart for its values",
                       cards=_cards(metrics), details=_details(metrics, recorder),
                       figures=figs, before=_texts(metrics))
