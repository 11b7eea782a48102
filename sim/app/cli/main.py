"""``kvsim`` command line.

Exit codes: 0 success, 2 bad input (config, file, arguments: one line naming the field),
130 interrupted (Ctrl-C), 1 anything unexpected. Long commands show their progress on a
terminal (``sim.progress``), and nothing when output goes to a file or ``CI`` is set.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsim.errors import ConfigError, OutputError
from sim.app.cli.entry import EXIT_BAD_INPUT, EXIT_INTERRUPTED, run_command
from sim.app.cli.run import DEFAULT_OUT, cmd_run, config_kind, run_help_epilog, run_phases
from sim.app.cli.sweep import cmd_sweep
from sim.app.console import fmt_bytes_per_s, fmt_s
from sim.progress import Phases, progress_enabled

__all__ = ["DEFAULT_OUT", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "build_parser", "cmd_run",
           "config_kind", "main", "run_help_epilog", "run_phases"]


def cmd_hw_list(args: argparse.Namespace, console: Console) -> int:
    from sim.device.hw import load_hardware, preset_names

    table = Table(title="hardware presets")
    table.add_column("name")
    table.add_column("description")
    for name in preset_names():
        table.add_row(name, load_hardware(name).description)
    console.print(table)
    return 0


def cmd_hw_show(args: argparse.Namespace, console: Console) -> int:
    from sim.app.config import apply_sets, resolve_hardware
    from sim.device.hw import build_hardware

    tree: dict = {"preset": args.name}
    apply_sets(tree, args.set or [])
    hw = build_hardware(resolve_hardware(tree))
    protocol = None
    if hw.dram.timing is not None:
        from sim.device.dram.patterns import protocol_summary

        protocol = protocol_summary(hw.dram)
    if args.json:
        out = {"config": hw.model_dump(mode="json"), "derived": hw.derived}
        if protocol is not None:
            out["dram_protocol"] = protocol.to_json()
        print(json.dumps(out, indent=1))
        return 0
    console.print(f"[bold]{escape(hw.name)}[/bold]: {escape(hw.description)}")
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
                    table.add_row(p2, escape(str(vv)), escape(_note(p2)))
            else:  # escaped: a note naming a table ("[dram.timing]") is not console markup
                table.add_row(path, escape(str(v)), escape(_note(path)))

    def _note(path: str) -> str:
        if path in hw.sources:
            return f"source: {hw.sources[path]}"
        if path in hw.assumptions:
            return f"assumption: {hw.assumptions[path]}"
        if "all" in hw.assumptions:
            return f"assumption: {hw.assumptions['all']}"
        return ""

    data = hw.model_dump(mode="json", exclude={"name", "description", "sources", "assumptions",
                                               "fitted"})
    walk("", data)
    console.print(table)
    if hw.fitted:
        _print_fitted(hw, console)
    d = Table(title="derived figures")
    d.add_column("figure")
    d.add_column("value", justify="right")
    for k, v in hw.derived.items():
        if k.startswith("peak_ops"):
            d.add_row(k, f"{v / 1e12:,.2f} TOPS")
        else:
            d.add_row(k, fmt_bytes_per_s(v))
    console.print(d)
    if protocol is not None:
        _print_dram_protocol(protocol, console)
    return 0


def _print_fitted(hw, console: Console) -> None:
    """The fitted parameters beside their physical bounds and what fixes them."""
    f = Table(title="fitted parameters (python -m sim.app.calibration fit)")
    for col in ("field", "value", "low", "high", "unit", "inside", "fitted to"):
        f.add_column(col, justify="left" if col in ("field", "fitted to") else "right",
                     overflow="fold")
    outside = set(hw.fitted_outside())
    for name, p in hw.fitted.items():
        v = hw.field_value(name)
        f.add_row(name, "-" if v is None else f"{v:g}", f"{p.low:g}", f"{p.high:g}", p.unit,
                  "NO" if name in outside else "yes", p.fitted_to)
    console.print(f)


def _print_dram_protocol(protocol, console: Console) -> None:
    """The DRAM protocol model's timing in cycles and its efficiency per access pattern."""

    std = protocol.standard.upper()
    c = Table(title=f"DRAM protocol timing ({std}), rounded to tCK = "
                    f"{protocol.tck_ps / 1000:.3f} ns")
    c.add_column("parameter")
    c.add_column("cycles", justify="right")
    c.add_column("ns", justify="right")
    for k, v in protocol.cycles.items():
        c.add_row(k, str(v), f"{v * protocol.tck_ps / 1000:.2f}")
    console.print(c)
    p = Table(title=f"DRAM sustained efficiency per access pattern ({std} protocol model)")
    for col in ("pattern", "efficiency", "closed form", "sustained, all channels", "what"):
        p.add_column(col, justify="left" if col in ("pattern", "what") else "right",
                     overflow="fold")
    for f in protocol.patterns:
        closed = "-" if f.closed_form is None else f"{f.closed_form:.4f}"
        p.add_row(f.name, f"{f.efficiency:.4f}", closed,
                  fmt_bytes_per_s(f.sustained_bytes_per_s), escape(f.description))
    console.print(p)
    console.print(f"refresh alone: tRFCab / tREFI = {protocol.refresh_loss:.4f} of the time")
    console.print(f"[yellow]note[/yellow]: {protocol.note}")


