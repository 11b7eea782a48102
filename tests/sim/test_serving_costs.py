"""Serving on the device model: the batched step program, the step cost grid against
direct simulation, KV geometry from the compiled model, an end-to-end ``kvsim serve``."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

from isa import kvformats
from isa.instructions import Attn, HostRead
from models.bits import BitConfig
from models.compiler import HardwareTarget, compile_model
from models.compiler.driver import StepSeq, lower_call, lower_step, tiles_of
from models.source import load_model
from sim.app.cli.serve import main as serve_main
from sim.app.serve.config import build_serve_config
from sim.app.serve.run import SwapCost, compile_for_serving, run_serving, write_serving_outputs
from sim.device.device import Device
from sim.device.hw import load_hardware
from sim.serving.blocks import kv_geometry
from sim.serving.costs import GridSpec, StepCostModel
from sim.serving.engine import ServingSim
from sim.serving.scheduler import SchedulerConfig
from sim.serving.workload import make_requests

HOST = 1 << 26


@cache
def _tiny(name: str, kv: str = "int8"):
    hw = load_hardware("tiny")
    cm = compile_model(load_model(name), BitConfig(), HardwareTarget.from_hw(hw), kv=kv,
                       core_mode="single", max_seq=64, cap=256, functional=False)
    return cm, hw


@pytest.mark.parametrize("name", ["tiny", "tiny-mla"])
def test_one_sequence_step_is_the_forward_program(name):
    cm, _ = _tiny(name)
    lw = cm.lowering()
    lower = lower_call
    for n, pos in ((1, 40), (7, 0), (40, 3)):
        step = lower_step(lw, [StepSeq(0, n, pos, False)])
        fwd = lower(lw, n=n, cache_size=pos)
        # the same instructions up to the LM head (a step without samplers has none)
        assert step.instructions == fwd.instructions[:len(step.instructions)]
        assert not any(isinstance(i, HostRead) for i in step.instructions)


def test_tiles_cut_the_batch_in_order():
    seqs = [StepSeq(0, 1, 10), StepSeq(0, 1, 20), StepSeq(0, 5, 0)]
    assert [[(s.pos0, s.n, s.off) for s in t] for t in tiles_of(seqs, 4)] == [
        [(10, 1, 0), (20, 1, 1), (0, 2, 2)], [(2, 3, 0)]]


@pytest.mark.parametrize("name", ["tiny", "tiny-mla"])
def test_batched_decode_reads_weights_once_and_each_cache(name):
    cm, hw = _tiny(name, "bf16")
    lw = cm.lowering()
    ctx = (30, 90, 150)
    seqs = [StepSeq(0, 1, c - 1, False, i + 1) for i, c in enumerate(ctx)]
    runs = {}
    for label, s in (("one", seqs[:1]), ("batch", seqs)):
        dev = Device(hw, functional=False, layout=cm.layout(host_bytes=HOST))
        prog = lower_step(lw, s)
        runs[label] = (prog, dev.run(prog))
    prog, run = runs["batch"]
    attn = [i for i in prog.instructions if isinstance(i, Attn)]
    assert sorted({a.ctx for a in attn}) == list(ctx)  # each sequence its own context
    fmt = kvformats.parse("bf16")
    if cm.model.is_mla:
        want = sum(fmt.read_bytes(0, c, 40) for c in ctx) * cm.model.num_layers
    else:
        want = sum(2 * cm.model.num_kv_heads * fmt.read_bytes(0, c, 16)
                   for c in ctx) * cm.model.num_layers
    assert sum(a.k_nbytes + a.v_nbytes for a in attn) == want
    w_one = runs["one"][1].stats["link_kind"][("dram_read", "weights")]
    w_batch = run.stats["link_kind"][("dram_read", "weights")]
    if cm.model.is_moe:  # a batch reads the union of its tokens' experts
        assert w_one < w_batch < 3 * w_one
    else:  # one pass over the weights for the whole batch; each further sequence reads
        # only the RoPE tables (cos, sin: head_dim bytes each) of its position, per layer
        hd, layers = cm.model.head_dim, cm.model.num_layers
        assert w_batch - w_one == (len(ctx) - 1) * 2 * hd * layers


@cache
def _qwen_cost():
    """Qwen2.5-0.5B's real widths on ARIES, but 2 layers and a vocabulary of 8,192 (fast);
    a small grid."""
    hw = load_hardware("aries")
    model = load_model("qwen2.5-0.5b", {"num_layers": 2, "vocab_size": 8192})
    cm = compile_for_serving(model, BitConfig(), hw, kv="int8", core_mode="global8", cap=512,
                             max_tokens=96, max_seqs=48)
    grid = GridSpec(decode_k=(1, 4, 16, cm.m_tile), decode_ctx=(1, 256, 512),
                    prefill_n=(1, 4, 16, cm.m_tile), prefill_pos=(0, 256, 512 - cm.m_tile),
                    io_tokens=(1, cm.m_tile, 96), head_r=(1, 24, 48), logits_n=(1, 48))
    return StepCostModel(cm, hw, max_seqs=48, cache_dir="", jobs=1, grid=grid)


def test_grid_model_is_within_2_percent_of_direct_simulation():
    cost = _qwen_cost()
    mt = cost.m_tile
    dec = [StepSeq(0, 1, 100 + 9 * i, True, i + 1) for i in range(40)]
    shapes = [
        dec,  # two tiles of decoding sequences
        dec[:5] + [StepSeq(0, 60, 200, False, 99)],  # decodes and a prompt chunk, mixed tile
        [StepSeq(0, 90, 0, True, 7)],  # a prompt in three tiles
        [StepSeq(0, 1, 300 + i, True, i + 1) for i in range(mt)],  # one full decode tile
    ]
    rows = cost.validate(shapes)
    errors = [abs(r["error"]) for r in rows]
    assert max(errors) <= 0.02, rows


def test_swap_cost_is_the_host_link():
    cm, hw = _tiny("tiny")
    swap = SwapCost(cm, hw)
    n = 1 << 20
    link = hw.host_link
    # twice the bytes: the link's bandwidth for the extra, both directions
    assert (swap("out", 2 * n) - swap("out", n)) / 1e12 == pytest.approx(
        n / link.d2h_effective_bytes_per_s, rel=0.02)
    assert (swap("in", 2 * n) - swap("in", n)) / 1e12 == pytest.approx(
        n / link.h2d_effective_bytes_per_s, rel=0.02)


def test_kv_geometry_from_dram():
    cm, hw = _tiny("tiny", "bf16")
    geo = kv_geometry(cm, hw.dram.capacity_bytes, block_tokens=16, max_tokens=256)
    per_token = 2 * 2 * 2 * 16 * 2  # 2 layers x (K, V) x 2 heads x 16 x bf16
    assert geo.block_bytes == 16 * per_token
    reserved = sum(r.size for r in cm.mm.regions if r.kind != "kv_cache")
    assert geo.num_blocks == (hw.dram.capacity_bytes - reserved) // geo.block_bytes
    assert [geo.blocks(n) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]
    budget = kv_geometry(cm, hw.dram.capacity_bytes, block_tokens=16, max_tokens=256,
                         budget_bytes=10 * geo.block_bytes + 5)
    assert budget.num_blocks == 10
    # a format with full-precision recent tokens holds more blocks for a short sequence
    cm4, _ = _tiny("tiny", "kivi-4")
    g4 = kv_geometry(cm4, hw.dram.capacity_bytes, block_tokens=16, max_tokens=256)
    assert g4.block_bytes < geo.block_bytes
    assert g4.blocks(64) * g4.block_bytes >= sum(
        2 * 2 * f.bytes(64, 16) for f in (cm4.k_fmt, cm4.v_fmt))


def _tiny_serve(tmp_path, **serving):
    tree = {
        "hardware": {"preset": "tiny"}, "model": {"preset": "tiny"}, "kv": {"format": "bf16"},
        "compile": {"core_mode": "single"},
        "serving": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_tokens": 4,
                    "workload": {"requests": 12, "prompt_tokens": 40, "output_tokens": 24},
                    "cost": {"cache_dir": str(tmp_path / "cache"), "jobs": 1}} | serving,
    }
    return build_serve_config(tree)


def test_smaller_cache_avoids_preemption(tmp_path):
    # 8 requests at a time need 8 x 16 blocks of 4 tokens at the end; the budget holds
    # 100 bf16 blocks (512 B each), or 266 of the 4-bit format (192 B)
    budget = {"kv_budget_bytes": 100 * 512}
    runs = {}
    for kv in ("bf16", "b4.token.g16.asym.scale-fp16.zero-fp16"):
        cfg = _tiny_serve(tmp_path, **budget)
        cfg = cfg.model_copy(update={"kv": cfg.kv.model_copy(update={"format": kv})})
        runs[kv] = run_serving(cfg).metrics.to_metrics()["serving"]
    bf16, q4 = runs.values()
    assert bf16["num_preemptions"] > 0 and bf16["recomputed_tokens"] > 0
    assert q4["num_preemptions"] == 0 == q4["recomputed_tokens"]
    for s in runs.values():  # the work done is accounted for
        assert s["computed_tokens"] == 12 * (40 + 23) + s["recomputed_tokens"]
        assert s["output_tokens"] == 12 * 24
    assert q4["output_tokens_per_s"] > bf16["output_tokens_per_s"]


def test_serve_writes_metrics_requests_trace_and_report(tmp_path):
    cfg = _tiny_serve(tmp_path, chips=2, router="least_loaded", preemption="swap",
                      kv_budget_bytes=40 * 512)
    result = run_serving(cfg)
    paths = write_serving_outputs(result, tmp_path / "out")
    m = json.loads(paths["metrics"].read_text())
    s = m["serving"]
    for key in ("output_tokens_per_s", "requests_per_s", "ttft_s_p50", "ttft_s_p90",
                "ttft_s_p99", "tpot_s_p50", "tpot_s_p90", "tpot_s_p99", "num_preemptions",
                "recomputed_tokens", "swapped_bytes", "prefill_tokens", "kv_occupancy"):
        assert key in s
    assert s["num_preemptions"] > 0 and s["swapped_bytes"] > 0 and s["recomputed_tokens"] == 0
    assert sorted(c["requests"] for c in s["chips"]) == [6, 6]
    lines = paths["requests"].read_text().splitlines()
    assert len(lines) == 13 and lines[0].startswith("rid,chip,arrival_s")
    trace = json.loads(paths["trace"].read_text())
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"kv_blocks_used", "requests"}
    assert {e["pid"] for e in counters} == {1, 2}
    assert "plotly" in paths["report"].read_text()[:2_000_000]


def test_serve_cli(tmp_path, capsys):
    args = ["--set", "hardware.preset=tiny", "--set", "model.preset=tiny",
            "--set", "compile.core_mode=single", "--set", "serving.workload.requests=3",
            "--set", "serving.workload.prompt_tokens=8", "--set",
            "serving.workload.output_tokens=3", "--set",
            f"serving.cost.cache_dir={tmp_path / 'c'}", "--out", str(tmp_path / "o"), "-q"]
    assert serve_main(args) == 0
    assert (tmp_path / "o" / "metrics.json").is_file()
    assert serve_main(["--set", "serving.chips=0", "-q"]) == 2
    assert "serving.chips" in capsys.readouterr().err


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_plan_cost_is_the_grid_model_of_the_plans_sequences(tmp_path, preemption):
    # the serving loop costs a step from its plan (positions gathered while scheduling);
    # that must be the grid model of the step's sequences, exactly, on every step of a run
    # with preemptions, prompt chunks cut by the budget and mixed tiles
    cfg = _tiny_serve(tmp_path, kv_budget_bytes=60 * 512, max_num_batched_tokens=50,
                      preemption=preemption)
    result = run_serving(cfg)
    cost = result.cost
    checked = []

    def plan_cost(plan) -> int:
        assert (plan.dec_pos, plan.pieces, plan.logits) == plan.batch()
        t = cost.plan_ps(plan)
        assert t == cost.model_ps(plan.seqs())
        checked.append(len(plan.items))
        return t

    s = cfg.serving
    sim = ServingSim(make_requests(s.workload), chips=1, geometry=result.geometry,
                     step_cost=cost.step_ps, swap_cost=SwapCost(cost.cm, cost.hw),
                     plan_cost=plan_cost,
                     scheduler=SchedulerConfig(max_num_seqs=s.max_num_seqs,
                                               max_num_batched_tokens=50,
                                               preemption=preemption))
    sim.run()
    assert len(checked) == result.metrics.serving.steps
    assert sum(r.preemptions for r in sim.requests) > 0
    assert [vars(x) for x in sim.chips[0].steps] == [vars(x) for x in result.steps[0]]

    # and on shapes that cut pieces at every offset of a tile (one-token rests included)
    rng = np.random.default_rng(0)
    mt, cap = cost.m_tile, cost.cm.cap
    for _ in range(300):
        dec = [int(p) for p in rng.integers(0, cap - 1, rng.integers(0, 3 * mt))]
        pieces = [(int(n), int(rng.integers(0, cap - n + 1))) for n in
                  rng.integers(2, min(2 * mt + 2, cap) + 1, rng.integers(0 if dec else 1, 4))]
        seqs = [StepSeq(0, 1, p, bool(i % 2), i + 1) for i, p in enumerate(dec)]
        seqs += [StepSeq(0, n, p, bool(i % 3), 99 + i) for i, (n, p) in enumerate(pieces)]
        logits = sum(s.logits for s in seqs)
        assert cost.batch_ps(dec, pieces, logits) == cost.model_ps(seqs), (dec, pieces)
