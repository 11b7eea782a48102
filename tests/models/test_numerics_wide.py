"""The wide integer pipeline and the residual rotation on the tiny synthetic model: the
rotation changes no float result, timing-only and functional compiles lower the same
programs, the wide residual rows cost their bytes, and the options not built yet are
refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from isa.instructions import GemmRow, Vec, VecFunc
from models.bits import NUMERICS_PRESETS, BitConfig, NumericsOptions
from models.compiler import CompileError, HardwareTarget, compile_model
from models.compiler.rotation import RotatedWeights, hadamard
from models.reference import ReferenceModel
from models.source import load_model
from models.weights import SyntheticWeights
from sim.device.hw import load_hardware

W8 = BitConfig(numerics=NUMERICS_PRESETS["w8"])
RESIDENT = BitConfig(numerics=NUMERICS_PRESETS["w8"].model_copy(update={"schedule": "resident"}))
HW = HardwareTarget.from_hw(load_hardware("tiny"))


@pytest.mark.parametrize("n", [1, 2, 12, 64, 576, 1536])
def test_hadamard_is_orthonormal_with_equal_magnitudes(n: int) -> None:
    h = hadamard(n)
    assert np.abs(h @ h.T - np.eye(n)).max() < 1e-12
    assert np.allclose(np.abs(h), 1 / np.sqrt(n))


def test_hadamard_of_an_unsupported_order_names_the_option() -> None:
    with pytest.raises(Exception, match="no Hadamard matrix of order 40.*rotation = 'none'"):
        hadamard(40)


def test_rotation_changes_no_float_logit() -> None:
    """Untied head (a tied one is untied by the rotation): the float reference on the
    rotated weights gives the unrotated model's logits."""
    tied = load_model("tiny")
    cfg = type(tied).model_validate({**tied.model_dump(), "tie_word_embeddings": False})
    src = SyntheticWeights(cfg, seed=3)
    ids = [5, 17, 200, 3, 3, 99, 42]
    plain = ReferenceModel(cfg, src, cache_weights=False).prefill(ids)
    rot = ReferenceModel(cfg, RotatedWeights(src), cache_weights=False).prefill(ids)
    assert np.abs(plain - rot).max() < 1e-4 * np.abs(plain).max()
    emb = RotatedWeights(src).tensor("embed")
    assert np.allclose(emb, src.tensor("embed") @ hadamard(cfg.hidden_size), atol=1e-6)


@pytest.fixture(scope="module")
def tiny_w8():
    cfg = load_model("tiny")
    timing = compile_model(cfg, W8, HW, core_mode="single", max_seq=16, cap=64,
                           functional=False)
    functional = compile_model(cfg, W8, HW, core_mode="single", max_seq=16, cap=64)
    return timing, functional


def test_timing_and_functional_compiles_lower_the_same_programs(tiny_w8) -> None:
    """The same instructions, flags, byte extents and work (so the same cycles); only the
    integer parameters' values differ (a timing-only compile has no calibration)."""
    timing, functional = tiny_w8
    for name in ("prefill_16", "decode"):
        a, b = timing.programs[name], functional.programs[name]
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert (type(x), x.engine, x.wait, x.signal, x.accesses(), x.ops()) == (
                type(y), y.engine, y.wait, y.signal, y.accesses(), y.ops())


def test_wide_programs_use_the_wide_kernels_and_their_bytes(tiny_w8) -> None:
    _, cm = tiny_w8
    prog = cm.programs["decode"]
    funcs = {VecFunc(i.func) for i in prog if isinstance(i, Vec)}
    # the lean schedule (the default): norms fused with their quantization, the SwiGLU
    # rows quantized by the cores that computed them
    assert {VecFunc.RMSNORM_QUANT, VecFunc.ROW_AMAX, VecFunc.QUANT_ROW_AMAX, VecFunc.ADD_WIDE,
            VecFunc.SILU_MUL_WIDE, VecFunc.FROM_F32_WIDE} <= funcs
    assert not funcs & {VecFunc.RMSNORM, VecFunc.ADD, VecFunc.SILU_MUL, VecFunc.RMSNORM_WIDE,
                        VecFunc.QUANT_ROW}
    resident = compile_model(cm.model, RESIDENT, HW, core_mode="single", max_seq=16, cap=64,
                             functional=False)
    rfuncs = {VecFunc(i.func) for i in resident.programs["decode"] if isinstance(i, Vec)}
    assert {VecFunc.RMSNORM_WIDE, VecFunc.QUANT_ROW} <= rfuncs
    assert not rfuncs & {VecFunc.RMSNORM_QUANT, VecFunc.ROW_AMAX, VecFunc.QUANT_ROW_AMAX}
    gemms = [i for i in prog if isinstance(i, GemmRow)]
    assert gemms and all(g.row_shift >= 17 for g in gemms)
    h, m_tile = cm.model.hidden_size, cm.m_tile
    assert cm.mm["act.x0"].size == 2 * m_tile * h  # int16 residual rows
    assert cm.mm["act.hb"].size == 4 * m_tile * cm.model.intermediate_size  # int32 SwiGLU
    int8 = compile_model(cm.model, BitConfig(), HW, core_mode="single", max_seq=16, cap=64,
                         functional=False)
    assert int8.mm["act.x0"].size == int8.m_tile * h


