"""``python -m sim.app.calibration fit | predict``: fit the ``aries`` preset to both
published points (:mod:`sim.app.calibration.fit`), or predict every model config on it
(:mod:`sim.app.calibration.predict`)."""

from __future__ import annotations

from sim.app.calibration.fit import POINTS, fit
from sim.app.calibration.fit import __doc__ as fit_doc
from sim.app.calibration.predict import print_predictions


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sim.app.calibration",
                                 description=fit_doc.split("\n\n")[0])
    ap.add_argument("what", choices=("fit", "predict"), nargs="?", default="fit")
    ap.add_argument("--ttft", action=argparse.BooleanOptionalAction, default=True,
                    help="predict: also TTFT (a prefill of 240 tokens per model)")
    ap.add_argument("--models", nargs="*", default=None,
                    help="predict: only these (names of the table's rows)")
    ap.add_argument("--row-run", type=int, action="append", default=None,
                    help="fit: only these row runs (bytes; default: every reopen count "
                         "inside the bounds, a search of about half an hour)")
    args = ap.parse_args(argv)
    if args.what == "predict":
        return print_predictions(ttft=args.ttft, only=args.models)
    print("fitting the aries preset to both published points at once: "
          + "; ".join(f"{p.name} TTFT {p.ttft_s * 1e3:.2f} ms, {p.tokens_per_s} tokens/s"
                      for p in POINTS))
    res = fit(runs=args.row_run)
    from sim.device.hw import load_hardware

    aries = load_hardware("aries")
    for name, value in res.values.items():
        f = aries.fitted[name]
        inside = "inside" if f.low <= value <= f.high else "OUTSIDE"
        print(f"fitted {name} = {value:g} {f.unit}  (bounds {f.low:g} .. {f.high:g}: {inside})")
    for name, c in res.cards.items():
        ttft, dec = res.clients[name]
        print(f"{name}: card TTFT {c.ttft_s * 1e3:.2f} ms, decode {c.decode_s * 1e3:.3f} ms; "
              f"client TTFT {ttft * 1e3:.2f} ms, {1 / dec:.2f} tokens/s")
    print("residuals: " + ", ".join(f"{k} {v:+.2f} %" for k, v in res.residuals_pct().items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
