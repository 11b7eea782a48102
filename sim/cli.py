"""``kvsim`` command line.

Exit codes: 0 success, 2 bad input (config, file, arguments: one line naming the field),
1 anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from isa.errors import KvsimError

EXIT_BAD_INPUT = 2


def _fmt_bytes_per_s(v: float) -> str:
    return f"{v / 1e9:,.3f} GB/s"


def _fmt_s(v: float) -> str:
    if v >= 1:
        return f"{v:.3f} s"
    if v >= 1e-3:
        return f"{v * 1e3:.3f} ms"
    return f"{v * 1e6:.3f} µs"


def cmd_hw_list(args: argparse.Namespace, console: Console) -> int:
    from sim.hw import load_hardware, preset_names

    table = Table(title="hardware presets")
    table.add_column("name")
    table.add_column("description")
    for name in preset_names():
        table.add_row(name, load_hardware(name).description)
    console.print(table)
    return 0


def cmd_hw_show(args: argparse.Namespace, console: Console) -> int:
    from sim.config import apply_sets, resolve_hardware
    from sim.hw import build_hardware

    tree: dict = {"preset": args.name}
    apply_sets(tree, args.set or [])
    hw = build_hardware(resolve_hardware(tree))
    if args.json:
        print(json.dumps({"config": hw.model_dump(mode="json"), "derived": hw.derived}, indent=1))
        return 0
    console.print(f"[bold]{hw.name}[/bold]: {hw.description}")
    table = Table(title="parameters")
    for col in ("field", "value", "source / assumption"):
        table.add_column(col, overflow="fold")

    def walk(prefix: str, obj: dict) -> None:
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and k not in ("macs_per_cycle",):
                walk(path, v)
            elif isinstance(v, dict):
                for kk, vv in v.items():
                    p2 = f"{path}.{kk}"
                    table.add_row(p2, str(vv), _note(p2))
            else:
                table.add_row(path, str(v), _note(path))

    def _note(path: str) -> str:
        if path in hw.sources:
            return f"source: {hw.sources[path]}"
        if path in hw.assumptions:
            return f"assumption: {hw.assumptions[path]}"
        if "all" in hw.assumptions:
            return f"assumption: {hw.assumptions['all']}"
        return ""

    data = hw.model_dump(mode="json", exclude={"name", "description", "sources", "assumptions"})
    walk("", data)
    console.print(table)
    d = Table(title="derived figures")
    d.add_column("figure")
    d.add_column("value", justify="right")
    for k, v in hw.derived.items():
        if k.startswith("peak_ops"):
            d.add_row(k, f"{v / 1e12:,.2f} TOPS")
        else:
            d.add_row(k, _fmt_bytes_per_s(v))
    console.print(d)
    return 0


def print_run_summary(metrics: dict, paths: dict, console: Console) -> None:
    console.print(f"[bold]kvsim run[/bold]: {metrics['scenario']}")
    t = Table(show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    if "prefill" in metrics:
        p, d, kv = metrics["prefill"], metrics["decode"], metrics["kv_cache"]
        t.add_row("time to first token (TTFT)", _fmt_s(p["ttft_s"]))
        t.add_row("decode time per token", _fmt_s(d["time_per_token_s"]))
        t.add_row("decode tokens/s", f"{d['tokens_per_s']:,.2f}")
        t.add_row("roofline: prefill bound", _fmt_s(metrics["roofline"]["prefill"]["bound_s"]))
        t.add_row("roofline: decode bound per token",
                  _fmt_s(metrics["roofline"]["decode_per_token"]["bound_s"]))
        t.add_row("launch (weights over the host link)", _fmt_s(metrics["launch"]["time_s"]))
        t.add_row(f"KV cache ({kv['format']}) bytes per token", f"{kv['bytes_per_token']:,.1f}")
        t.add_row("KV compression vs bf16", f"{kv['compression_vs_bf16']:.2f}x")
        t.add_row("KV capacity (tokens in free DRAM)", f"{kv['capacity_tokens']:,}")
        for k, v in metrics["traffic_by_kind"].items():
            t.add_row(f"traffic {k}", f"{v:,} B")
    else:
        t.add_row("simulated time", _fmt_s(metrics["sim_time_s"]))
        t.add_row("roofline bound", _fmt_s(metrics["roofline"]["bound_s"]))
        if "weight_stream_bytes_per_s" in metrics:
            t.add_row("weight stream rate", _fmt_bytes_per_s(metrics["weight_stream_bytes_per_s"]))
        if metrics.get("functional_check"):
            t.add_row("functional result vs numpy", metrics["functional_check"])
    for k, v in metrics["traffic_bytes"].items():
        t.add_row(f"traffic {k}", f"{v:,} B")
    console.print(t)
    e = Table(title="engine busy time (summed over cores)")
    e.add_column("engine")
    e.add_column("busy", justify="right")
    e.add_column("utilization", justify="right")
    groups: dict[str, list[float]] = {}
    for k, v in metrics["engine_busy_s"].items():
        kind = k.split(".", 1)[1] if k.startswith("core") else k
        groups.setdefault(kind, []).append(v)
    total = metrics["sim_time_s"] or 1.0
    for kind, vals in groups.items():
        e.add_row(f"{kind} (x{len(vals)})" if len(vals) > 1 else kind, _fmt_s(sum(vals)),
                  f"{sum(vals) / len(vals) / total * 100:.1f} %")
    console.print(e)
    for name, p in paths.items():
        console.print(f"{name}: {p}")


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    from sim.config import load_run_config
    from sim.run import run, write_outputs

    cfg = load_run_config(args.config, args.set)
    result = run(cfg)
    paths = write_outputs(result, args.out)
    if not args.quiet:
        print_run_summary(result.metrics, paths, console)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvsim",
        description="Cycle simulator of an LLM inference NPU with a focus on the KV cache.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a scenario (the embedded default without CONFIG)")
    r.add_argument("config", nargs="?", help="run config (TOML); omit for the embedded default")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any config field, e.g. --set hardware.dram.efficiency=0.7")
    r.add_argument("--out", default="kvsim-out", help="output folder (default: kvsim-out)")
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    r.set_defaults(func=cmd_run)

    hw = sub.add_parser("hw", help="hardware presets")
    hsub = hw.add_subparsers(dest="hw_command", required=True)
    hl = hsub.add_parser("list", help="list presets")
    hl.set_defaults(func=cmd_hw_list)
    hs = hsub.add_parser("show", help="show a preset with its sources and derived figures")
    hs.add_argument("name")
    hs.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="override a field, e.g. --set dram.efficiency=0.7")
    hs.add_argument("--json", action="store_true", help="print JSON")
    hs.set_defaults(func=cmd_hw_show)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    try:
        return args.func(args, console)
    except KvsimError as err:
        print(f"kvsim: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
