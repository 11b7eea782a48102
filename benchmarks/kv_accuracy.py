"""Attention accuracy of KV formats on the integer path, with and without outlier key
channels, next to each format's bytes per token.

Inputs: Gaussian Q/K/V (``--tokens`` cached tokens, 4 queries, 8 query heads over 2 KV heads,
head_dim 64). "outlier" keys scale channels 3, 17 and 40 by 12 and shift them by 6, the
pattern of massive key channels in real LLMs (KIVI, fig. 2). Errors are relative L2 and
cosine similarity of the int8 attention output against float64 attention on the same
inputs (``isa.accuracy``). Usage: ``python benchmarks/kv_accuracy.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import resource

import numpy as np

from isa import accuracy as acc
from isa import kvformats as kf

CASES = [
    ("bf16", "bf16", "bf16"),
    ("int8", "int8", "int8"),
    ("K b8 per-channel / V b8 per-token", "b8.channel.g32.asym", "b8.token.g32.asym"),
    ("K b4 per-channel / V b4 per-token", "b4.channel.g32.asym", "b4.token.g32.asym"),
    ("K b2 per-channel / V b2 per-token", "b2.channel.g32.asym", "b2.token.g32.asym"),
    ("K b4 per-token / V int8", "b4.token.g32.asym", "int8"),
    ("K b4 per-channel / V int8", "b4.channel.g32.asym", "int8"),
    ("K b2 per-token / V int8", "b2.token.g32.asym", "int8"),
    ("K b2 per-channel / V int8", "b2.channel.g32.asym", "int8"),
    ("kivi-4", "kivi-4.k", "kivi-4.v"),
    ("kivi-2", "kivi-2.k", "kivi-2.v"),
    ("qserve-kv4", "qserve-kv4", "qserve-kv4"),
]


def inputs(tokens: int, outliers: bool, seed: int = 7):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((4, 8, 64))
    k = rng.standard_normal((tokens, 2, 64))
    if outliers:
        k[:, :, [3, 17, 40]] = k[:, :, [3, 17, 40]] * 12 + 6
    v = rng.standard_normal((tokens, 2, 64))
    return q, k, v


def run(tokens: int) -> list[dict]:
    rows = []
    data = {o: inputs(tokens, o) for o in (False, True)}
    for label, kname, vname in CASES:
        kfmt, vfmt = kf.parse(kname, "k"), kf.parse(vname, "v")
        row = {"case": label, "k_format": str(kfmt), "v_format": str(vfmt),
               "kv_bytes_per_token_per_head": (kfmt.bytes(tokens, 64)
                                               + vfmt.bytes(tokens, 64)) / tokens}
        for o, (q, k, v) in data.items():
            r = acc.attention_accuracy(q, k, v, kfmt, vfmt)
            tag = "outlier" if o else "plain"
            row[f"{tag}_rel_l2"] = r.rel_l2
            row[f"{tag}_cosine"] = r.cosine
        rows.append(row)
    rng = np.random.default_rng(5)
    cache = rng.standard_normal((tokens, 576))
    cache[:, 512:] *= 3
    q = rng.standard_normal((4, 16, 576)) * 0.2
    for name in ("bf16", "quantmla-c4r4", "quantmla-c2r4"):
        r = acc.mla_attention_accuracy(q, cache, name, v_dim=512)
        rows.append({"case": f"MLA {name}", "k_format": name, "v_format": name,
                     "kv_bytes_per_token_per_head": kf.parse(name).bytes(tokens, 576) / tokens,
                     "plain_rel_l2": r.rel_l2, "plain_cosine": r.cosine})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="cached tokens")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    rows = run(args.tokens)
    # peak resident memory of this process (Linux reports ru_maxrss in KiB)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.json:
        print(json.dumps({"tokens": args.tokens, "rows": rows, "peak_rss_bytes": peak},
                         indent=2))
        return
    print(f"{args.tokens} cached tokens; bytes are K+V per token per KV head (head_dim 64; "
          "MLA: the 576-wide latent row)")
    print(f"{'case':36s} {'B/tok':>7s} {'plain relL2':>11s} {'cos':>8s} "
          f"{'outlier relL2':>13s} {'cos':>8s}")
    for r in rows:
        out = (f"{r.get('outlier_rel_l2', float('nan')):13.4f} "
               f"{r.get('outlier_cosine', float('nan')):8.5f}" if "outlier_rel_l2" in r else "")
        print(f"{r['case']:36s} {r['kv_bytes_per_token_per_head']:7.1f} "
              f"{r['plain_rel_l2']:11.4f} {r['plain_cosine']:8.5f} {out}")
    print(f"peak RSS {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
