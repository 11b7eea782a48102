"""Attention accuracy of KV formats on the integer path, with and without outlier key
channels, next to each format's bytes per token.

Inputs: Gaussian Q/K/V (``--tokens`` cached tokens, 4 queries, 8 query heads over 2 KV heads,
head_dim 64). "outlier" keys scale channels 3, 17 and 40 by 12 and shift them by 6, the
pattern of massive key channels in real LLMs (KIVI, fig. 2). Errors are relative L2 and
cosine similarity of the int8 attention output against float64 attention on the same
inputs (``isa.accuracy``). Usage: ``python benchmarks/kv_accuracy.py [--json]``.

``--mla``: the whole model instead: functional MLA (``tiny-mla-dense``, synthetic W8
weights, the tiny hardware) with its latent cache in bf16, QuantMLA C4R4 and C2R4; a
``--prompt``-token prefill (past QuantMLA's 4 sink and 128 window tokens) and 6 decode
steps, each call's logit cosine to the float reference with the same W8 weights, beside
the cache's bytes per token and layer at that context and DeepSeek-V2-Lite's (576-wide
records) at 32K tokens.
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


MLA_FORMATS = ("bf16", "quantmla-c4r4", "quantmla-c2r4")
MLA_DECODE_STEPS = 6
DSV2_RECORD = 576  # DeepSeek-V2(-Lite) record: kv_lora_rank 512 + qk_rope_head_dim 64
LONG_CONTEXT = 32768


def run_mla(prompt: int) -> list[dict]:
    """Logit cosines of functional MLA per latent-cache format (see the module docstring)."""
    from models.bits import build_bit_config
    from models.compiler import HardwareTarget, compile_model
    from models.reference import ReferenceModel
    from models.source import load_preset
    from sim.device.hw import load_hardware
    from sim.runtime import Accelerator, Model

    hw = load_hardware("tiny")
    cfg = load_preset("tiny-mla-dense")
    width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, size=prompt + MLA_DECODE_STEPS)
    rows = []
    for name in MLA_FORMATS:
        cm = compile_model(cfg, build_bit_config({"weights": "W8"}), HardwareTarget.from_hw(hw),
                           kv=name, functional=True, core_mode="single", max_seq=prompt,
                           cap=prompt + MLA_DECODE_STEPS)
        model = Model(cm)
        model.launch(Accelerator(hw=hw, functional=True))
        ref = ReferenceModel(cfg, cm.weight_source(), weight_bits=cm.bits.weights)
        want, emb = ref.prefill(toks), ref.embed(toks)
        got = [model.infer(emb[:prompt], cache_size=0)[0]]
        got += [model.infer(emb[i:i + 1], cache_size=i)[0]
                for i in range(prompt, prompt + MLA_DECODE_STEPS)]
        cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
               for a, b in zip(got, want[prompt - 1:], strict=True)]
        fmt = kf.parse(name)
        ctx = prompt + MLA_DECODE_STEPS
        rows.append({"format": name, "mean_logit_cosine": float(np.mean(cos)),
                     "min_logit_cosine": min(cos),
                     "tiny_bytes_per_token_per_layer": fmt.bytes(ctx, width) / ctx,
                     "dsv2_bytes_per_token_per_layer_32k":
                         fmt.bytes(LONG_CONTEXT, DSV2_RECORD) / LONG_CONTEXT})
    return rows


def main_mla(prompt: int, as_json: bool) -> None:
    rows = run_mla(prompt)
    if as_json:
        print(json.dumps({"prompt_tokens": prompt, "decode_steps": MLA_DECODE_STEPS,
                          "rows": rows}, indent=2))
        return
    print(f"functional MLA, tiny-mla-dense (synthetic W8 weights), {prompt}-token prompt + "
          f"{MLA_DECODE_STEPS} decode steps; logit cosine to the float reference")
    print(f"{'latent cache':16s} {'mean cos':>9s} {'min cos':>8s} {'B/tok tiny':>10s} "
          f"{'B/tok DSv2 32K':>14s}")
    for r in rows:
        print(f"{r['format']:16s} {r['mean_logit_cosine']:9.4f} {r['min_logit_cosine']:8.4f} "
              f"{r['tiny_bytes_per_token_per_layer']:10.1f} "
              f"{r['dsv2_bytes_per_token_per_layer_32k']:14.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="cached tokens")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--mla", action="store_true",
                    help="functional MLA end to end per latent-cache format")
    ap.add_argument("--prompt", type=int, default=150, help="--mla: prompt tokens")
    args = ap.parse_args()
    if args.mla:
        main_mla(args.prompt, args.json)
        return
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
