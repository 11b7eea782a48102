"""The eviction table: four policies (recent, StreamingLLM, H2O, SnapKV; ``sim.app.evict``)
cut a long cache to a budget, on the host (dump, edit, load) and on the device (its
compaction program), each beside what it forgets: pass-key retrieval with the cache cut
after the prompt, and the KL divergence of the next predictions of an English text with
the cache cut there, against the float reference with the whole context.

    python benchmarks/evictions.py [--context 4096] [--budgets 512,1024] [--trials 5]
                                   [--depths 0,25,50,75,100] [--kv int8] [--kv-read integer]
                                   [--after 512] [--positions text] [--out evictions]
                                   [--json]

KL: the first ``context - after`` tokens of ``models/data/long_english.txt`` teacher-forced,
the cache cut, the last ``after`` predicted (KL mean and top-1 over those). Retrieval: the
needle texts of ``kvsim needle`` at each depth (the same keys), the cache cut after the
prompt minus its last token, then the answer's positions read. Host and device edits keep
the same positions, so the same logits (checked on the KL text): their figures differ only
in cost. ``--positions``: where the tokens after the edit sit, ``text`` (their positions in
the text: every kept key at its true distance) or ``cache`` (the new cache size, as the
vendor's runtime places them; see ``sim.app.evict``). Writes ``evictions.md`` and
``evictions.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--budgets", default="512,1024")
    ap.add_argument("--policies", default="recent,streaming,h2o,snapkv")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--depths", default="0,25,50,75,100")
    ap.add_argument("--kv", default="int8")
    ap.add_argument("--kv-read", default="integer")
    ap.add_argument("--after", type=int, default=512)
    ap.add_argument("--positions", default="text", choices=("text", "cache"))
    ap.add_argument("--hw", default="aries")
    ap.add_argument("--out", default="evictions")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from kvsim.files import atomic_write_text
    from sim.app.evict import divergence, edit_costs, retrieval
    from sim.app.quality import bit_config
    from sim.runtime.ready import hardware_of, source_of

    src = source_of(a.model)
    bits = bit_config("W8", kv_read=a.kv_read)
    hw = hardware_of(a.hw)
    budgets = [int(x) for x in a.budgets.split(",")]
    policies = a.policies.split(",")
    depths = [float(x) / 100 for x in a.depths.split(",")]
    text = (ROOT / "models" / "data" / "long_english.txt").read_text()
    ids = src.tokenizer().encode(text)[: a.context]
    at = a.context - a.after
    say = None if a.json else (lambda m: print(m, flush=True))
    t0 = time.perf_counter()
    costs = edit_costs(src, bits, a.kv, hw, ids, at=at, budgets=budgets, policies=policies)
    kl = divergence(src, bits, a.kv, hw, ids, at=at, budgets=budgets, policies=policies,
                    positions=a.positions)
    found = retrieval(src, bits, a.kv, hw, context=a.context, budgets=budgets,
                      policies=policies, depths=depths, trials=a.trials,
                      positions=a.positions, progress=say)
    wall = time.perf_counter() - t0
    rows = []
    for p in policies:
        for b in budgets:
            hits = found[(p, b)]
            for side in ("host", "device"):
                c = costs[(p, b, side)]
                rows.append({"policy": p, "budget": b, "side": side,
                             "retrieved": sum(h for h, _ in hits) / len(hits),
                             "logprob_mean": sum(lp for _, lp in hits) / len(hits),
                             "kl_mean": kl[(p, b)][0], "top1_agreement": kl[(p, b)][1],
                             "edit_s": c.time_s, "pcie_bytes": c.pcie_bytes,
                             "dram_bytes": c.dram_bytes})
    lines = [f"{a.context} tokens, {a.kv} {a.kv_read}, next tokens at the {a.positions}'s "
             f"positions; no eviction: KL {kl['none'][0]:.4f}, "
             f"top-1 {kl['none'][1]:.3f} over the last {a.after} predictions", "",
             "| policy | budget | edit on | retrieved | key log-prob | KL (nats) | top-1 | "
             "edit time (simulated, us) | PCIe bytes | DRAM bytes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['budget']} | {r['side']} | {r['retrieved']:.0%} | "
                     f"{r['logprob_mean']:.2f} | {r['kl_mean']:.4f} | {r['top1_agreement']:.3f} "
                     f"| {r['edit_s'] * 1e6:,.1f} | {r['pcie_bytes']:,} | {r['dram_bytes']:,} |")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"context": a.context, "kv": a.kv, "kv_read": a.kv_read, "after": a.after,
            "positions": a.positions,
            "none": {"kl_mean": kl["none"][0], "top1_agreement": kl["none"][1]},
            "rows": rows, "wall_s": round(wall, 1)}
    atomic_write_text(out / "evictions.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "evictions.json", json.dumps(data))
    if a.json:
        print(json.dumps(data))
    else:
        print("\n".join(lines))
        print(f"{wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
