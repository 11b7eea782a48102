"""The cost-against-k, break-even and serving parts of ``benchmarks/speculative.py``, and
its markdown tables."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from sim.app.breakdown import Labelled, time_breakdown
from sim.app.serve.config import build_serve_config
from sim.app.serve.run import run_serving
from sim.runtime.speculative import parse_speculate
from sim.runtime.speculative.drafters import lookup_host_ns
from sim.runtime.speculative.spec import DEFAULT_NGRAM, MAX_K

#: Resources of a call's breakdown shown in the cost table (``time_breakdown`` keys).
RESOURCES = ("dram_weights_s", "dram_kv_cache_s", "compute_s", "host_link_s",
             "runtime_overhead_s", "program_launch_s")


def _one(b, setup, fn) -> dict:
    """The calls ``fn(setup(model))`` makes on a fresh launch: their time, the resource
    demands of their breakdown and the critical one."""
    m = b.launch()
    obj = setup(m)
    acc = m.acc
    before = acc.num_calls
    fn(obj)
    calls = acc.calls_since(before)
    tb = time_breakdown([Labelled(c, "x", 0, 0, 0) for c in calls], b.hw)["x"]
    return {"time_s": sum(c.time_s for c in calls), "critical": tb.critical,
            **{k: getattr(tb, k) or 0.0 for k in RESOURCES}}


def call_costs(b, context: int, self_layers: int, max_kept: int) -> dict:
    """One call of each kind at a cache of ``context`` tokens (timing-only)."""
    e = b.embed
    out: dict = {"context": context, "m_tile": b.cm.m_tile, "self_draft_layers": self_layers}
    out["decode"] = _one(b, lambda m: m, lambda m: m.infer(e([0]), cache_size=context))
    out["verify"] = {k: _one(b, lambda m: m, lambda m, k=k: m.infer(
        e([0] * (k + 1)), cache_size=context, all_logits=True)) for k in range(1, MAX_K + 1)}
    spec = parse_speculate(f"self:layers={self_layers},k=1")
    out["draft"] = _one(b, lambda m: b.drafter(spec, m).draft,
                        lambda d: d.infer(e([0]), context))
    out["cut_window"] = {kept: _one(b, lambda m: m, lambda m, kept=kept: m.filter_cache_tail(
        context + MAX_K + 1, MAX_K + 1, [i < kept for i in range(MAX_K + 1)]))
        for kept in range(1, max_kept + 1)}
    out["cut_rejected"] = _one(b, lambda m: m, lambda m: m.filter_cache_tail(
        context + 8, 4, [False] * 4))
    out["lookup_s"] = lookup_host_ns(b.hw, context, DEFAULT_NGRAM) / 1e9
    return out


def round_cost(c: dict, method: str, k: int, alpha: float, cut: str = "window") -> float:
    """Expected seconds of one round at draft length ``k`` when each draft is accepted with
    probability ``alpha`` (independently): drafts, the verification, and the tail cut of
    the rounds that reject (``window``: keeping ``a + 1`` tokens after ``a`` accepted)."""
    draft = c["lookup_s"] if method == "prompt-lookup" else k * c["draft"]["time_s"]
    t = draft + c["verify"][k]["time_s"]
    for a in range(k):  # rounds that accept a < k drafts cut their tail
        p = alpha ** a * (1 - alpha)
        t += p * (c["cut_window"][a + 1]["time_s"] if cut == "window"
                  else c["cut_rejected"]["time_s"])
    return t


def speedup(c: dict, method: str, k: int, alpha: float) -> float:
    """Decode speed against plain decoding under the i.i.d. model: tokens per round
    ``(1 - alpha**(k+1)) / (1 - alpha)`` over the round's expected time."""
    tokens = k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens * c["decode"]["time_s"] / round_cost(c, method, k, alpha)


