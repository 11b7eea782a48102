"""Predictions beside the fit: TTFT and decode of every model kvsim has a config for, on
the fitted ``aries`` preset, in the validation scenario (``configs/validate-llama-3.2-1b.toml``:
240 prompt tokens in host chunks of 128, 10 output tokens, W8, int8 KV, the numerics the
config names), as a client of the serving stack would measure them, beside the card's own
figures and the previous round's preset (what moved, and why).

``python -m sim.app.calibration predict`` prints the table; their published MLA100 figures,
where there are any, are kept outside the repo for checking. A model whose architecture the
config's numerics do not build (MLA and MoE models under ``w8``) is predicted with the int8
dataflow (``static-int8``) and says so: its time then does not come from numerics that would
run its real checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.errors import KvsimError
from sim.app.calibration.fit import MODEL_CONFIGS, Card, Published, card, client, passes, run_config

#: The model presets predicted (the test devices' small models left out).
PRESETS = ("qwen2.5-0.5b", "exaone-4.0-1.2b", "llama-3.2-1b", "command-r7b",
           "deepseek-v2-lite", "qwen1.5-moe-a2.7b", "mixtral-8x7b")
#: The preset as the previous round fitted it (one published point, the int8 dataflow, one
#: 240-token call, no serving stack): "before" in the table.
BEFORE_HW = {"sram.bytes_per_core": 229376, "dram.timing.row_run_bytes": 704,
             "dma.setup_latency_ns": 100.0, "stack.request_ns": 0.0, "stack.token_ns": 0.0}
BEFORE_SETS = ("bits.numerics.preset=static-int8", "compile.max_sequence_length=512")
FALLBACK_NUMERICS = "bits.numerics.preset=static-int8"


def models() -> dict[str, tuple[str, ...]]:
    """Each predicted model's name and the ``--set`` lines that select it."""
    out = {name: (f"model.preset={name}",) for name in PRESETS}
    for path in sorted(MODEL_CONFIGS.glob("*.json")):
        out.setdefault(path.stem, (f"model.hf_config={path}",))
    return out


@dataclass(frozen=True)
class Prediction:
    name: str
    numerics: str
    m_tile: int
    weight_tile_bytes: int
    decode_tile_bytes: int
    passes: int
    weight_bytes: int
    card: Card
    client: tuple[float | None, float]
    before: Card | None
    error: str = ""

    head_bytes: int = 0

    @property
    def weight_bytes_per_prefill_token(self) -> float:
        """Weight bytes streamed per prompt token, an estimate from the tile schedule: every
        pass streams the layers' weights, the head runs once per call on its last token
        (the run's own figure, ``prefill.weight_bytes_per_token``, also counts the small
        weight-kind regions, norms and parameters)."""
        layers = self.weight_bytes - self.head_bytes
        return (self.passes * layers + 2 * self.head_bytes) / 240


def predict_one(name: str, sets: tuple[str, ...], *, ttft: bool,
                before: bool) -> Prediction:
    point = Published(name, sets, 0.0, 1.0)
    numerics = "config"
    try:
        cfg = run_config(point, {})
        c = card(cfg, ttft=ttft)
    except KvsimError as err:
        if "bits.numerics" not in str(err):
            return _failed(name, str(err))
        numerics = "static-int8"
        point = Published(name, (*sets, FALLBACK_NUMERICS), 0.0, 1.0)
        try:
            cfg = run_config(point, {})
            c = card(cfg, ttft=ttft)
        except KvsimError as err2:
            return _failed(name, str(err2))
    from sim.app.calibration.fit import _compiled

    cm = _compiled(cfg)
    b = None
    if before:
        old = Published(name, (*sets, *BEFORE_SETS), 0.0, 1.0)
        b = card(run_config(old, BEFORE_HW), ttft=ttft)
    m = cm.model
    return Prediction(name, numerics, cm.m_tile, cm.tile_bytes, cm.big_tile_bytes,
                      passes(cfg), cm.mm.bytes_of_kind("weights"), c, client(cfg, c), b,
                      head_bytes=m.vocab_size * m.hidden_size * cm.bits.weights.head
                      // 8)


def _failed(name: str, why: str) -> Prediction:
    return Prediction(name, "-", 0, 0, 0, 0, 0, Card(None, 0.0), (None, 0.0), None, why)


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.1f}"


def rows(preds: list[Prediction]) -> list[dict[str, Any]]:
    """The table's rows: client figures (what a published measurement is), the card's,
    the tile schedule, and the change from the previous preset."""
    out = []
    for p in preds:
        if p.error:
            out.append({"model": p.name, "note": p.error})
            continue
        ttft, dec = p.client
        row = {"model": p.name, "numerics": p.numerics,
               "TTFT client ms": _ms(ttft), "tokens/s client": f"{1 / dec:.2f}",
               "TTFT card ms": _ms(p.card.ttft_s), "decode card ms": _ms(p.card.decode_s),
               "tokens/pass": p.m_tile, "passes": p.passes,
               "weight tile KiB": p.weight_tile_bytes // 1024,
               "decode tile KiB": p.decode_tile_bytes // 1024,
               "weights MB": f"{p.weight_bytes / 1e6:,.0f}",
               "MB streamed per prefill token (est.)":
                   f"{p.weight_bytes_per_prefill_token / 1e6:,.1f}"}
        if p.before is not None:
            b = p.before
            row["before: TTFT ms"] = _ms(b.ttft_s)
            row["before: tokens/s"] = f"{1 / b.decode_s:.2f}"
            if ttft is not None and b.ttft_s:
                row["TTFT moved"] = f"{(ttft / b.ttft_s - 1) * 100:+.1f} %"
            row["tokens/s moved"] = f"{(b.decode_s / dec - 1) * 100:+.1f} %"
        out.append(row)
    return out


def why() -> str:
    """Why the figures moved from the previous preset, for every model alike (from the
    fitted preset's values)."""
    from sim.device.hw import load_hardware

    hw = load_hardware("aries")
    return (
        "why: the previous preset was fitted to one point (the 1B) on the int8 dataflow, "
        "with no serving stack, so its row interference (704 B runs) stood in for every "
        "cost a 1B token has besides its bytes. Fitted to both points with the config's "
        f"numerics: row runs of {hw.dram.timing.row_run_bytes} B and "
        f"{hw.dma.setup_latency_ns:g} ns per transfer give the decode's cost per byte (the "
        "8B's slope), the rest of a 1B token is the serving stack's "
        f"({hw.stack.token_ns / 1e6:.2f} ms per token), so small models decode a little "
        "slower at the client and large ones faster; TTFT gains the stack's request cost "
        f"({hw.stack.request_ns / 1e6:.1f} ms), the host's 128-token chunks and the SRAM's "
        f"token tiles ({hw.sram.bytes_per_core // 1024} KiB per core, 224 before).")


def print_predictions(*, ttft: bool = True, only: list[str] | None = None,
                      before: bool = True) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    preds = []
    for name, sets in models().items():
        if only and name not in only:
            continue
        console.print(f"  {name} ...", highlight=False)
        preds.append(predict_one(name, sets, ttft=ttft, before=before))
    table_rows = rows(preds)
    cols: list[str] = []
    for r in table_rows:
        cols += [k for k in r if k not in cols]
    t = Table(title="predictions on aries (validation scenario: 240 + 10 tokens, W8, int8 KV)")
    for c in cols:
        t.add_column(c, overflow="fold")
    for r in table_rows:
        t.add_row(*(str(r.get(c, "")) for c in cols))
    console.print(t)
    console.print(why())
    return 0
