"""``kvsim needle``: pass-key retrieval by depth and context length through the integer
pipeline, beside the float reference (:mod:`sim.app.needle`), as a table, a plotly
heatmap page and JSON."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsim.errors import ConfigError

DEFAULT_OUT = "kvsim-needle"


def _ints(text: str, where: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise ConfigError(f"{where}: {text!r} must list integers >= 1")
    return vals


def _depths(text: str) -> list[float]:
    try:
        vals = [float(x) / 100 for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--depths: {text!r} is not a comma-separated list of percentages") \
            from None
    if not vals or not all(0.0 <= v <= 1.0 for v in vals):
        raise ConfigError(f"--depths: {text!r} must list percentages in 0..100")
    return vals


def configs_of(kvs: list[str], reads: list[str], float_ref: bool):
    """The grid's rows: the float reference (if asked) then every format x read path."""
    from sim.app.needle import NeedleConfig
    from sim.app.quality import TABLE_FORMATS

    names = dict(TABLE_FORMATS)
    out = [NeedleConfig("float", None, None)] if float_ref else []
    for kv in kvs:
        spec = names.get(kv, kv)
        label = next((lab for lab, s in TABLE_FORMATS if s == spec), kv)
        out.extend(NeedleConfig(label, spec, r) for r in reads)
    return out


def heatmap(cells, path: Path) -> None:
    """A self-contained page: one heatmap per configuration (context x depth, colour the
    share of trials retrieved, each cell's mean key log-probability written in it)."""
    from kvsim.files import atomic_write_text

    names = list(dict.fromkeys(c.config for c in cells))
    cols = min(2, len(names))
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names,
                        vertical_spacing=0.3 / max(rows, 1))
    for i, name in enumerate(names):
        mine = [c for c in cells if c.config == name]
        ctxs = sorted({c.context for c in mine})
        deps = sorted({c.depth for c in mine})
        z = [[None] * len(deps) for _ in ctxs]
        text = [[""] * len(deps) for _ in ctxs]
        for c in mine:
            r, k = ctxs.index(c.context), deps.index(c.depth)
            z[r][k] = c.retrieved
            text[r][k] = f"{c.retrieved:.0%}<br>{c.logprob_mean:.2f}"
        fig.add_trace(go.Heatmap(z=z, x=[f"{d:.0%}" for d in deps], y=[str(x) for x in ctxs],
                                 zmin=0, zmax=1, colorscale="Viridis", text=text,
                                 texttemplate="%{text}", showscale=i == 0,
                                 colorbar={"title": "retrieved"}),
                      row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text="needle depth")
    fig.update_yaxes(title_text="context (tokens)", type="category")
    fig.update_layout(title="pass-key retrieval (share of trials retrieved greedily; mean "
                            "log-probability of the key's digits, nats)",
                      height=320 * rows + 120)
    atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))


def pairs_markdown(cells) -> str:
    """The read paths side by side, trial by trial (:func:`sim.app.needle.read_path_pairs`),
    or "" when no format ran through both."""
    from sim.app.needle import read_path_pairs

    pairs = read_path_pairs(cells)
    if not pairs:
        return ""
    lines = ["| format | context | trials | retrieved, integer | retrieved, dequant | "
             "integer only | dequant only | key log-prob, integer | key log-prob, dequant |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        lines.append(f"| {p.format} | {p.context} | {p.trials} | {p.integer} | {p.dequant} | "
                     f"{p.only_integer} | {p.only_dequant} | {p.logprob_integer:.2f} | "
                     f"{p.logprob_dequant:.2f} |")
    return "\n".join(lines) + "\n"


def markdown(cells) -> str:
    """A markdown table: a row per configuration and context, a column per depth
    (retrieved share / mean log-probability); then the read paths paired trial by trial
    where a format ran through both."""
    deps = sorted({c.depth for c in cells})
    head = "| configuration | context | " + " | ".join(f"{d:.0%}" for d in deps) + " |"
    lines = [head, "|" + "---|" * (len(deps) + 2)]
    for name in dict.fromkeys(c.config for c in cells):
        for ctx in sorted({c.context for c in cells if c.config == name}):
            by = {c.depth: c for c in cells if c.config == name and c.context == ctx}
            vals = [f"{by[d].retrieved:.0%} / {by[d].logprob_mean:.2f}" if d in by else ""
                    for d in deps]
            lines.append(f"| {name} | {ctx} | " + " | ".join(vals) + " |")
    pairs = pairs_markdown(cells)
    return "\n".join(lines) + "\n" + (f"\nRead paths, trial by trial:\n\n{pairs}" if pairs
                                       else "")


