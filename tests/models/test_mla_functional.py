"""Functional MLA (DeepSeek-V2, absorbed form) on the tiny dense-MLP preset: the integer
programs against the float reference with the same W8 weights, with a bf16 latent cache and
the QuantMLA formats; the device's weight basis; timing-only and functional runs equal."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from isa.instructions import NO_ADDR, Attn, GemmRow, Vec, VecFunc
from models.bits import build_bit_config
from models.compiler import CompiledModel, HardwareTarget, compile_model
from models.compiler.blocks.mla_calib import deinterleaved, device_matrix
from models.reference import ReferenceModel, apply_rope, rope_cos_sin
from models.source import load_model, load_preset
from models.weights import SyntheticWeights
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model

PRESET = "tiny-mla-dense"
#: Prompt tokens of the QuantMLA comparison: past QuantMLA's 4 sink and 128 window tokens
#: (kept bf16, FACTS.md), so 18 tokens of the prompt are stored at 4 or 2 bits.
LONG_PROMPT = 150
DECODE_STEPS = 6


@cache
def _compile(kv: str, prompt: int, functional: bool = True,
             q_lora_rank: int | None = None) -> CompiledModel:
    cfg = load_model(PRESET, {"q_lora_rank": q_lora_rank} if q_lora_rank else None)
    return compile_model(cfg, build_bit_config({"weights": "W8"}),
                         HardwareTarget.from_hw(load_hardware("tiny")), kv=kv,
                         functional=functional, core_mode="single", max_seq=prompt,
                         cap=prompt + DECODE_STEPS + 2)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@cache
def _cosines(kv: str, prompt: int, q_lora_rank: int | None = None) -> tuple[float, ...]:
    """Logit cosine to the float reference (same W8 weights) of a prefill of ``prompt``
    tokens and of each of the decode steps after it."""
    cm = _compile(kv, prompt, q_lora_rank=q_lora_rank)
    hw = load_hardware("tiny")
    model = Model(cm)
    model.launch(Accelerator(hw=hw, functional=True))
    ref = ReferenceModel(cm.model, cm.weight_source(), weight_bits=cm.bits.weights)
    toks = np.random.default_rng(1).integers(0, cm.model.vocab_size,
                                             size=prompt + DECODE_STEPS)
    want = ref.prefill(toks)
    emb = ref.embed(toks)
    out = [_cos(model.infer(emb[:prompt], cache_size=0)[0], want[prompt - 1])]
    out += [_cos(model.infer(emb[i:i + 1], cache_size=i)[0], want[i])
            for i in range(prompt, prompt + DECODE_STEPS)]
    return tuple(out)


def test_bf16_latent_cache_matches_the_float_reference() -> None:
    """W8, bf16 latent cache, 10-token prompt and 6 decode steps (measured: mean 0.9926,
    worst call 0.9874; 0.9862 and 0.9707 with the latent rounded to int8 before its norm)."""
    cos = _cosines("bf16", 10)
    assert np.mean(cos) >= 0.99 and min(cos) >= 0.985, cos


def test_query_latent_path_matches_the_float_reference() -> None:
    """q_a_proj -> q_a_norm -> q_b_proj (q_lora_rank 32; measured: mean 0.9916, worst call
    0.9889)."""
    cos = _cosines("bf16", 10, q_lora_rank=32)
    assert np.mean(cos) >= 0.99 and min(cos) >= 0.985, cos


def test_quantmla_formats_lose_accuracy_in_the_order_of_their_bits() -> None:
    """Past the full-precision window (150-token prompt, 6 decode steps; measured means:
    bf16 0.9908, quantmla-c4r4 0.9875, quantmla-c2r4 0.9718): more bits, closer."""
    mean = {kv: float(np.mean(_cosines(kv, LONG_PROMPT)))
            for kv in ("bf16", "quantmla-c4r4", "quantmla-c2r4")}
    assert mean["bf16"] > mean["quantmla-c4r4"] > mean["quantmla-c2r4"], mean
    assert mean["bf16"] >= 0.99 and mean["quantmla-c2r4"] >= 0.97, mean


def _call_times_ps(functional: bool) -> list[int]:
    """Simulated picoseconds of each runtime call: launch, a 10-token prefill, a decode."""
    cm = _compile("bf16", 10, functional)
    acc = Accelerator(hw=load_hardware("tiny"), functional=functional)
    model = Model(cm)
    model.launch(acc)
    x = np.zeros((11, cm.model.hidden_size), np.float32)
    if functional:
        ref = ReferenceModel(cm.model, cm.weight_source(), weight_bits=cm.bits.weights)
        x = ref.embed(np.arange(11))
    model.infer(x[:10], cache_size=0)
    model.infer(x[10:11], cache_size=10)
    return [c.end_ps - c.start_ps for c in acc.calls]


def test_timing_only_and_functional_runs_take_the_same_cycles() -> None:
    """Launch (weights over the link), prefill and decode: the same simulated time."""
    timing, functional = _call_times_ps(False), _call_times_ps(True)
    assert timing == functional == EXPECTED_CALL_PS


#: Simulated call times of tiny-mla-dense on the tiny hardware (single core), ps.
#: (The int32 latent into RMSNORM_WIDE and its REQUANT: +0.4 us prefill, +0.2 us decode.)
EXPECTED_CALL_PS = [159_876_963, 196_622_313, 128_820_907]


def test_functional_programs_differ_from_timing_only_ones_in_parameters_only() -> None:
    """The same instructions; the functional ones carry the calibrated factors."""
    t = _compile("bf16", 10, False).program(tokens=1, cache_size=10)
    f = _compile("bf16", 10, True).program(tokens=1, cache_size=10)
    assert [type(i) for i in t] == [type(i) for i in f]
    at = [i for i in f if isinstance(i, Attn)]
    assert len(at) == 2 and all(i.score_mult > 1 and i.out_mult > 1 for i in at)


def test_latent_stays_int32_into_its_norm() -> None:
    """Per layer: kv_a_proj's latent rows as a GemmRow into int32 (static input), then
    RMSNORM_WIDE over those int32 rows and REQUANT of its output to the int8 record."""
    cm = _compile("bf16", 10)
    kvr = cm.model.kv_lora_rank
    for tokens, cached in ((10, 0), (1, 10)):
        prog = list(cm.program(tokens=tokens, cache_size=cached))
        lat = [i for i in prog if isinstance(i, GemmRow)]
        assert len(lat) == cm.model.num_layers, (tokens, lat)
        assert all(g.out_bits == 32 and g.row_meta == NO_ADDR and g.n == kvr for g in lat)
        wide = [i for i in prog if isinstance(i, Vec) and i.func == VecFunc.RMSNORM_WIDE]
        assert [(v.cols, v.p2, v.rows) for v in wide] == [(kvr, 32, tokens)] * len(lat)
        assert [v.src0 for v in wide] == [g.out for g in lat]
        after = [prog[prog.index(v) + 1] for v in wide]
        assert all(isinstance(r, Vec) and r.func == VecFunc.REQUANT and r.src0 == v.dst
                   for r, v in zip(after, wide, strict=True))


def test_compiled_file_keeps_the_mla_parameters(tmp_path) -> None:
    cm = _compile("bf16", 10, q_lora_rank=32)
    cm.save(tmp_path / "m.kvm")
    back = CompiledModel.load(tmp_path / "m.kvm")
    for a, b in zip(cm.numerics.layers, back.numerics.layers, strict=True):
        assert a.mla is not None and b.mla is not None
        assert np.array_equal(a.mla.k_b.mult, b.mla.k_b.mult)
        assert np.array_equal(a.mla.kv_a_norm.gamma, b.mla.kv_a_norm.gamma)
        assert np.array_equal(a.mla.q_a.mult, b.mla.q_a.mult)
        assert a.mla.q_a_norm.shift == b.mla.q_a_norm.shift
    assert back.program(tokens=1, cache_size=10) == cm.program(tokens=1, cache_size=10)


# --- the device's basis ------------------------------------------------------------------

def test_absorbed_k_b_proj_gives_the_same_scores() -> None:
    """q_nope . (W_UK_h c) == (W_UK_h^T q_nope) . c with the per-head transposed blocks."""
    cfg = load_preset(PRESET)
    src = SyntheticWeights(cfg, seed=0)
    name = "layers.0.k_b_proj"
    kb = src.tensor(name).astype(np.float64)
    dev = device_matrix(cfg, src, name).astype(np.float64)
    nope, kvr, heads = cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.num_heads
    assert dev.shape == (heads * kvr, nope)
    rng = np.random.default_rng(3)
    q, c = rng.standard_normal((heads, nope)), rng.standard_normal(kvr)
    for h in range(heads):
        want = q[h] @ (kb[h * nope:(h + 1) * nope] @ c)
        got = (dev[h * kvr:(h + 1) * kvr] @ q[h]) @ c
        assert got == pytest.approx(want, rel=1e-9)


def test_deinterleaved_rope_rows_rotate_as_the_interleaved_checkpoint() -> None:
    cfg = load_preset(PRESET)
    r = cfg.qk_rope_head_dim
    x = np.random.default_rng(4).standard_normal((5, r)).astype(np.float32)
    cos, sin = rope_cos_sin(cfg, np.arange(3, 8))
    want = apply_rope(x, cos, sin, interleaved=True)
    got = apply_rope(x[:, deinterleaved(r)], cos, sin)
    assert np.array_equal(got, want)
    src = SyntheticWeights(cfg, seed=0)
    kva = src.tensor("layers.0.kv_a_proj")
    dev = device_matrix(cfg, src, "layers.0.kv_a_proj")
    kvr = cfg.kv_lora_rank
    assert np.array_equal(dev[:kvr], kva[:kvr])
    assert np.array_equal(dev[kvr:], kva[kvr:][deinterleaved(r)])


def test_residual_rotation_is_refused_for_mla() -> None:
    """The rotation folds norms into GQA's projections only: refused, not silently wrong."""
    from models.compiler import CompileError

    bits = build_bit_config({"weights": "W8", "numerics": {"rotation": "residual"}})
    with pytest.raises(CompileError, match="bits.numerics: rotation = 'residual'"):
        compile_model(load_preset(PRESET), bits, HardwareTarget.from_hw(load_hardware("tiny")),
                      core_mode="single", max_seq=8, cap=16)
