"""``kvsim eval`` and ``kvsim generate``: real text through the simulated NPU (functional
mode) beside the float reference: teacher-forced quality, and a prompt continued."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsim.errors import ConfigError

if TYPE_CHECKING:
    from traces.speculation_results import SpeculationFigures

DEFAULT_MODEL = "smollm2-135m"
#: Fewest tokens of an eval text (teacher forcing over less says little about a model).
MIN_EVAL_TOKENS = 16


def _bit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="a preset, smollm2-135m (the embedded real model), a GGUF file, a "
                        "Hugging Face folder or a config.json (default %(default)s)")
    p.add_argument("--bits", default="W8", help="weight-bit preset: W8, W4V8 (default W8)")
    p.add_argument("--kv", default="int8", help="KV-cache format (default int8)")
    p.add_argument("--kv-read", default="integer", choices=("integer", "dequant"),
                   help="how attention reads the cache (default integer)")
    p.add_argument("--numerics", default=None,
                   help="numerics preset ([bits.numerics] preset: static-int8, w8, w4g32; default: "
                        "w8 for real weights, static-int8 for synthetic ones)")
    p.add_argument("--hw", default="aries", help="hardware preset (default aries)")
    p.add_argument("--allow-degenerate", action="store_true",
                   help="go on when the NPU's output is degenerate (all-zero, constant or "
                        "NaN logits; a text stuck on one token): it is reported, not refused")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _bits(args: argparse.Namespace):
    from sim.app.quality import bit_config
    from sim.runtime.ready import source_of

    real = source_of(args.model).real if args.numerics is None else True
    return bit_config(args.bits, numerics=args.numerics, kv_read=args.kv_read,
                      real_weights=real)


def eval_tokens(model: str, text_file: str | None) -> tuple[object, list[int], str]:
    """The model source, the text's tokens and the text's name."""
    from models.source import english_text
    from sim.runtime.ready import source_of

    src = source_of(model)
    if text_file is None:
        text, name = english_text(), "models/data/english.txt"
    else:
        path = Path(text_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--text {text_file}: cannot read it as UTF-8 text: "
                              f"{err}") from None
        name = str(path)
    ids = src.tokenizer().encode(text)
    if len(ids) < MIN_EVAL_TOKENS:
        raise ConfigError(f"--text {name}: {len(ids)} tokens; eval needs at least "
                          f"{MIN_EVAL_TOKENS}")
    return src, ids, name


def cmd_eval(args: argparse.Namespace, console: Console) -> int:
    from sim.app.quality import evaluate

    if args.max_tokens is not None and args.max_tokens < MIN_EVAL_TOKENS:
        raise ConfigError(f"--max-tokens: must be >= {MIN_EVAL_TOKENS}, got {args.max_tokens}")
    if (args.edit is None) != (args.edit_at is None):
        raise ConfigError("--edit and --edit-at go together (an edit, and the token count "
                          "after which it is applied)")
    if args.edit is not None:
        from sim.app.quality import parse_edit

        parse_edit(args.edit, where="--edit")  # a bad name fails before any run
    bits = _bits(args)
    src, ids, name = eval_tokens(args.model, args.text)
    ids = ids[: args.max_tokens] if args.max_tokens else ids
    limit = src.config.max_position_embeddings
    if len(ids) > limit:  # before anything is compiled
        raise ConfigError(f"--text {name}: {len(ids):,} tokens exceed the {limit:,}-token "
                          f"context of model {src.name!r} (max_position_embeddings); "
                          f"--max-tokens {limit} uses its first {limit:,}")
    if args.edit is not None:
        return eval_edit(args, console, src, ids, name, bits)
    q = evaluate(src, ids, bits=bits, kv=args.kv, hw=args.hw,
                 allow_degenerate=args.allow_degenerate)
    out = {"text": name, **q.as_dict()}
    if args.json:
        print(json.dumps(out))
        return 0
    t = Table(title=f"{q.model} ({'real' if q.real_weights else 'synthetic'} weights) "
                    f"{q.bits} kv={q.kv} read={q.kv_read} on {q.hw}: {q.tokens} tokens "
                    f"of {escape(name)}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for key in ("perplexity", "reference_perplexity", "kl_mean", "kl_max", "top1_agreement"):
        t.add_row(key + (" (nats)" if key.startswith("kl") else ""), f"{out[key]:.6g}")
    t.add_row("prefill time (simulated, s)", f"{q.prefill_s:.6g}")
    for b in q.buckets:  # damage against context length
        t.add_row(f"positions {b.start}-{b.end - 1}: KL mean (nats) / top-1",
                  f"{b.kl_mean:.6g} / {b.top1_agreement:.4g}")
    console.print(t)
    if q.degenerate:
        console.print(f"[bold red]DEGENERATE NPU output[/]: {escape(q.degenerate)}")
    return 0


def eval_edit(args: argparse.Namespace, console: Console, src, ids: list[int], name: str,
              bits) -> int:
    """``kvsim eval --edit E --edit-at N``: the edit on the host and, where the device has
    the op, on the device, each beside the same predictions without the edit."""
    from sim.app.quality import evaluate_edit, parse_edit

    edit = parse_edit(args.edit, where="--edit")
    if not 1 <= args.edit_at <= len(ids) - 2:
        raise ConfigError(f"--edit-at: must lie in 1..{len(ids) - 2} (the text has "
                          f"{len(ids)} tokens; predictions must follow the edit), got "
                          f"{args.edit_at}")
    from sim.runtime.cacheops import CacheOpError

    def run(side: str):
        return evaluate_edit(src, ids, bits=bits, edit=edit, at=args.edit_at, kv=args.kv,
                             side=side, hw=args.hw, allow_degenerate=args.allow_degenerate)

    rows, refused = [run("host")], None
    if edit.device is not None:
        try:
            rows.append(run("device"))
        except CacheOpError as err:  # e.g. a region the device's scratch area cannot hold
            refused = str(err)
    if args.json:
        print(json.dumps({"text": name, "edits": [r.as_dict() for r in rows],
                          "device_refused": refused}))
        return 0
    u = rows[0].unedited
    t = Table(title=f"{u.model} {u.bits} kv={u.kv} read={u.kv_read} on {u.hw}: "
                    f"{escape(edit.label)} after {args.edit_at} of {u.tokens} tokens of "
                    f"{escape(name)} (predictions {args.edit_at}..{u.tokens - 2})")
    for col in ("edit on", "perplexity", "KL mean (nats)", "top-1", "edit time (simulated, "
                "us)", "PCIe bytes", "DRAM bytes", "cache tokens after"):
        t.add_column(col, justify="right")
    t.add_row("(no edit)", f"{u.perplexity:.6g}", f"{u.kl_mean:.6g}",
              f"{u.top1_agreement:.4g}", "", "", "", "")
    for r in rows:
        q = r.quality
        t.add_row(r.side, f"{q.perplexity:.6g}", f"{q.kl_mean:.6g}", f"{q.top1_agreement:.4g}",
                  f"{r.time_s * 1e6:.3f}", str(r.pcie_bytes), str(r.dram_bytes),
                  str(r.new_cache_size))
    console.print(t)
    if refused:
        console.print(f"the device refused the edit: {escape(refused)}")
    return 0


def cmd_generate(args: argparse.Namespace, console: Console) -> int:
    from sim.app.textgen import Sampler, generate

    sampler = Sampler(temperature=args.temperature, seed=args.seed)
    speculate = None
    if args.speculate is not None:
        from sim.runtime.speculative import parse_speculate

        speculate = parse_speculate(args.speculate, where="--speculate")  # before any run
    bits = _bits(args)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    if not args.json:
        console.print(f"[bold]NPU[/] ({escape(args.model)} {args.bits} kv={args.kv} on "
                      f"{args.hw}):")
    g = generate(args.model, args.prompt, max_new_tokens=args.max_new_tokens, bits=bits,
                 kv=args.kv, hw=args.hw, chat=args.chat, sampler=sampler,
                 allow_degenerate=args.allow_degenerate,
                 on_text=None if args.json else show, speculate=speculate)
    if args.json:
        print(json.dumps(g.as_dict()))
        return 0
    sys.stdout.write("\n")
    console.print("[bold]float reference[/]:")
    console.print(escape(g.reference_text), highlight=False)
    if g.first_difference is None:
        console.print(f"identical for all {len(g.tokens)} tokens")
    else:
        console.print(f"first difference at output token {g.first_difference}")
    console.print(f"TTFT {g.ttft_s * 1e3:.3f} ms, {g.time_per_token_s * 1e3:.3f} ms per "
                  f"output token (simulated, {g.hw}; prompt {g.prompt_tokens} tokens)")
    if g.speculation is not None:
        print_speculation(console, g.speculation)
    if g.degenerate:
        console.print(f"[bold red]DEGENERATE NPU output[/]: {escape(g.degenerate)}")
    return 0


def print_speculation(console: Console, spec: SpeculationFigures) -> None:
    """The totals of a speculative generation (and a self-draft's DRAM figures)."""
    s = spec.summary
    t = Table(title=f"speculative decoding: {escape(spec.spec)} ({escape(s.drafter)}, "
                    f"cut={s.cut})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [("verification calls", f"{s.verify_calls} ({s.rounds_with_drafts} with drafts)"),
            ("tokens drafted / accepted", f"{s.drafted_tokens} / {s.accepted_tokens}"),
            ("acceptance rate", f"{s.acceptance_rate:.3f}"),
            ("tokens per verification call", f"{s.tokens_per_verify_call:.3f}")]
    for v, what in ((s.draft_s, "draft"), (s.verify_s, "verify"), (s.cut_s, "tail cut")):
        share = v / s.decode_s if s.decode_s else 0.0
        rows.append((f"{what} time (simulated)", f"{v * 1e3:.3f} ms ({share:.1%})"))
    rows.append(("decode tokens/s (simulated)", f"{s.decode_tokens_per_s:.2f}"))
    for r in rows:
        t.add_row(*r)
    console.print(t)
    if spec.dram is not None and spec.layers is not None:
        d = spec.dram
        console.print(f"self-draft layers {len(spec.layers)}: reads "
                      f"{d.draft_shared_weight_bytes / 1e6:.2f} MB of the model's weights "
                      f"in place; its own parameters {d.draft_own_bytes / 1e3:.1f} kB; "
                      f"weights copied: {d.draft_copied_weight_bytes} bytes")


def add_text_parsers(sub) -> None:
    """Register ``kvsim eval`` and ``kvsim generate`` (``sim.app.cli.main.build_parser``)."""
    e = sub.add_parser("eval", help="teacher-forced quality of the NPU's integer pipeline "
                       "against the float reference (perplexity, KL, top-1 agreement)")
    e.add_argument("--text", default=None,
                   help="a UTF-8 text file (default: models/data/english.txt)")
    e.add_argument("--max-tokens", type=int, default=None,
                   help="use only the first N tokens of the text")
    e.add_argument("--edit", default=None,
                   help="a host-side cache edit after --edit-at tokens, reported beside the "
                        "same edit on the device where it has the op: requantize:FORMAT, "
                        "evict:SINKS,RECENT,BUDGET, drop:FIRST-LAST")
    e.add_argument("--edit-at", type=int, default=None,
                   help="apply --edit after this many tokens; the figures cover the later "
                        "predictions")
    _bit_options(e)
    e.set_defaults(func=cmd_eval)
    g = sub.add_parser("generate", help="continue a prompt on the NPU beside the float "
                       "reference; TTFT and time per token on the preset")
    g.add_argument("--prompt", required=True, help="the prompt text")
    g.add_argument("--max-new-tokens", type=int, default=32,
                   help="most tokens to generate (default %(default)s)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat "
                   "template (one user turn)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (default); > 0: softmax sampling at this temperature")
    g.add_argument("--speculate", default=None, metavar="SPEC",
                   help="speculative decoding: prompt-lookup:k=K[,ngram=N] or "
                        "self:layers=N,k=K (or self:skip=A-B,k=K); add ,cut=window|rejected|"
                        "host for how rejected drafts leave the cache (default window: "
                        "filter_cache_tail over the verified tokens)")
    _bit_options(g)
    g.set_defaults(func=cmd_generate)


__all__ = ["add_text_parsers", "cmd_eval", "cmd_generate", "eval_edit", "eval_tokens"]