def break_even(c: dict, method: str, k: int) -> float | None:
    """The per-draft acceptance below which speculation is slower than plain decoding
    (None: it never pays at this k, even with every draft accepted)."""
    if speedup(c, method, k, 1.0) <= 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(c, method, k, mid) < 1 else (lo, mid)
    return hi


def costs(args, hw, results: dict, timing_bench) -> dict:
    """Table 3 for the measured model and the timing model."""
    meas = results["measured"]
    out = {}
    for name in (args.model, args.timing_model):
        b = timing_bench(name, hw, meas["mean_prompt_tokens"], 2 * (MAX_K + 1))
        L = b.cm.model.num_layers
        # the self-draft of --drafters, its skipped fraction of the layers on this model
        base = next((d for d in args.drafters if d.startswith("self")), "self:layers=26")
        spec = parse_speculate(f"{base}{',' if ':' in base else ':'}k=1")
        keep = spec.layers if spec.layers is not None else L - 1
        layers = L - max(1, round((meas["num_layers"] - keep) * L / meas["num_layers"]))
        c = call_costs(b, meas["mean_prompt_tokens"], layers, max(args.ks) + 1)
        c["break_even"] = {m: {k: break_even(c, m, k) for k in args.ks}
                           for m in ("prompt-lookup", "self")}
        out[name] = c
    return out


def serving(args, results: dict) -> list[dict]:
    """Table 4: the serving config without speculation and with each drafter at k = 4,
    acceptance as measured; light load (the config) and every request at once."""
    tree = tomllib.loads(Path(args.serve_config).read_text())
    profiles = results["measured"]["profiles"]
    rows = []
    for load in ("config", "all_at_once"):
        for base in [None, *args.drafters, "prompt-lookup+host"]:
            t = copy.deepcopy(tree)
            t["serving"].pop("speculate", None)
            if load == "all_at_once":
                t["serving"]["workload"]["arrival"] = "all_at_once"
                t["serving"]["workload"].pop("rate_per_s", None)
            label = "none"
            if base is not None:
                cut = "host" if base.endswith("+host") else "window"
                b = base.removesuffix("+host")
                measured = parse_speculate(f"{b}{',' if ':' in b else ':'}k=4").text()
                spec = parse_speculate(f"{measured},cut={cut}" if cut != "window" else measured)
                num_layers = results["measured"]["num_layers"]
                drafter = spec.text()
                if spec.method == "self":  # the same fraction of skipped layers
                    from models.source import load_model

                    L = load_model(t["model"]["preset"], where="model").num_layers
                    skipped = max(1, round((num_layers - spec.layers) * L / num_layers))
                    drafter = f"self:layers={L - skipped},k=4"
                counts = profiles[measured]["counts"]
                t["serving"]["speculate"] = {"drafter": drafter, "acceptance_counts": counts}
                label = drafter
            m = run_serving(build_serve_config(t)).metrics.serving
            row = {"load": load, "drafter": label,
                   **{k: getattr(m, k) for k in ("output_tokens_per_s", "tpot_s_p50",
                                                 "tpot_s_p90", "ttft_s_p50",
                                                 "mean_batch_tokens", "steps")}}
            if m.speculation is not None:
                row |= {k: getattr(m.speculation, k) for k in (
                    "acceptance_rate", "tokens_per_verification", "draft_s", "tail_cut_s",
                    "tail_cuts")}
            rows.append(row)
            print(f"serve {load} {label}: {row['output_tokens_per_s']:.1f} tokens/s, TPOT p50 "
                  f"{row['tpot_s_p50'] * 1e3:.2f} ms", flush=True)
    return rows


# --- markdown ----------------------------------------------------------------------------

def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def _spec_rows(rows: list[dict]) -> list[list]:
    return [[r["drafter"], r["k"], f"{r['acceptance_rate']:.3f}", f"{r['tokens_per_verify']:.2f}",
             f"{r['tokens_per_s']:.1f}", f"{r['plain_tokens_per_s']:.1f}",
             f"{r['speedup']:.2f}x", f"{r['draft_share']:.1%}", f"{r['verify_share']:.1%}",
             f"{r['cut_share']:.1%}"] for r in rows]


