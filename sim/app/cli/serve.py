"""``kvsim serve [CONFIG] [--set KEY=VALUE ...] [--out DIR] [-q]``: run a serving scenario.

Hooked into ``kvsim`` by :func:`add_serve_parser`; also runs as ``python -m
sim.app.cli.serve``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from kvsim.errors import ConfigError
from traces.serving_results import ServingMetrics


def print_serve_summary(metrics: ServingMetrics, paths: dict, console: Console) -> None:
    """A serving run's headline figures (its typed result)."""
    s = metrics.serving
    console.print(f"[bold]kvsim serve[/bold]: {metrics.scenario}")
    t = Table(show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("simulated duration", f"{s.duration_s:,.3f} s")
    t.add_row("output tokens/s", f"{s.output_tokens_per_s:,.2f}")
    t.add_row("requests/s", f"{s.requests_per_s:,.4f}")
    for q in (50, 90, 99):
        t.add_row(f"TTFT p{q}", f"{getattr(s, f'ttft_s_p{q}'):,.3f} s")
    for q in (50, 90, 99):
        t.add_row(f"time per output token p{q}", f"{getattr(s, f'tpot_s_p{q}') * 1e3:,.2f} ms")
    t.add_row("preemptions", f"{s.num_preemptions:,}")
    t.add_row("recomputed tokens", f"{s.recomputed_tokens:,}")
    t.add_row("swapped bytes", f"{s.swapped_bytes:,}")
    t.add_row("tokens computed (prompt + decode + recomputed)", f"{s.computed_tokens:,}")
    sp = s.speculation
    if sp is not None:  # speculative decoding: what the drafts bought and what they cost
        t.add_row("speculation: drafted / accepted / rejected tokens",
                  f"{sp.drafted_tokens:,} / {sp.accepted_tokens:,} / {sp.rejected_tokens:,}")
        t.add_row("speculation: acceptance rate, tokens per verification",
                  f"{sp.acceptance_rate:.3f}, {sp.tokens_per_verification:.2f}")
        t.add_row("speculation: drafting, tail cuts", f"{sp.draft_s * 1e3:,.3f} ms, "
                  f"{sp.tail_cut_s * 1e3:,.3f} ms ({sp.tail_cuts:,} calls)")
    kv = s.kv
    t.add_row("KV blocks (tokens each, bytes each)",
              f"{kv.num_blocks:,} ({kv.block_tokens}, {kv.block_bytes:,} B)")
    t.add_row("KV peak occupancy", f"{100 * s.kv_peak_occupancy:.1f} %")
    cost = metrics.cost_model
    t.add_row("step cost model", f"{cost['mode']}, {cost['grid_points']} points"
              + (" (cached)" if cost.get("cache_hit") else ""))
    if "validation" in cost:
        t.add_row("cost model error vs direct simulation (max)",
                  f"{100 * cost['validation']['max_abs_error']:.2f} %")
    t.add_row("wall time", f"{metrics.wall_s.total:.1f} s")
    console.print(t)
    for name, p in paths.items():
        console.print(f"{name}: {p}")


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    if getattr(args, "http", False):
        from sim.app.server.cli import cmd_serve_http

        return cmd_serve_http(args, console)
    from sim.app.server.cli import FLAGS

    given = [f for f in FLAGS if getattr(args, f, None) is not None]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')}: only with --http")
    from kvsim.files import check_out_folder
    from sim.app.serve.config import load_serve_config
    from sim.app.serve.run import run_serving, write_serving_outputs
    from sim.progress import Phases, progress_enabled

    cfg = load_serve_config(args.config, args.set)
    check_out_folder(args.out, "--out")
    # phases, requests done and the time left on a terminal; nothing in pipes or CI
    from kvsim.errors import OutputError

    with Phases(enabled=not args.quiet and progress_enabled()) as ph:
        result = run_serving(cfg, progress=ph)
        ph.start("write outputs")
        try:
            paths = write_serving_outputs(result, args.out)
        except OutputError:  # the figures still reach the user; then where they could not go
            if not args.quiet:
                print_serve_summary(result.metrics, {}, console)
            raise
    if not args.quiet:
        print_serve_summary(result.metrics, paths, console)
    return 0


def add_serve_parser(sub) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to ``kvsim``'s subparsers."""
    s = sub.add_parser("serve", help="serve many requests (continuous batching, KV "
                                     "capacity, preemption) on the simulated card")
    s.add_argument("config", nargs="?", help="serving config (TOML); omit for the default")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any field, e.g. --set serving.workload.requests=100")
    s.add_argument("--out", default="kvsim-serve", help="output folder (default: kvsim-serve)")
    s.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    from sim.app.server.cli import add_http_arguments

    add_http_arguments(s)
    s.set_defaults(func=cmd_serve)
    return s


def main(argv: Sequence[str] | None = None) -> int:
    """``kvsim serve ARGV`` (``python -m sim.app.cli.serve``)."""
    from sim.app.cli.entry import run_command

    parser = argparse.ArgumentParser(prog="kvsim")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return run_command(parser, ["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