def cmd_needle(args: argparse.Namespace, console: Console) -> int:
    from kvsim.files import atomic_write_text
    from sim.app.needle import cached_cells, read_path_pairs, run_grid
    from sim.app.quality import bit_config

    reads = ["integer", "dequant"] if args.kv_read == "both" else [args.kv_read]
    kvs = [k.strip() for k in args.kv.split(",") if k.strip()]
    configs = configs_of(kvs, reads, not args.no_float)
    if not configs:
        raise ConfigError("--kv: no configuration to run (and --no-float)")
    out = Path(args.out)
    if args.trials < 1:
        raise ConfigError(f"--trials: must be >= 1, got {args.trials}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {args.jobs}")
    t0 = time.perf_counter()
    say = None if args.json else (lambda m: console.print(escape(m)))
    if args.cached:
        stale: list[Path] = []
        cells = cached_cells(out, trials=args.trials, seed=args.seed, stale=stale)
        if stale and say is not None:
            say(f"{len(stale)} cells of an older kvsim left out (run them again)")
        if not cells:
            raise ConfigError(f"--cached: no cell of {args.trials} trials (seed {args.seed}) "
                              f"in {out / 'cells'}")
    else:
        cells = run_grid(args.model, configs,
                         bits=lambda r: bit_config(args.bits, numerics=args.numerics,
                                                   kv_read=r),
                         contexts=_ints(args.contexts, "--contexts"),
                         depths=_depths(args.depths), trials=args.trials, seed=args.seed,
                         hw=args.hw, out=out, progress=say, jobs=args.jobs)
    wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    heatmap(cells, out / "needle.html")
    atomic_write_text(out / "needle.md", markdown(cells))
    data = {"cells": [c.as_dict() for c in cells],
            "read_paths": [p.as_dict() for p in read_path_pairs(cells)],
            "wall_s": round(wall, 1),
            "cells_wall_s": round(sum(c.wall_s for c in cells), 1)}
    atomic_write_text(out / "needle.json", json.dumps(data))
    if args.json:
        print(json.dumps(data))
        return 0
    deps = sorted({c.depth for c in cells})
    t = Table(title="pass-key retrieval: share of trials retrieved / mean key log-prob (nats)")
    t.add_column("configuration")
    t.add_column("context", justify="right")
    for d in deps:
        t.add_column(f"{d:.0%}", justify="right")
    for name in dict.fromkeys(c.config for c in cells):
        for ctx in sorted({c.context for c in cells if c.config == name}):
            by = {c.depth: c for c in cells if c.config == name and c.context == ctx}
            t.add_row(name, str(ctx), *(f"{by[d].retrieved:.0%} / {by[d].logprob_mean:.2f}"
                                        if d in by else "" for d in deps))
    console.print(t)
    console.print(f"wrote {out / 'needle.html'}, needle.md, needle.json; {wall:.0f} s this "
                  f"run, {data['cells_wall_s']:.0f} s of cell time in all")
    return 0


def add_needle_parser(sub) -> None:
    """Register ``kvsim needle`` (``sim.app.cli.main.build_parser``)."""
    from sim.app.cli.text import DEFAULT_MODEL

    n = sub.add_parser("needle", help="pass-key retrieval by depth and context through the "
                       "integer pipeline, beside the float reference (resumable grid)")
    n.add_argument("--model", default=DEFAULT_MODEL, help="model (default %(default)s)")
    n.add_argument("--kv", default="int8",
                   help="comma-separated KV formats: names, the quality table's labels "
                        "(e.g. '2-bit per-token') or specs (default %(default)s)")
    n.add_argument("--kv-read", default="integer", choices=("integer", "dequant", "both"),
                   help="KV read path(s) (default %(default)s)")
    n.add_argument("--contexts", default="1024,2048,4096,8192",
                   help="context lengths in tokens (default %(default)s)")
    n.add_argument("--depths", default="0,25,50,75,100",
                   help="needle depths in %% of the filler (default %(default)s)")
    n.add_argument("--trials", type=int, default=5, help="seeded keys per cell (default 5)")
    n.add_argument("--seed", type=int, default=0, help="the keys' seed (default 0)")
    n.add_argument("--bits", default="W8", help="weight-bit preset (default W8)")
    n.add_argument("--numerics", default=None, help="numerics preset (default: the model's)")
    n.add_argument("--hw", default="aries", help="hardware preset (default aries)")
    n.add_argument("--no-float", action="store_true", help="leave out the float reference")
    n.add_argument("--jobs", type=int, default=1,
                   help="processes running (configuration, context) groups at once, each "
                        "on cpu_count / jobs threads and with its own model (about 3 GB at "
                        "8,192 tokens; default 1: this process)")
    n.add_argument("--cached", action="store_true",
                   help="run nothing: report every cell of --trials seeded keys already in "
                        "--out/cells (grids run by several commands, as one table)")
    n.add_argument("--out", default=DEFAULT_OUT,
                   help="output folder: cells/ (cached per cell: a rerun resumes), "
                        "needle.html, needle.md, needle.json (default %(default)s)")
    n.add_argument("--json", action="store_true", help="print one JSON object")
    n.set_defaults(func=cmd_needle)


__all__ = ["add_needle_parser", "cmd_needle", "configs_of", "heatmap", "markdown"]
