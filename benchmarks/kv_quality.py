"""The quality table: every KV format of ``sim.app.quality.TABLE_FORMATS`` (int8, kivi-4,
qserve-kv4, kivi-2, a 2-bit per-token format) through both KV read paths (integer codes,
as ARIES reads them; dequantized to fp16), teacher-forced over a text on the simulated NPU
against the float reference: perplexity, KL(reference || NPU) and top-1 agreement, with
each format's KV bytes per token, and the damage against context length (KL mean and
top-1 per bucket of prediction positions, ``models.quality.BUCKET_STARTS``). Writes a
markdown table and two self-contained plotly pages: plot.html (KL per format) and
positions.html (KL against position per format and read path).

    python benchmarks/kv_quality.py [--model smollm2-135m] [--tokens 257] [--bits W8]
                                    [--numerics w8] [--formats int8,kivi-2,...]
                                    [--reads integer,dequant] [--out kv-quality] [--json]
                                    [--edit requantize:kivi-2 ... --edit-at 192 [--kv int8]]

With ``--edit`` (repeatable) and ``--edit-at N`` it writes ``edits.md`` instead: each
host-side cache edit (``sim.app.quality.parse_edit``) applied after N teacher-forced tokens,
on the host and, where the device has the op, on the device, with the predictions after
the edit against the float reference beside the edit's simulated time and PCIe bytes.

KIVI keeps the latest 128 tokens in fp16 (its window), so a text of 257 tokens quantizes
about half of each attention's context; longer texts show more of each format's damage.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import plotly.graph_objects as go
from rich import box
from rich.console import Console
from rich.table import Table

from isa import kvformats
from kvsim.files import atomic_write_text
from sim.app.cli.text import eval_tokens
from sim.app.quality import (
    READ_PATHS,
    TABLE_FORMATS,
    bit_config,
    evaluate_edit,
    parse_edit,
    quality_table,
)
from sim.runtime.cacheops import CacheOpError


def kv_bytes_per_token(cfg, fmt: str, tokens: int) -> float:
    """Bytes per token of the whole cache (every layer, K and V) at ``tokens`` tokens."""
    p = kvformats.pair(fmt)
    per = sum(f.bytes(tokens, cfg.head_dim) for f in (p.k, p.v))
    return per * cfg.num_kv_heads * cfg.num_layers / tokens


def bucket_label(b: dict) -> str:
    """``0-127``: the prediction positions of a bucket (``Quality.as_dict`` form)."""
    return f"{b['start']}-{b['end'] - 1}"


def markdown(rows: list[dict]) -> str:
    t = Table(box=box.MARKDOWN)
    # every row has the same buckets (one text)
    spans = [bucket_label(b) for b in rows[0]["buckets"]] if rows else []
    for col in ("KV format", "read", "KV bytes/token", "perplexity", "KL mean (nats)",
                "top-1", *(f"KL {s}" for s in spans), *(f"top-1 {s}" for s in spans)):
        t.add_column(col)
    for r in rows:
        t.add_row(r["label"], r["kv_read"], f"{r['kv_bytes_per_token']:.0f}",
                  f"{r['perplexity']:.3f}", f"{r['kl_mean']:.4f}",
                  f"{r['top1_agreement']:.3f}",
                  *(f"{b['kl_mean']:.4f}" for b in r["buckets"]),
                  *(f"{b['top1_agreement']:.3f}" for b in r["buckets"]))
    con = Console(record=True, width=200, file=io.StringIO())
    con.print(t)
    return "\n".join(line.rstrip() for line in con.export_text().strip().splitlines()) + "\n"


def figure(rows: list[dict], title: str) -> go.Figure:
    fig = go.Figure()
    for read in dict.fromkeys(r["kv_read"] for r in rows):
        sel = [r for r in rows if r["kv_read"] == read]
        fig.add_bar(name=f"read: {read}", x=[r["label"] for r in sel],
                    y=[r["kl_mean"] for r in sel],
                    customdata=[[r["top1_agreement"], r["perplexity"]] for r in sel],
                    hovertemplate="KL %{y:.4f} nats<br>top-1 %{customdata[0]:.3f}<br>"
                                  "perplexity %{customdata[1]:.3f}")
    fig.update_layout(title=title, barmode="group", yaxis_title="KL(reference || NPU), nats",
                      xaxis_title="KV format")
    return fig


def position_figure(rows: list[dict], title: str) -> go.Figure:
    """KL mean against prediction position (each bucket at its middle position), one line
    per format and read path."""
    fig = go.Figure()
    for r in rows:
        bs = r["buckets"]
        fig.add_scatter(name=f"{r['label']} ({r['kv_read']})", mode="lines+markers",
                        x=[(b["start"] + b["end"] - 1) / 2 for b in bs],
                        y=[b["kl_mean"] for b in bs],
                        customdata=[[bucket_label(b), b["top1_agreement"]] for b in bs],
                        hovertemplate="positions %{customdata[0]}<br>KL %{y:.4f} nats<br>"
                                      "top-1 %{customdata[1]:.3f}")
    fig.update_layout(title=title, yaxis_title="KL(reference || NPU), nats",
                      xaxis_title="prediction position (bucket middle)")
    return fig


def edit_rows(src, ids: list[int], edits: list[str], *, at: int, kv: str, bits: str,
              numerics: str, hw: str, allow_degenerate: bool) -> list[dict]:
    """One row per edit and side (host; device where it has the op and can do it), the
    first row of each edit preceded by the unedited figures of the same predictions."""
    bc = bit_config(bits, numerics=numerics)
    rows = []
    for spec in edits:
        ce = parse_edit(spec, where="--edit")
        for side in ("host", "device") if ce.device is not None else ("host",):
            print(f"{spec} on the {side} ...", file=sys.stderr)
            try:
                r = evaluate_edit(src, ids, bits=bc, edit=ce, at=at, kv=kv, side=side, hw=hw,
                                  allow_degenerate=allow_degenerate)
            except CacheOpError as err:
                rows.append({"edit": spec, "side": side, "refused": str(err)})
                continue
            if not rows:
                rows.append({"edit": "(none)", "side": "", **r.unedited.as_dict()})
            rows.append({"edit": spec, **r.quality.as_dict(), **r.as_dict(), "quality": None,
                         "unedited": None})
    return rows


def edit_markdown(rows: list[dict]) -> str:
    t = Table(box=box.MARKDOWN)
    for col in ("edit", "on", "perplexity", "KL mean (nats)", "top-1",
                "edit time (simulated, us)", "PCIe bytes", "DRAM bytes"):
        t.add_column(col)
    for r in rows:
        if "refused" in r:
            t.add_row(r["edit"], r["side"], f"refused: {r['refused']}", "", "", "", "", "")
            continue
        cost = (("", "", "") if r["edit"] == "(none)" else
                (f"{r['time_s'] * 1e6:.3f}", str(r["pcie_bytes"]), str(r["dram_bytes"])))
        t.add_row(r["edit"], r["side"], f"{r['perplexity']:.3f}", f"{r['kl_mean']:.4f}",
                  f"{r['top1_agreement']:.3f}", *cost)
    con = Console(record=True, width=200, file=io.StringIO())
    con.print(t)
    return "\n".join(line.rstrip() for line in con.export_text().strip().splitlines()) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--text", default=None, help="default: models/data/english.txt")
    ap.add_argument("--tokens", type=int, default=257,
                    help="tokens of the text to use (257: 256 next-token predictions, the "
                         "tests' text)")
    ap.add_argument("--bits", default="W8")
    ap.add_argument("--numerics", default="w8")
    ap.add_argument("--hw", default="aries")
    ap.add_argument("--formats", default=None,
                    help="comma-separated labels of the table's formats (default: all: "
                         + ", ".join(label for label, _ in TABLE_FORMATS) + ")")
    ap.add_argument("--reads", default="integer,dequant",
                    help="comma-separated KV read paths (default %(default)s)")
    ap.add_argument("--allow-degenerate", action="store_true")
    ap.add_argument("--out", default="kv-quality", help="folder for table.md and plot.html")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edit", action="append", default=None,
                    help="a cache edit (repeatable): requantize:FORMAT, "
                         "evict:SINKS,RECENT,BUDGET, drop:FIRST-LAST; needs --edit-at")
    ap.add_argument("--edit-at", type=int, default=None)
    ap.add_argument("--kv", default="int8", help="the cache's format for --edit")
    a = ap.parse_args(argv)
    if (a.edit is None) != (a.edit_at is None):
        ap.error("--edit and --edit-at go together")
    for spec in a.edit or ():
        parse_edit(spec, where="--edit")  # a bad name fails before any run
    formats = TABLE_FORMATS
    if a.formats is not None:
        known = dict(TABLE_FORMATS)
        wanted = [f.strip() for f in a.formats.split(",") if f.strip()]
        bad = [f for f in wanted if f not in known]
        if bad or not wanted:
            ap.error(f"--formats: {bad[0] if bad else a.formats!r} is not one of the table's "
                     f"formats ({', '.join(known)})")
        formats = tuple((f, known[f]) for f in wanted)
    reads = [r.strip() for r in a.reads.split(",") if r.strip()]
    if not reads or any(r not in READ_PATHS for r in reads):
        ap.error(f"--reads: {a.reads!r}: comma-separated, each one of {', '.join(READ_PATHS)}")
    src, ids, name = eval_tokens(a.model, a.text)
    ids = ids[: a.tokens]
    if a.edit is not None:
        return main_edits(a, src, ids, name)
    table = quality_table(src, ids, bits=a.bits, numerics=a.numerics, hw=a.hw,
                          formats=formats, read_paths=reads,
                          allow_degenerate=a.allow_degenerate,
                          progress=lambda f, r: print(f"{f} read={r} ...", file=sys.stderr))
    rows = [{"label": label, **q.as_dict(),
             "kv_bytes_per_token": kv_bytes_per_token(src.config, q.kv, len(ids))}
            for label, q in table]
    title = (f"{src.name} ({'real' if src.real else 'synthetic'} weights) {a.bits} "
             f"numerics={a.numerics} on {a.hw}: {len(ids)} tokens of {name}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.md", f"{title}\n\n{markdown(rows)}")
    atomic_write_text(out / "plot.html", figure(rows, title).to_html(include_plotlyjs=True))
    atomic_write_text(out / "positions.html",
                      position_figure(rows, title).to_html(include_plotlyjs=True))
    if a.json:
        print(json.dumps(rows))
    else:
        print(title)
        print(markdown(rows))
        print(f"wrote {out / 'table.md'}, {out / 'plot.html'} and {out / 'positions.html'}")
    return 0


def main_edits(a: argparse.Namespace, src, ids: list[int], name: str) -> int:
    rows = edit_rows(src, ids, a.edit, at=a.edit_at, kv=a.kv, bits=a.bits,
                     numerics=a.numerics, hw=a.hw, allow_degenerate=a.allow_degenerate)
    title = (f"{src.name} ({'real' if src.real else 'synthetic'} weights) {a.bits} "
             f"numerics={a.numerics} kv={a.kv} on {a.hw}: edits after {a.edit_at} of "
             f"{len(ids)} tokens of {name} (predictions {a.edit_at}..{len(ids) - 2})")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "edits.md", f"{title}\n\n{edit_markdown(rows)}")
    if a.json:
        print(json.dumps(rows))
    else:
        print(title)
        print(edit_markdown(rows))
        print(f"wrote {out / 'edits.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