def test_wide_numerics_are_recorded_and_rotated_head_is_untied(tiny_w8) -> None:
    _, cm = tiny_w8
    nq = cm.numerics
    assert (nq.residual_bits, nq.rotated, nq.wide) == (16, True, True)
    assert nq.head.mult is not None and nq.head.out_bits == 32
    assert np.all(nq.head_row_scale == nq.head_row_scale[0])  # one static logits scale
    g = cm.numerics.layers[0].attn_norm.gamma
    assert np.all(g == g[0])  # rotated: the gains are folded into the projections


@pytest.mark.parametrize(("change", "reason"), [
    ({"residual": "int16e"}, "residual = 'int16e' .* not implemented yet"),
    ({"rotation": "residual+down"}, "rotation = 'residual\\+down' .* not implemented yet"),
    ({"qkv_scale": "token"}, "qkv_scale = 'token' is not implemented yet"),
    ({"act_scale": "static"}, "residual = .int16. is built with act_scale = .token."),
])
def test_options_not_built_are_refused_by_name(change: dict, reason: str) -> None:
    opts = NumericsOptions(**{**NUMERICS_PRESETS["w8"].model_dump(), **change})
    with pytest.raises(CompileError, match="bits.numerics: " + reason):
        compile_model(load_model("tiny"), BitConfig(numerics=opts), HW, core_mode="single",
                      max_seq=16, cap=64, functional=False)


def test_per_token_scales_need_a_wide_residual() -> None:
    opts = NumericsOptions(act_scale="token")
    with pytest.raises(CompileError, match="act_scale = 'token' is built with a wide"):
        compile_model(load_model("tiny"), BitConfig(numerics=opts), HW, core_mode="single",
                      max_seq=16, cap=64, functional=False)


def test_a_saved_wide_model_loads_with_its_numerics(tiny_w8, tmp_path) -> None:
    from isa.encoding import encode_program
    from models.compiler import CompiledModel

    _, cm = tiny_w8
    cm.save(tmp_path / "m.kvm")
    back = CompiledModel.load(tmp_path / "m.kvm")
    nq, bq = cm.numerics, back.numerics
    assert (bq.residual_bits, bq.rotated, bq.head.out_bits) == (16, True, 32)
    assert [L.down.row_shift for L in bq.layers] == [L.down.row_shift for L in nq.layers]
    assert encode_program(back.program(tokens=16, cache_size=0)) == encode_program(
        cm.program(tokens=16, cache_size=0))


def _run_tiny(bits: BitConfig, ids: list[int]) -> tuple[int, np.ndarray, np.ndarray]:
    """m_tile, the logits of a prefill of ``ids`` and of one decode step after it, on the
    simulated device (functional)."""
    from sim.runtime import Accelerator, Model, ModelConfig

    hw = load_hardware("tiny")
    cm = compile_model(load_model("tiny"), bits, HardwareTarget.from_hw(hw), core_mode="single",
                       max_seq=16, cap=64, tile_bytes=28672)
    model = Model(cm, ModelConfig(all_logits=True))
    model.launch(Accelerator(hw=hw, functional=True))
    embed = cm.weight_source().tensor("embed")
    [pre] = model.infer(embed[np.asarray(ids)].astype(np.float32), cache_size=0,
                        all_logits=True)
    [dec] = model.infer(embed[np.asarray(ids[:1])].astype(np.float32), cache_size=len(ids),
                        all_logits=True)
    model.dispose()
    return cm.m_tile, pre, dec


def test_lean_schedule_gives_the_resident_schedules_logits_in_larger_tiles() -> None:
    """``schedule`` is only a schedule: bit-identical logits over several token tiles and a
    decode step, with more tokens per tile (the tiny model with 28 KiB weight tiles: the
    resident schedule fits 3 tokens, lean 7)."""
    ids = [5, 17, 200, 3, 3, 99, 42, 7, 11, 250, 64, 1, 2, 8]
    m_lean, pre_lean, dec_lean = _run_tiny(W8, ids)
    m_res, pre_res, dec_res = _run_tiny(RESIDENT, ids)
    assert (m_lean, m_res) == (7, 3)
    assert np.abs(pre_lean).max() > 0
    assert np.array_equal(pre_lean, pre_res)
    assert np.array_equal(dec_lean, dec_res)