#: Short column names of the sensitivity table.
FIGURE_LABELS = {"prefill.ttft_s": "TTFT", "decode.time_per_token_s": "decode/token",
                 "client.ttft_s": "client TTFT",
                 "client.time_per_token_s": "client decode/token", "sim_time_s": "time"}


def cmd_hw_sensitivity(args: argparse.Namespace, console: Console) -> int:
    from sim.app.config import apply_sets, load_tree
    from sim.app.sweep.sensitivity import run_sensitivity

    tree = load_tree(args.config)
    if args.model is not None:
        key = "hf_config" if args.model.endswith(".json") or "/" in args.model else "preset"
        tree["model"] = {key: args.model}
    apply_sets(tree, args.set or [])
    res = run_sensitivity(tree, fraction=args.fraction, only=args.param, workers=args.workers,
                          executor=args.executor, scheduler=args.scheduler,
                          progress=not (args.quiet or args.json) and progress_enabled())
    if args.json:
        print(json.dumps(res.to_json(), indent=1))
        return 0
    pct = f"{res.fraction:.0%}"
    t = Table(title=f"change of each figure at -{pct} / +{pct} of one hardware field")
    t.add_column("field", overflow="fold")
    t.add_column("value", justify="right")
    for f in res.figures:
        label = FIGURE_LABELS.get(f, f)
        t.add_column(f"{label} -{pct}", justify="right")
        t.add_column(f"{label} +{pct}", justify="right")
    t.add_column("note", overflow="fold")

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:+.2f} %"

    for r in res.rows:
        cells = [cell(v) for f in res.figures for v in r.change_pct[f]]
        t.add_row(r.field, f"{r.base:g}", *cells, r.note)
    console.print(t)
    console.print("base: " + ", ".join(f"{k} = {fmt_s(v)}" for k, v in res.base.items()))
    console.print("not perturbed: the fields of the DRAM model not in use (dram.efficiency "
                  "under dram.model = protocol, \\[dram.timing] under efficiency)")
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from sim.app.check import check_run
    from sim.app.config import apply_sets, build_run_config, load_tree
    from sim.app.sweep.sweep import build_sweep, is_sweep_tree

    tree = load_tree(args.config)
    if args.config is not None and is_sweep_tree(tree):
        sweep = build_sweep(tree, folder=Path(args.config).parent, sets=args.set,
                            axes=args.axis, source=args.config)
        shape = " x ".join(f"{k} ({len(v)})" for k, v in sweep.axes.items())
        print(f"ok: sweep of {len(sweep.points)} points: {shape}")
        return 0
    if args.axis:
        raise ConfigError("--axis: only a sweep file (with [axes]) takes axes")
    apply_sets(tree, args.set or [])
    if config_kind(tree) == "server":
        from sim.app.server.config import build_http_config

        cfg = build_http_config(tree)
        s = cfg.server
        print(f"ok: server of {cfg.model.preset or cfg.model.hf_config} on "
              f"{cfg.serving.chips} x {cfg.hardware.name} at {s.host}:{s.port} (kvsim serve "
              f"--http), pace {s.pace}")
        return 0
    if config_kind(tree) == "serve":
        from sim.app.serve.config import build_serve_config

        cfg = build_serve_config(tree)
        w = cfg.serving.workload
        print(f"ok: serving {w.requests} requests of {cfg.model.preset or cfg.model.hf_config}"
              f" on {cfg.serving.chips} x {cfg.hardware.name}")
        return 0
    print(f"ok: {check_run(build_run_config(tree)).summary}")
    return 0