SPEC_HEAD = ["drafter", "k", "acceptance rate", "tokens / verify call", "tokens/s",
             "plain tokens/s", "vs plain", "draft share", "verify share", "tail-cut share"]


def tables(results: dict) -> str:
    meas = results["measured"]
    out = [f"### {meas['model']} on {meas['hw']} (functional, greedy; "
           f"{len(meas['prompts'])} prompts, identical text with and without speculation)",
           "", _table(SPEC_HEAD, _spec_rows(meas["rows"])), ""]
    names = list(meas["prompts"])
    out += ["Per prompt (speed against plain decoding):", "",
            _table(["drafter", *names], [[r["drafter"], *(
                f"{r['per_prompt'][n]['speedup']:.2f}x" for n in names)]
                for r in meas["rows"]]), ""]
    if "timing" in results:
        t = results["timing"]
        out += [f"### {t['model']} on {meas['hw']} (timing-only, {t['prompt_tokens']}-token "
                f"prompt, {t['new_tokens']} tokens; acceptance drawn from the counts measured "
                f"on {meas['model']})", "", _table(SPEC_HEAD, _spec_rows(t["rows"])), ""]
    for name, c in results.get("costs", {}).items():
        d = c["decode"]["time_s"]
        ks = [1, 2, 4, 8, 16, c["m_tile"] - 1, c["m_tile"], 31]
        ks = sorted({k for k in ks if 1 <= k <= MAX_K})
        out += [f"### Call costs, {name} (timing-only, cache of {c['context']} tokens; "
                f"token tile {c['m_tile']}; plain decode {d * 1e3:.3f} ms)", "",
                _table(["call", "time (ms)", "vs decode", "critical",
                        *[k[:-2].replace("_", " ") + " (ms)" for k in RESOURCES]],
                       [[lbl, f"{v['time_s'] * 1e3:.3f}", f"{v['time_s'] / d:.3f}",
                         v["critical"], *(f"{v[k] * 1e3:.3f}" for k in RESOURCES)]
                        for lbl, v in [("decode (1 token)", c["decode"]),
                                       *((f"verify k={k} ({k + 1} tokens)", c["verify"][k])
                                         for k in ks),
                                       (f"self-draft call ({c['self_draft_layers']} layers)",
                                        c["draft"]),
                                       *((f"tail cut, window, {n} kept", c["cut_window"][n])
                                         for n in (1, 2, 5, 9) if n in c["cut_window"]),
                                       ("tail cut, rejected only", c["cut_rejected"])]]), "",
                "Break-even per-draft acceptance (below it speculation is slower than plain "
                "decoding; i.i.d. acceptance, window cuts):", "",
                _table(["drafter", *(f"k={k}" for k in c["break_even"]["self"])],
                       [[m, *("never" if v is None else f"{v:.3f}" for v in be.values())]
                        for m, be in c["break_even"].items()]), ""]
    if "serving" in results:
        out += ["### Serving (the config's requests; and all at once)", "",
                _table(["load", "drafter", "output tokens/s", "TPOT p50 (ms)", "TPOT p90 (ms)",
                        "TTFT p50 (s)", "acceptance", "tokens / verification",
                        "tail cuts (s)"],
                       [[r["load"], r["drafter"], f"{r['output_tokens_per_s']:.1f}",
                         f"{r['tpot_s_p50'] * 1e3:.2f}", f"{r['tpot_s_p90'] * 1e3:.2f}",
                         f"{r['ttft_s_p50']:.3f}",
                         f"{r['acceptance_rate']:.3f}" if "acceptance_rate" in r else "",
                         f"{r['tokens_per_verification']:.2f}" if "acceptance_rate" in r else "",
                         f"{r['tail_cut_s']:.3f}" if "acceptance_rate" in r else ""]
                        for r in results["serving"]]), ""]
    return "\n".join(out)
