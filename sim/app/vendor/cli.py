"""The vendor commands of the ``kvsim`` command line: ``kvsim exec`` (a program with
kvsim's ``qbruntime``) and ``kvsim vendor folder`` / ``kvsim vendor surface``."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_exec(args: argparse.Namespace, console: Any) -> int:
    from sim.app.vendor.execute import run

    functional = {None: None, "functional": True, "timing": False}[args.mode]
    return run(args.command, hw=args.hw, cards=args.cards, clock=args.clock,
               functional=functional, trace_calls=args.trace_calls, shadow=args.shadow)


def cmd_folder(args: argparse.Namespace, console: Any) -> int:
    from sim.app.vendor.folder import write_folder
    from sim.progress import Phases, progress_enabled

    with Phases(enabled=progress_enabled()) as ph:
        ph.start(f"compile {args.model} and write {args.out}")
        f = write_folder(args.model, args.out, bits=args.bits, numerics=args.numerics,
                         kv=args.kv, hw=args.hw, core_mode=args.core_mode,
                         max_seq=args.max_seq, cap=args.cache_length, slots=args.cache_slots,
                         timing_only=args.timing_only, seed=args.seed)
    console.print(f"wrote {f.path}: {f.kvm.name} ({f.model}, "
                  f"{'functional' if f.functional else 'timing-only'}, core mode "
                  f"{f.core_mode}, {f.max_seq} tokens per call, {f.cap}-token cache)")
    return 0


def cmd_surface(args: argparse.Namespace, console: Any) -> int:
    from sim.app.vendor.surface import main

    return main(["check", *([args.snapshot] if args.snapshot else [])])


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def add_vendor_parsers(sub: Any) -> None:
    from sim.runtime.vendor.clock import MODES

    ex = sub.add_parser(
        "exec", help="run a program with kvsim's qbruntime (the vendor runtime's surface on "
        "a simulated card)",
        description="Run COMMAND with 'import qbruntime' (and 'maccel') resolving to kvsim's "
        "simulated card: its shim folder first on PYTHONPATH, for this command only.",
        epilog="example: kvsim exec --trace-calls calls.json -- python my_host_program.py")
    ex.add_argument("--hw", default="aries", help="hardware preset of the cards (default "
                    "aries: device name aries-rb)")
    ex.add_argument("--cards", type=_positive, default=1, help="simulated cards (device "
                    "numbers 0..N-1)")
    ex.add_argument("--clock", choices=MODES, default="sim",
                    help="what time.perf_counter reads: sim (simulated time only, default), "
                    "sim+host (plus the host's real time between calls), wall (unchanged)")
    ex.add_argument("--mode", choices=["functional", "timing"], default=None,
                    help="compute every value, or time only (default: as each model was "
                    "compiled)")
    ex.add_argument("--trace-calls", metavar="FILE",
                    help="write the qbruntime calls the program made (JSON) at its exit")
    ex.add_argument("--shadow", action="store_true",
                    help="run even if a real vendor runtime is installed here (kvsim's "
                    "shadows it in the child)")
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    ex.set_defaults(func=cmd_exec)

    v = sub.add_parser("vendor", help="the vendor's Python stack on kvsim: model folders, "
                       "the qbruntime surface check")
    vsub = v.add_subparsers(dest="vendor_command", required=True)
    f = vsub.add_parser("folder", help="compile a model and write a transformers-mblt model "
                        "folder (config.json with mxq_path naming the .kvm, embeddings, "
                        "tokenizer)")
    f.add_argument("--model", default="smollm2-135m", help="any model kvsim takes "
                   "(default smollm2-135m)")
    f.add_argument("--out", required=True, help="output folder")
    f.add_argument("--bits", default="W8")
    f.add_argument("--numerics", default=None, help="numerics preset (default: w8 for "
                   "real weights, static-int8 for synthetic)")
    f.add_argument("--kv", default="int8")
    f.add_argument("--hw", default="aries")
    f.add_argument("--core-mode", choices=["single", "global4", "global8"], default=None,
                   help="default: the widest the preset has")
    f.add_argument("--max-seq", type=_positive, default=128, help="most tokens per call "
                   "(default 128, the vendor's npu_prefill_chunk_size)")
    f.add_argument("--cache-length", type=_positive, default=2048, help="KV capacity, tokens")
    f.add_argument("--cache-slots", type=_positive, default=1, help="cache slots "
                   "(max_batch_size)")
    f.add_argument("--timing-only", action="store_true", help="no calibration: a "
                   "timing-only card")
    f.add_argument("--seed", type=int, default=0, help="synthetic weight seed")
    f.set_defaults(func=cmd_folder)
    s = vsub.add_parser("surface", help="compare kvsim's qbruntime with the vendor's 1.5.0 "
                        "surface snapshot")
    s.add_argument("snapshot", nargs="?", help="a snapshot file (default: the committed one)")
    s.set_defaults(func=cmd_surface)


__all__ = ["add_vendor_parsers"]