def cmd_compile(args: argparse.Namespace, console: Console) -> int:
    from kvsim.files import check_out_file
    from models.bits import build_bit_config
    from sim.runtime.ready import ready_model, source_of

    check_out_file(args.output, "-o/--output")
    src = source_of(args.model, where="--model")
    bits = build_bit_config({"weights": args.bits}, where="--bits")
    with Phases(enabled=progress_enabled()) as ph:
        ph.start(f"compile {src.config.name}"
                 + ("" if args.timing_only else " (calibrating integer parameters)"))
        ready = ready_model(src, args.hw, bits=bits, kv=args.kv,
                            core_mode=args.core_mode, max_seq=args.max_seq,
                            cap=args.cache_length, slots=args.cache_slots,
                            functional=not args.timing_only, seed=args.seed,
                            store_programs=True)
        ph.start(f"write {args.output}")
        try:
            ready.compiled.save(args.output)
            unwritten = None
        except OSError as err:  # after the work: the table still reaches the user
            unwritten = OutputError(f"-o/--output: could not write {args.output!r} "
                                    f"({err.strerror or err}); it was not written, an "
                                    f"earlier file there is as it was")
    cm, model, hw = ready.compiled, ready.compiled.model, ready.hw
    t = Table(title=f"compiled {model.name} -> {args.output}"
                    + (" (NOT WRITTEN)" if unwritten else ""))
    t.add_column("item")
    t.add_column("value", justify="right")
    t.add_row("hardware / core mode", f"{hw.name} / {cm.core_mode}")
    t.add_row("weights (DRAM)", f"{cm.mm.bytes_of_kind('weights'):,} B")
    t.add_row("KV cache (DRAM)", f"{cm.mm.bytes_of_kind('kv_cache'):,} B")
    t.add_row("activations + host I/O (DRAM)",
              f"{cm.mm.bytes_of_kind('activations') + cm.mm.bytes_of_kind('host_io'):,} B")
    t.add_row("tokens per pass (SRAM-fitted tile)", str(cm.m_tile))
    t.add_row("weight tile: prefill / decode pass",
              f"{cm.tile_bytes:,} / {cm.big_tile_bytes:,} B (two per core)")
    from sim.device.device import static_roofline

    for name, prog in cm.programs.items():
        roof = static_roofline(prog, hw)
        n = cm.max_seq if name.startswith("prefill") else 1
        tile = cm.tile_for(min(n, cm.m_tile))
        t.add_row(f"program {name}", f"{len(prog):,} instructions, roofline "
                  f"{fmt_s(roof['bound_s'])} ({roof['dram_bytes']:,} DRAM bytes, "
                  f"{roof['dram_bytes'] / n:,.0f} per token; {-(-n // cm.m_tile)} "
                  f"pass(es) of <= {min(n, cm.m_tile)} tokens, {tile:,} B weight tiles)")
    console.print(t)
    if unwritten is not None:
        raise unwritten
    if args.asm:
        from isa.asm import disassemble

        print(disassemble(cm.programs["decode"]))
    return 0


