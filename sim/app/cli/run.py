"""``kvsim run [FILE]``: any kvsim config (a run, a sweep or a serving file) as its own
command would run it; its ``--help`` text; the phases of a run shown on a terminal."""

from __future__ import annotations

import argparse
import contextlib
import gc
import typing
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsim.errors import ConfigError
from sim.app.console import fmt_bytes_per_s, fmt_s
from sim.progress import Phases, progress_enabled
from traces.results import GenerateMetrics, RunMetrics


def config_kind(tree: dict) -> str:
    """What a config file is: ``"sweep"`` (it has ``[axes]``), ``"server"`` (it has
    ``[server]``: ``kvsim serve --http``), ``"serve"`` (it has ``[serving]``) or
    ``"run"``."""
    from sim.app.sweep.sweep import is_sweep_tree

    if is_sweep_tree(tree):
        return "sweep"
    if "server" in tree:
        return "server"
    return "serve" if "serving" in tree else "run"


#: The output folder of each kind of config when ``--out`` is not given (each command's).
DEFAULT_OUT = {"run": "kvsim-out", "sweep": "kvsim-sweep", "serve": "kvsim-serve",
               "server": "kvsim-serve"}


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """``kvsim run [FILE]``: a run config runs here; a sweep or serving file runs as
    ``kvsim sweep FILE`` / ``kvsim serve FILE`` would (with their default options)."""
    from sim.app.config import load_run_config

    kind = "run"
    if args.config is not None:
        from sim.app.config import load_tree

        kind = config_kind(load_tree(args.config))
    if kind == "server":  # a server runs until stopped: not what kvsim run starts
        raise ConfigError(f"{args.config} is a server config (it has [server]): start it "
                          f"with kvsim serve --http {args.config}")
    out = args.out or DEFAULT_OUT[kind]
    from sim.app.cli.sweep import cmd_sweep

    if kind == "sweep":
        if not args.quiet:
            console.print(f"{args.config} is a sweep file: running it as kvsim sweep "
                          f"{args.config}", style="dim")
        return cmd_sweep(argparse.Namespace(sweep=args.config, set=args.set, axis=None,
                                            out=out, executor="local", workers=None,
                                            scheduler=None, quiet=args.quiet), console)
    if kind == "serve":
        from sim.app.cli.serve import cmd_serve

        if not args.quiet:
            console.print(f"{args.config} is a serving file: running it as kvsim serve "
                          f"{args.config}", style="dim")
        return cmd_serve(argparse.Namespace(config=args.config, set=args.set, out=out,
                                            quiet=args.quiet), console)
    from kvsim.files import check_out_folder
    from sim.app.run import run, write_outputs

    cfg = load_run_config(args.config, args.set)
    check_out_folder(out, "--out")
    from kvsim.errors import OutputError

    with run_phases(cfg, enabled=not args.quiet and progress_enabled()) as ph, \
            fewer_collections():
        result = run(cfg)  # checks cfg first: bad input is one line naming the field
        ph.start("write outputs")
        try:
            paths = write_outputs(result, out)
        except OutputError:  # the figures still reach the user; then where they could not go
            if not args.quiet:
                print_run_summary(result.metrics, {}, console)
            raise
    if not args.quiet:
        print_run_summary(result.metrics, paths, console)
    return 0


