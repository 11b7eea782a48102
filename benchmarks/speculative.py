"""Speculative decoding on the simulated card, every table in one command:

1. **measured** (functional, ``--model``, default SmolLM2-135M-Instruct with its real
   weights, W8, the ``w8`` numerics, int8 KV, on ``--hw``, default ``aries``): greedy
   decoding of every prompt of ``spec_prompts.py``, then each drafter x k speculatively;
   the text must be identical (the command fails if it is not), and per drafter x k:
   acceptance rate, tokens per verification call, simulated decode tokens/s against plain
   decoding, and the share of decode time spent drafting, verifying and cutting tails;
2. **timing** (``--timing-model``, default Llama-3.2-1B, timing-only, its synthetic
   weights): the same drafters and k, with each one's acceptance as measured in (1)
   (its ``(drafted, accepted)`` counts, drawn seeded); a self-draft skips the same
   fraction of the model's layers;
3. **costs against k** (both models, timing-only, at the mean prompt length of context):
   a plain decode call, a verification call of k + 1 tokens for every k, a self-draft
   call and the tail cuts, each call's time and where it goes (the run's
   ``time_breakdown`` resources), and the break-even per-draft acceptance (Leviathan et
   al.'s i.i.d. model) at which speculation stops paying;
4. **serving** (``--serve-config``, default ``configs/serving-speculative.toml``): the
   serving simulator without speculation and with each drafter at k = 4 (acceptance as
   measured in (1)): output tokens/s and time per output token.

    python benchmarks/speculative.py [--ks 1 2 4 8] [--new-tokens 64] [--out spec-bench]
                                     [--drafters prompt-lookup self:layers=26]
                                     [--skip-timing] [--skip-serving]

Writes ``tables.md`` and ``results.json`` (with every measured profile) into ``--out``.
Peak RSS is the process's.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_prompts import PROMPTS  # noqa: E402

from kvsim.files import atomic_write_text  # noqa: E402
from models.compiler import CompiledModel  # noqa: E402
from sim.app.quality import bit_config, ready_for_text  # noqa: E402
from sim.runtime import Model, ModelConfig  # noqa: E402
from sim.runtime.draft import launch_draft  # noqa: E402
from sim.runtime.ready import ReadyModel, hardware_of, source_of  # noqa: E402
from sim.runtime.speculative import AcceptanceProfile, parse_speculate  # noqa: E402
from sim.runtime.speculative.decode import plain_decode, speculative_decode  # noqa: E402
from sim.runtime.speculative.drafters import ModelDrafter, PromptLookup  # noqa: E402
from sim.runtime.speculative.selfdraft import compile_self_draft, shared_regions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class Bench:
    """A ready model, its self-drafts (compiled once each) and fresh launches."""

    def __init__(self, ready: ReadyModel):
        self.ready, self.cm, self.hw = ready, ready.compiled, ready.hw
        self.functional = ready.functional
        hidden = self.cm.model.hidden_size
        self.embed = ((lambda ts: ready.embed(list(ts))) if self.functional else
                      (lambda ts: np.zeros((len(list(ts)), hidden), np.float32)))
        self.drafts: dict[tuple[int, ...], CompiledModel] = {}

    def launch(self) -> Model:
        gc.collect()
        return self.ready.launch(ModelConfig(all_logits=True))

    def drafter(self, spec, model: Model):
        if spec.method == "prompt-lookup":
            return PromptLookup(model.acc, ngram=spec.ngram)
        keep = spec.keep(self.cm.model.num_layers)
        if keep not in self.drafts:
            self.drafts[keep] = compile_self_draft(self.cm, keep, self.hw)
        dm = launch_draft(model, self.drafts[keep], shared_regions(keep))
        return ModelDrafter(dm, self.embed, shares_cache=True)


def spec_for(base: str, k: int, num_layers: int | None = None, of_layers: int | None = None):
    """``base`` (a drafter spec without k) at draft length ``k``; a self-draft's layer
    count scaled from ``of_layers`` to a model of ``num_layers`` layers."""
    spec = parse_speculate(f"{base}{',' if ':' in base else ':'}k={k}", where="--drafters")
    if spec.method == "self" and num_layers and of_layers and spec.layers is not None:
        skipped = round((of_layers - spec.layers) * num_layers / of_layers)
        spec = parse_speculate(f"self:layers={num_layers - max(1, skipped)},k={k}")
    return spec


def measured(args, hw) -> dict:
    """Table 1: plain and speculative decoding of every prompt, functional."""
    src = source_of(args.model)
    tok = src.tokenizer() if src.real else None
    if tok is not None:
        prompts = {n: tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
                   for n, p in PROMPTS.items()}
    else:  # synthetic weights, no tokenizer (a smoke run): seeded ids, a span repeated
        rng = np.random.default_rng(args.seed)
        span = rng.integers(0, src.config.vocab_size, size=12).tolist()
        prompts = {n: rng.integers(0, src.config.vocab_size, size=8).tolist() + span * 2
                   for n in list(PROMPTS)[:2]}
    eos = tok.eos_id if tok is not None else None
    bits = bit_config("W8", real_weights=src.real)
    b = Bench(ready_for_text(src, bits, kv="int8", hw=hw,
                             tokens=max(map(len, prompts.values())) + args.new_tokens))
    cm = b.cm
    plain = {}
    for name, ids in prompts.items():
        m = b.launch()
        toks, _, times = plain_decode(m, ids, max_new_tokens=args.new_tokens, embed=b.embed,
                                      eos_id=eos)
        plain[name] = {"tokens": toks, "decode_s": sum(times), "calls": len(times)}
        print(f"plain {name}: {len(ids)} prompt tokens, {len(toks)} new: "
              f"{(tok.decode(toks) if tok else toks)!r:.60}", flush=True)
    rows, profiles = [], {}
    for base in args.drafters:
        for k in args.ks:
            spec = spec_for(base, k)
            rounds, per_prompt = [], {}
            for name, ids in prompts.items():
                m = b.launch()
                res = speculative_decode(m, ids, drafter=b.drafter(spec, m), k=k,
                                         max_new_tokens=args.new_tokens, embed=b.embed,
                                         eos_id=eos, cut=spec.cut)
                if res.tokens != plain[name]["tokens"]:
                    raise SystemExit(f"{spec.text()} on {name}: the text differs from plain "
                                     f"greedy decoding")
                rounds += res.rounds
                s = res.summary()
                per_prompt[name] = {"speedup": plain[name]["decode_s"] / s.decode_s
                                    * s.decode_tokens / max(1, plain[name]["calls"]),
                                    "acceptance_rate": s.acceptance_rate}
            plain_s = sum(p["decode_s"] for p in plain.values())
            plain_tokens = sum(p["calls"] for p in plain.values())
            row = summarize(spec.text(), k, rounds, plain_tokens / plain_s)
            row["per_prompt"] = per_prompt
            rows.append(row)
            profiles[spec.text()] = AcceptanceProfile.measured(
                [(r.drafted, r.accepted) for r in rounds], k).to_json()
            print(line(row), flush=True)
    return {"model": src.name, "hw": hw.name, "prompts": {n: len(v) for n, v in
                                                          prompts.items()},
            "plain": {n: {"decode_tokens": p["calls"], "decode_s": p["decode_s"],
                          "text": tok.decode(p["tokens"]) if tok else p["tokens"]}
                      for n, p in plain.items()},
            "rows": rows, "profiles": profiles, "num_layers": cm.model.num_layers,
            "mean_prompt_tokens": int(np.mean([len(v) for v in prompts.values()]))}


def summarize(spec: str, k: int, rounds, plain_tps: float) -> dict:
    """One table row from the rounds of every prompt."""
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    t = {key: sum(getattr(r, key) for r in rounds) for key in ("draft_s", "verify_s", "cut_s")}
    total = sum(t.values())
    tokens = sum(r.emitted for r in rounds)
    tps = tokens / total
    return {"drafter": spec, "k": k, "acceptance_rate": accepted / drafted if drafted else 0.0,
            "tokens_per_verify": tokens / len(rounds), "rounds": len(rounds),
            "drafted": drafted, "accepted": accepted, "tokens_per_s": tps,
            "plain_tokens_per_s": plain_tps, "speedup": tps / plain_tps,
            **{f"{key[:-2]}_share": v / total for key, v in t.items()}}


def line(r: dict) -> str:
    return (f"{r['drafter']}: acceptance {r['acceptance_rate']:.3f}, "
            f"{r['tokens_per_verify']:.2f} tokens/verify, {r['tokens_per_s']:.1f} vs "
            f"{r['plain_tokens_per_s']:.1f} tokens/s ({r['speedup']:.2f}x), tail cuts "
            f"{r['cut_share']:.1%}")


def timing_bench(name: str, hw, prompt_tokens: int, new_tokens: int) -> Bench:
    src = source_of(name)
    return Bench(ready_for_text(src, bit_config("W8", numerics="w8"), kv="int8", hw=hw,
                                tokens=prompt_tokens + new_tokens, functional=False))


def timing(args, hw, meas: dict) -> dict:
    """Table 2: the timing model with the acceptance measured in table 1."""
    prompt = meas["mean_prompt_tokens"]
    new = args.new_tokens * len(meas["prompts"])
    b = timing_bench(args.timing_model, hw, prompt, new)
    m = b.launch()
    _, _, times = plain_decode(m, [0] * prompt, max_new_tokens=new, embed=b.embed)
    plain_tps = len(times) / sum(times)
    rows = []
    for base in args.drafters:
        for k in args.ks:
            src_spec = spec_for(base, k)
            spec = spec_for(base, k, b.cm.model.num_layers, meas["num_layers"])
            prof = AcceptanceProfile.from_json(meas["profiles"][src_spec.text()])
            m = b.launch()
            res = speculative_decode(m, [0] * prompt, drafter=b.drafter(spec, m), k=k,
                                     max_new_tokens=new, embed=b.embed, cut=spec.cut,
                                     profile=prof, seed=args.seed)
            row = summarize(spec.text(), k, res.rounds, plain_tps)
            row["acceptance_from"] = src_spec.text()
            rows.append(row)
            print(f"{args.timing_model} " + line(row), flush=True)
    return {"model": args.timing_model, "prompt_tokens": prompt, "new_tokens": new,
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--timing-model", default="llama-3.2-1b")
    ap.add_argument("--hw", default="aries")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--drafters", nargs="+", default=["prompt-lookup", "self:layers=26"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve-config", default=str(ROOT / "configs/serving-speculative.toml"))
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-serving", action="store_true")
    ap.add_argument("--out", default="spec-bench")
    args = ap.parse_args()
    for base in args.drafters:
        spec_for(base, 1)  # a bad spec fails before anything runs
    hw = hardware_of(args.hw)
    t0 = time.perf_counter()
    results: dict = {"measured": measured(args, hw)}
    print(f"wall {time.perf_counter() - t0:.0f} s", flush=True)
    if not args.skip_timing:
        results["timing"] = timing(args, hw, results["measured"])
    from spec_tables import costs, serving, tables

    results["costs"] = costs(args, hw, results, timing_bench)
    if not args.skip_serving:
        results["serving"] = serving(args, results)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    results["peak_rss_bytes"] = peak
    results["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = tables(results)
    atomic_write_text(out / "tables.md", md)
    atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=str))
    print(md)
    print(f"wall {results['wall_s']:.0f} s; peak RSS {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