def cmd_kv(args: argparse.Namespace, console: Console) -> int:
    from collections import Counter

    from isa import kvformats
    from models.source import load_model

    model = load_model(args.model, where="--model")
    pair = kvformats.pair(args.format)
    bf16 = kvformats.parse("bf16")
    n = args.context
    comps = model.kv_components()
    if model.is_mla:
        caches = [("latent", pair.k, comps["content"] + comps["rope"], 1)]
    else:
        hd = model.head_dim
        caches = [("key", pair.k, hd, model.num_kv_heads),
                  ("value", pair.v, hd, model.num_kv_heads)]
    rows = []
    for name, fmt, width, heads in caches:
        b = heads * fmt.bytes(n, width)
        ref = heads * bf16.bytes(n, width)
        rows.append({"cache": name, "format": kvformats.to_text(fmt), "width": width,
                     "heads": heads, "bytes_per_layer": b, "bf16_bytes_per_layer": ref,
                     "bytes_per_token_per_layer": b / n, "compression_vs_bf16": ref / b})
    # a sliding-window layer holds only its last window of tokens (rows: a full layer)
    held = [model.kv_tokens(layer, n) for layer in range(model.num_layers)]
    total = sum(heads * fmt.bytes(t, width) for t in held for _, fmt, width, heads in caches)
    total_ref = sum(heads * bf16.bytes(t, width) for t in held for _, _, width, heads in caches)
    out = {"model": model.name, "format": args.format, "context_tokens": n,
           "layers": model.num_layers, "layers_by_tokens_held": dict(Counter(held)),
           "per_layer": rows, "total_bytes": total,
           "bytes_per_token": total / n, "bf16_total_bytes": total_ref,
           "compression_vs_bf16": total_ref / total}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    windowed = "" if len(set(held)) == 1 else (
        "; " + ", ".join(f"{c} layers hold {t:,}" for t, c in Counter(held).items()))
    t = Table(title=f"{model.name}: KV cache {args.format} at {n:,} tokens "
                    f"({model.num_layers} layers{windowed})")
    for col in ("cache", "format", "heads x width", "bytes per layer", "bytes/token/layer",
                "vs bf16"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["cache"], r["format"], f"{r['heads']} x {r['width']}",
                  f"{r['bytes_per_layer']:,}", f"{r['bytes_per_token_per_layer']:,.2f}",
                  f"{r['compression_vs_bf16']:.3f}x")
    t.add_row("total", "", "", f"{total:,}", f"{total / n:,.2f}",
              f"{total_ref / total:.3f}x")
    console.print(t)
    return 0


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def version_text() -> str:
    """``kvsim X.Y.Z`` (the installed package's version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"kvsim {version('kvsim')}"
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "kvsim (not installed: version unknown)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvsim",
        description="Cycle simulator of an LLM inference NPU with a focus on the KV cache.",
    )
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run any kvsim config: a run, a sweep or a serving file "
                       "(the embedded default run without CONFIG)",
                       description="Run a kvsim config file: a run config here, a sweep file "
                       "as kvsim sweep would, a serving file as kvsim serve would.",
                       epilog=run_help_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("config", nargs="?", help="config file (TOML); omit for the embedded "
                   "default run")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any config field, e.g. --set hardware.dram.efficiency=0.7 "
                   "(of a sweep: of its base config)")
    r.add_argument("--out", help="output folder (default: kvsim-out; kvsim-sweep for a sweep, "
                   "kvsim-serve for a serving file)")
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    r.set_defaults(func=cmd_run)

    ch = sub.add_parser("check", help="validate a run or sweep config without running it")
    ch.add_argument("config", nargs="?", help="run or sweep config (TOML); omit for the "
                    "embedded default")
    ch.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a config field (of a sweep: of its base config)")
    ch.add_argument("--axis", action="append", metavar="KEY=[V1,V2,...]",
                    help="sweep only: replace or add an axis")
    ch.set_defaults(func=cmd_check)

    sw = sub.add_parser("sweep", help="run a parameter sweep (cartesian product of axes)")
    sw.add_argument("sweep", help="sweep config (TOML): base run config, [axes], [outputs]")
    sw.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a field of the base config")
    sw.add_argument("--axis", action="append", metavar="KEY=[V1,V2,...]",
                    help="replace or add an axis, e.g. --axis workload.prompt_tokens=[512,2048]")
    sw.add_argument("--out", default="kvsim-sweep", help="output folder (default: kvsim-sweep)")
    sw.add_argument("--executor", choices=["local", "dask"], default="local",
                    help="local process pool (default) or a Dask distributed cluster")
    sw.add_argument("--workers", type=int, metavar="N",
                    help="local: processes (default: one per CPU; 1 runs in this process); "
                         "dask without --scheduler: workers of the LocalCluster it starts")
    sw.add_argument("--scheduler", metavar="ADDRESS",
                    help="dask: scheduler address, e.g. tcp://10.0.0.5:8786 (default: start a "
                         "LocalCluster)")
    sw.add_argument("-q", "--quiet", action="store_true",
                    help="no progress bar or table (failed points are still reported)")
    sw.set_defaults(func=cmd_sweep)

    c = sub.add_parser("compile", help="compile a model to a .kvm file (memory map, programs)")
    c.add_argument("--model", required=True, help="model preset, smollm2-135m, a GGUF file, "
                   "a Hugging Face folder or a config.json")
    c.add_argument("--bits", default="W8", help="weight-bit preset (W8, W4V8)")
    c.add_argument("--kv", default="int8", help="KV format (int8, bf16, kivi-4, ...)")
    c.add_argument("--hw", default="aries", help="hardware preset")
    c.add_argument("--core-mode", default="global8", choices=["single", "global4", "global8"])
    c.add_argument("--max-seq", type=_positive, default=512, help="most tokens per infer call")
    c.add_argument("--cache-length", type=_positive, default=4096, help="KV capacity, tokens")
    c.add_argument("--cache-slots", type=_positive, default=1, help="cache slots")
    c.add_argument("--seed", type=int, default=0, help="synthetic weight seed")
    c.add_argument("--timing-only", action="store_true",
                   help="skip calibration of integer parameters (timing-only runs)")
    c.add_argument("--asm", action="store_true", help="print the decode program's assembly")
    c.add_argument("-o", "--output", required=True, help="output file (.kvm)")
    c.set_defaults(func=cmd_compile)

    k = sub.add_parser("kv", help="KV-cache bytes of a model in a format")
    k.add_argument("--model", required=True)
    k.add_argument("--format", required=True)
    k.add_argument("--context", type=_positive, required=True, help="tokens in the cache")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_kv)

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
    he = hsub.add_parser("sensitivity", help="TTFT and decode change per +-10 %% of each "
                         "numeric hardware field")
    he.add_argument("--model", help="model preset or config.json path (default: the config's)")
    he.add_argument("--config", help="run config (TOML; default: the embedded default run)")
    he.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a run-config field, e.g. --set hardware.preset=tiny")
    he.add_argument("--param", action="append", metavar="FIELD",
                    help="only this hardware field or table (repeatable), e.g. dram")
    he.add_argument("--fraction", type=float, default=0.1, help="relative step (default 0.1)")
    he.add_argument("--workers", type=_positive, default=None,
                    help="processes (default: one per CPU; 1 runs in this process)")
    he.add_argument("--executor", choices=["local", "dask"], default="local")
    he.add_argument("--scheduler", help="dask: scheduler address")
    he.add_argument("--json", action="store_true", help="print JSON")
    he.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    he.set_defaults(func=cmd_hw_sensitivity)

    from sim.app.cli.needle import add_needle_parser
    from sim.app.cli.serve import add_serve_parser
    from sim.app.cli.text import add_text_parsers
    from sim.app.regress.regress import add_parser as add_regress_parser
    from sim.app.vendor.cli import add_vendor_parsers

    add_regress_parser(sub)
    add_serve_parser(sub)
    add_text_parsers(sub)
    add_vendor_parsers(sub)  # kvsim exec, kvsim vendor (the vendor's Python stack on kvsim)
    add_needle_parser(sub)  # kvsim needle (pass-key retrieval by depth and context)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