def print_run_summary(metrics: RunMetrics, paths: dict, console: Console) -> None:
    """A run's headline figures, traffic and engine busy time (its typed result)."""
    console.print(f"[bold]kvsim run[/bold]: {metrics.scenario}")
    t = Table(show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    if isinstance(metrics, GenerateMetrics):
        text = metrics.text
        if text is not None:
            # a prompt text through the NPU: what it wrote, beside the float reference
            diff = text.first_difference_token
            console.print(f"prompt: {escape(repr(text.prompt))}\n"
                          f"NPU:       {escape(repr(text.generated_text))}\n"
                          f"reference: {escape(repr(text.reference_text))}\n"
                          + ("identical to the reference" if diff is None
                             else f"first difference at generated token {diff}"))
        p, d, kv, roof = metrics.prefill, metrics.decode, metrics.kv_cache, metrics.roofline
        t.add_row("time to first token (TTFT), card", fmt_s(p.ttft_s))
        t.add_row("decode time per token, card", fmt_s(d.time_per_token_s))
        t.add_row("decode tokens/s, card", f"{d.tokens_per_s:,.2f}")
        c = metrics.client
        if c.stack_request_s or c.stack_token_s:  # a serving stack in front of the card
            t.add_row("TTFT at the client (hardware.stack)", fmt_s(c.ttft_s))
            if c.tokens_per_s:
                t.add_row("output tokens/s per user at the client", f"{c.tokens_per_s:,.2f}")
        cp = metrics.compiled
        t.add_row("prefill: tokens per pass, weight tiles (prefill / decode)",
                  f"{cp.m_tile_tokens}, {cp.weight_tile_bytes:,} / {cp.decode_tile_bytes:,} B")
        t.add_row("prefill: weight bytes streamed per prompt token",
                  f"{p.weight_bytes_per_token:,.0f} B")
        t.add_row("roofline: prefill bound", fmt_s(roof.prefill.bound_s))
        t.add_row("roofline: decode bound per token", fmt_s(roof.decode_per_token.bound_s))
        t.add_row("launch (weights over the host link)", fmt_s(metrics.launch.time_s))
        t.add_row(f"KV cache ({kv.format}) bytes per token", f"{kv.bytes_per_token:,.1f}")
        t.add_row("KV compression vs bf16", f"{kv.compression_vs_bf16:.2f}x")
        t.add_row("KV capacity (tokens in free DRAM)", f"{kv.capacity_tokens:,}")
        for k, v in metrics.traffic_by_kind_bytes.items():
            t.add_row(f"traffic {k}", f"{v:,} B")
    else:
        t.add_row("simulated time", fmt_s(metrics.sim_time_s))
        t.add_row("roofline bound", fmt_s(metrics.roofline.bound_s))
        t.add_row("weight stream rate", fmt_bytes_per_s(metrics.weight_stream_bytes_per_s))
        if metrics.functional_check:
            t.add_row("functional result vs numpy", metrics.functional_check)
    for k, v in metrics.traffic_bytes.items():
        t.add_row(f"traffic {k}", f"{v:,} B")
    console.print(t)
    e = Table(title="engine busy time (summed over cores)")
    e.add_column("engine")
    e.add_column("busy", justify="right")
    e.add_column("utilization", justify="right")
    groups: dict[str, list[float]] = {}
    for k, v in metrics.engine_busy_s.items():
        kind = k.split(".", 1)[1] if k.startswith("core") else k
        groups.setdefault(kind, []).append(v)
    total = metrics.sim_time_s or 1.0
    for kind, vals in groups.items():
        e.add_row(f"{kind} (x{len(vals)})" if len(vals) > 1 else kind, fmt_s(sum(vals)),
                  f"{sum(vals) / len(vals) / total * 100:.1f} %")
    console.print(e)
    for name, p in paths.items():
        console.print(f"{name}: {p}")


#: The garbage collector's thresholds during a run (allocations between generation-0
#: passes, generation-0 passes per generation-1 pass, generation-1 passes per full pass;
#: Python's defaults are 700, 10, 10). A long run holds millions of objects to its end
#: (spans, instructions), which every full pass walks again: with the defaults the
#: collector took 14.7 s of the Llama-3.1-8B validation run's 106 s of CPU, 11.7 s of it
#: in full passes (measured with ``gc.callbacks``); at these thresholds 1.9 s (at
#: 50,000, 20, 100: 2.8 s). An assumption, chosen so that cycles are still collected
#: while full passes become rare.
RUN_GC_THRESHOLDS = (200_000, 20, 100)


@contextlib.contextmanager
def fewer_collections(thresholds: tuple[int, int, int] = RUN_GC_THRESHOLDS) -> Iterator[None]:
    """The collector at ``thresholds`` inside, as it was outside."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextlib.contextmanager
def run_phases(cfg, *, enabled: bool, console: Console | None = None) -> Iterator[Phases]:
    """The phases of a run, told by the runtime's calls: compile, launch, prefill calls,
    decode tokens (with the time left), then whatever the caller starts."""
    from sim.runtime import tracing

    w = cfg.workload
    counts = {"prefill": 0, "decode": max(0, w.output_tokens - 1)}

    def on_event(kind: str, acc, obj) -> None:
        if kind == "launching":
            counts["prefill"] = -(-w.prompt_tokens // obj.compiled.max_seq)
            ph.start("launch (weights over the host link)")
        elif obj.op == "launch":
            ph.start("prefill calls", total=counts["prefill"])
        elif obj.op == "infer" and ph.current is not None:
            name, done, total = ph.current
            if name in ("prefill calls", "decode tokens"):
                ph.advance()
            if name == "prefill calls" and done + 1 >= (total or 0):
                ph.start("decode tokens", total=counts["decode"])

    with Phases(enabled=enabled, console=console) as ph:
        ph.start("compile")
        tracing.add_listener(on_event)
        try:
            yield ph
        finally:
            tracing.remove_listener(on_event)


def run_help_epilog() -> str:
    """``kvsim run --help``'s list of config sections (from the config types) and an
    example."""
    from sim.app.config import RunConfig
    from sim.app.sweep.sweep import SWEEP_KEYS

    lines = ["config sections of a run file (every key optional; unknown keys are errors):"]
    for name, f in RunConfig.model_fields.items():
        if name == "hardware":
            keys = "preset, then any hardware field to override (kvsim hw show PRESET)"
        else:
            # a section that may be left out ([speculate]) is ``Section | None``
            sub = next((a for a in (f.annotation, *typing.get_args(f.annotation))
                        if hasattr(a, "model_fields")), f.annotation)
            keys = ", ".join(getattr(sub, "model_fields", {})) or str(sub)
        lines.append(f"  [{name}]".ljust(14) + keys)
    lines += [
        "a sweep file: [" + "], [".join(SWEEP_KEYS) + "]: a base run config and axes",
        "  (dotted keys to lists); runs as kvsim sweep FILE",
        "a serving file: the run sections and [serving]; runs as kvsim serve FILE",
        "",
        "example (more in configs/; any key also works as --set section.key=value):",
        '  [hardware]\n  preset = "aries"\n  dram.efficiency = 0.7',
        '  [model]\n  preset = "qwen2.5-0.5b"',
        '  [kv]\n  format = "kivi-4"',
        "  [workload]\n  prompt_tokens = 240\n  output_tokens = 8",
    ]
    return "\n".join(lines)
