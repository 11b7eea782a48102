"""The KV-bits sweep's figure: decode time per token and KV-cache bytes against the
context, one line per KV format (log-2 context axis), as a small SVG; and, per format, the
first context at which its decode is at least ``--pays`` (1 % unless told) faster than
``--base``'s (bf16 unless told), printed as a table.

    kvsim sweep configs/kv-bits-sweep.toml --out kv-bits
    python benchmarks/kv_bits_plot.py kv-bits/results.json --out kv-bits/kv-bits.svg
"""

from __future__ import annotations

import argparse
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

CONTEXT = "workload.context_tokens"
FORMAT = "kv.format"
DECODE = "decode.time_per_token_s"
KV_BYTES = "kv_cache.bytes"
#: One colour per format (the sweep's order), then grey.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
PANEL_W, PANEL_H, PAD = 330, 220, 48  # SVG user units (px)


def series(rows: list[dict], metric: str) -> dict[str, list[tuple[int, float]]]:
    """format -> [(context tokens, metric)] sorted by context, of the points that ran."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["status"] == "ok":
            out.setdefault(r[FORMAT], []).append((int(r[CONTEXT]), float(r[metric])))
    return {f: sorted(v) for f, v in out.items()}


def pays_from(rows: list[dict], *, base: str = "bf16", margin: float = 0.01) -> dict:
    """format -> the first context where its decode time is ``margin`` below ``base``'s
    (and stays so at every longer context), or None."""
    dec = series(rows, DECODE)
    ref = dict(dec[base])
    out = {}
    for fmt, pts in dec.items():
        if fmt == base:
            continue
        ok = [ctx for ctx, t in pts if ctx in ref and t <= (1 - margin) * ref[ctx]]
        tail = [ctx for ctx, _ in pts if ctx in ref]
        first = None
        for i, ctx in enumerate(tail):
            if all(c in ok for c in tail[i:]):
                first = ctx
                break
        out[fmt] = first
    return out


def _panel(svg: ET.Element, x0: int, title: str, unit: str, scale: float,
           data: dict[str, list[tuple[int, float]]]) -> None:
    g = ET.SubElement(svg, "g", transform=f"translate({x0},0)")
    xs = [c for pts in data.values() for c, _ in pts]
    ys = [v * scale for pts in data.values() for _, v in pts]
    lx0, lx1 = math.log2(min(xs)), math.log2(max(xs))
    y1 = max(ys) * 1.05

    def px(c: int) -> float:
        return PAD + (math.log2(c) - lx0) / (lx1 - lx0 or 1) * (PANEL_W - PAD - 10)

    def py(v: float) -> float:
        return PANEL_H - PAD + 10 - v / y1 * (PANEL_H - PAD - 20)

    ET.SubElement(g, "text", x=str(PANEL_W / 2), y="16", **{"text-anchor": "middle",
                  "font-size": "13"}).text = f"{title} ({unit})"
    ET.SubElement(g, "line", x1=str(PAD), y1=str(py(0)), x2=str(PANEL_W - 10),
                  y2=str(py(0)), stroke="#000")
    ET.SubElement(g, "line", x1=str(PAD), y1=str(py(0)), x2=str(PAD), y2=str(py(y1)),
                  stroke="#000")
    for c in sorted(set(xs)):
        ET.SubElement(g, "text", x=f"{px(c):.1f}", y=str(py(0) + 14), **{
            "text-anchor": "middle", "font-size": "9"}).text = (
            f"{c // 1024}K" if c >= 1024 else str(c))
    for i in range(5):
        v = y1 * i / 4
        ET.SubElement(g, "text", x=str(PAD - 4), y=f"{py(v) + 3:.1f}", **{
            "text-anchor": "end", "font-size": "9"}).text = f"{v:.3g}"
    ET.SubElement(g, "text", x=str(PANEL_W / 2), y=str(PANEL_H - 4), **{
        "text-anchor": "middle", "font-size": "10"}).text = "context (tokens)"
    for k, (fmt, pts) in enumerate(data.items()):
        colour = COLOURS[k] if k < len(COLOURS) else "#777"
        ET.SubElement(g, "polyline", fill="none", stroke=colour, **{"stroke-width": "2"},
                      points=" ".join(f"{px(c):.1f},{py(v * scale):.1f}" for c, v in pts))
        ET.SubElement(g, "text", x=str(PAD + 8), y=str(34 + 13 * k), fill=colour,
                      **{"font-size": "11"}).text = fmt


def figure(rows: list[dict]) -> ET.ElementTree:
    svg = ET.Element("svg", xmlns="http://www.w3.org/2000/svg", width=str(2 * PANEL_W),
                     height=str(PANEL_H), viewBox=f"0 0 {2 * PANEL_W} {PANEL_H}",
                     **{"font-family": "sans-serif"})
    _panel(svg, 0, "decode time per token", "ms", 1e3, series(rows, DECODE))
    _panel(svg, PANEL_W, "KV cache", "MB", 1e-6, series(rows, KV_BYTES))
    return ET.ElementTree(svg)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="the sweep's results.json")
    p.add_argument("--out", type=Path, required=True, help="the SVG to write")
    p.add_argument("--pays", type=float, default=0.01,
                   help="the decode-time saving against the base that counts as paying")
    p.add_argument("--base", default="bf16", help="the format the others are against")
    a = p.parse_args()
    rows = json.loads(a.results.read_text())["rows"]
    tree = figure(rows)
    ET.indent(tree)
    tree.write(a.out, encoding="unicode")
    dec = series(rows, DECODE)
    if a.base not in dec:
        raise SystemExit(f"--base: no points of format {a.base!r} in {a.results}")
    ref = dict(dec[a.base])
    print(f"{'format':8s} " + " ".join(f"{c:>7d}" for c, _ in dec[a.base]))
    for fmt, pts in dec.items():
        print(f"{fmt:8s} " + " ".join(f"{t * 1e3:7.3f}" for _, t in pts) + "  ms/token")
        if fmt != a.base:
            print(f"{'':8s} " + " ".join(f"{(1 - t / ref[c]) * 100:6.1f}%" for c, t in pts)
                  + f"  below {a.base}")
    for fmt, ctx in pays_from(rows, base=a.base, margin=a.pays).items():
        print(f"{fmt} pays (decode >= {a.pays:.0%} below {a.base}) from "
              f"{'no sampled context' if ctx is None else f'{ctx} tokens'}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
