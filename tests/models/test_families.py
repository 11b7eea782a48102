"""Cohere2 (Command-R7B) and EXAONE-4.0: their real config.json files import with the
per-layer features of models.layer_features, counts match published figures, and bad or
unsupported fields give errors naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.errors import ConfigError
from models.config import build_model
from models.hf import hf_config_to_model, load_hf_config
from models.layer_features import pattern_layer_types
from models.source import load_preset

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "models" / "presets"
#: The project's shared documents sit beside the repository (in CI too).
HF_DIR = ROOT.parent / "shared" / "hf-configs"


@pytest.mark.parametrize("stem", ["command-r7b", "exaone-4.0-1.2b"])
def test_presets_are_the_shared_hf_files(stem: str) -> None:
    shared = HF_DIR / f"{stem}.json"
    if shared.exists():
        assert json.loads(shared.read_text()) == json.loads((PRESETS / f"{stem}.json").read_text())


def test_command_r7b_features() -> None:
    c = load_hf_config(PRESETS / "command-r7b.json")
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == ("cohere2", 32, 4096, 32, 8, 128, 14336,
                                                   256000)
    # sliding_window_pattern 4, local first: layers 3, 7, ..., 31 global, without RoPE
    full = [i for i in range(32) if c.layer_window(i) is None]
    assert full == list(range(3, 32, 4))
    assert all(c.layer_window(i) == 4096 for i in range(32) if i not in full)
    assert [i for i in range(32) if not c.layer_has_rope(i)] == full
    assert (c.norm_kind, c.norm_position, c.parallel_block, c.qk_norm) == ("layer", "pre",
                                                                           True, False)
    assert (c.logit_scale, c.rms_norm_eps, c.rope_theta, c.tie_word_embeddings) == (
        0.25, 1e-5, 50000.0, True)
    # llama.cpp's load log of this model (PR #10900): 8.03 B parameters
    assert c.param_count == 8_028_033_024
    names = [s.name for s in c.layer_tensors(0)]
    assert "layers.0.attn_norm" in names and "layers.0.mlp_norm" not in names


def test_exaone_4_1_2b_features() -> None:
    c = load_hf_config(PRESETS / "exaone-4.0-1.2b.json")
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == ("exaone4", 30, 2048, 32, 8, 64, 4096,
                                                   102400)
    assert all(c.layer_window(i) is None and c.layer_has_rope(i) for i in range(30))
    assert c.sliding_window is None and c.rope_scaling is not None
    assert (c.norm_position, c.qk_norm, c.norm_kind, c.parallel_block) == ("post", True,
                                                                           "rms", False)
    # model card: 1.07 B parameters without embeddings (tied: 1.28 B in all)
    assert c.param_count - c.vocab_size * c.hidden_size == 1_069_676_288
    names = [s.name for s in c.layer_tensors(0)]
    assert names == ["layers.0.q_proj", "layers.0.k_proj", "layers.0.v_proj",
                     "layers.0.q_norm", "layers.0.k_norm", "layers.0.o_proj",
                     "layers.0.post_attn_norm", "layers.0.gate_proj", "layers.0.up_proj",
                     "layers.0.down_proj", "layers.0.post_mlp_norm"]
    assert c.tensor_spec("layers.0.q_norm").shape == (64,)


def test_exaone_hybrid_pattern_string_and_nope_globals() -> None:
    # EXAONE-4.0-32B writes its pattern as a string: three local layers, then a global one
    data = json.loads((PRESETS / "exaone-4.0-1.2b.json").read_text())
    del data["layer_types"]
    data.update(num_hidden_layers=8, sliding_window=4096, sliding_window_pattern="LLLG")
    c = hf_config_to_model(data)
    assert [c.layer_window(i) for i in range(8)] == [4096, 4096, 4096, None] * 2
    assert [c.layer_has_rope(i) for i in range(8)] == [True, True, True, False] * 2


def test_pattern_layer_types() -> None:
    assert pattern_layer_types(5, 2) == ("sliding_attention", "full_attention",
                                         "sliding_attention", "full_attention",
                                         "sliding_attention")


@pytest.mark.parametrize("edit, match", [
    ({"use_parallel_block": False}, r"use_parallel_block false"),
    ({"position_embedding_type": "alibi"}, r"position_embedding_type 'alibi'"),
    ({"rotary_pct": 0.5}, r"rotary_pct 0.5"),
    ({"order_of_interleaved_layers": "global_first"}, r"order_of_interleaved_layers"),
    ({"attention_bias": True}, r"attention_bias true"),
    ({"sliding_window_pattern": 0}, r"sliding_window_pattern must be a positive integer"),
    ({"sliding_window": -3}, r"sliding_window must be a positive integer, got -3"),
    ({"layer_types": ["sliding_attention"] * 3}, r"layer_types has 3 entries"),
    ({"layer_types": ["chunked_attention"] * 32}, r"layer_types must be a list of"),
])
def test_cohere2_bad_fields_are_named(edit: dict, match: str) -> None:
    data = json.loads((PRESETS / "command-r7b.json").read_text())
    data.update(edit)
    with pytest.raises(ConfigError, match=match):
        hf_config_to_model(data, where="command-r7b.json")


@pytest.mark.parametrize("edit, match", [
    ({"layer_types": ["sliding_attention"] * 4}, r"sliding_window: layer_types has sliding"),
    ({"sliding_window": 8}, r"sliding_window: set, but layer_types has no sliding layer"),
    ({"rope_layers": "sliding"}, r"rope_layers: 'sliding' needs sliding layers"),
    ({"parallel_block": True, "norm_position": "post"}, r"parallel_block: a parallel block"),
    ({"norm_kind": "batch"}, r"model\.norm_kind"),
])
def test_feature_checks_name_the_field(edit: dict, match: str) -> None:
    data = load_preset("tiny").model_dump(exclude_none=True)
    data.update(num_layers=4, **edit)
    with pytest.raises(ConfigError, match=match):
        build_model(data)


def test_features_need_gqa_and_a_dense_mlp() -> None:
    data = load_preset("tiny-mla").model_dump(exclude_none=True)
    data["qk_norm"] = True
    with pytest.raises(ConfigError, match=r"supported for GQA models with a dense MLP only"):
        build_model(data)


@pytest.mark.parametrize("name", ["tiny-cohere2", "tiny-exaone4"])
def test_tiny_presets_have_their_family_features(name: str) -> None:
    tiny = load_preset(name)
    real = load_preset("command-r7b" if name == "tiny-cohere2" else "exaone-4.0-1.2b")
    keys = ("family", "norm_kind", "norm_position", "qk_norm", "parallel_block",
            "rope_layers", "tie_word_embeddings")
    assert [getattr(tiny, k) for k in keys] == [getattr(real, k) for k in keys]
    assert (tiny.sliding_window is None) == (real.sliding_window is None)
    assert tiny.kv_tokens(0, 100) == (8 if name == "tiny-cohere2" else 100)


def test_kv_bytes_of_command_r7b_at_32k_match_the_hand_calculation(capsys) -> None:
    from sim.app.cli.main import main

    path = HF_DIR / "command-r7b.json"
    model = str(path if path.exists() else PRESETS / "command-r7b.json")
    assert main(["kv", "--model", model, "--format", "int8", "--context", "32768",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # By hand: 32 layers, sliding_window_pattern 4 -> 24 sliding layers holding
    # min(4096, 32768) = 4096 tokens and 8 global layers holding all 32768; each token of a
    # layer is K and V of 8 KV heads x 128 values, 1 byte each in int8.
    per_token_bytes = 2 * 8 * 128 * 1
    hand = 24 * 4096 * per_token_bytes + 8 * 32768 * per_token_bytes
    assert hand == 738_197_504
    assert out["total_bytes"] == hand
    assert out["layers_by_tokens_held"] == {"4096": 24, "32768": 8}
    assert out["bf16_total_bytes"] == 2 * hand
    # below the window every layer holds the whole context
    assert main(["kv", "--model", model, "--format", "int8", "--context", "1000",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 32 * 1000 * per_token_bytes


def _tiny_cosines(name: str, kv: str = "int8", **bits) -> list[float]:
    """Prefill 10 tokens, decode 6 (past the tiny Cohere2's 8-token window): logit cosine
    of each call to the float reference with the same W8 weights (``bits``: more of the
    bit config, e.g. ``kv_read``, ``numerics``)."""
    import numpy as np

    from models.bits import build_bit_config
    from models.compiler import HardwareTarget, compile_model
    from models.reference import ReferenceModel
    from models.source import open_weights
    from sim.device.hw import load_hardware
    from sim.runtime import Accelerator, Model

    hw = load_hardware("tiny")
    cfg = load_preset(name)
    cm = compile_model(cfg, build_bit_config({"weights": "W8", **bits}),
                       HardwareTarget.from_hw(hw), kv=kv, functional=True, core_mode="single",
                       max_seq=16, cap=64)
    model = Model(cm)
    model.launch(Accelerator(hw=hw, functional=True))
    # the device's embeddings (rotated with its residual stream) and the float model's
    # logits (unrotated: a LayerNorm centres in the model's own space)
    dev = ReferenceModel(cfg, cm.weight_source(), weight_bits=cm.bits.weights)
    ref = ReferenceModel(cfg, open_weights(cfg, cm.weights), weight_bits=cm.bits.weights)
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, size=16)
    want = ref.prefill(toks)
    emb = dev.embed(toks)

    def cos(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    out = [cos(model.infer(emb[:10], cache_size=0)[0], want[9])]
    out += [cos(model.infer(emb[i:i + 1], cache_size=i)[0], want[i]) for i in range(10, 16)]
    return out


def test_tiny_cohere2_runs_functionally_against_the_float_reference() -> None:
    """Sliding layers (ring caches), a global layer without RoPE, LayerNorm, the parallel
    block and the logit scale, in integers (measured: mean 0.9936, worst call 0.9917)."""
    cos = _tiny_cosines("tiny-cohere2")
    assert sum(cos) / len(cos) >= 0.99 and min(cos) >= 0.985, cos


#: A per-token 4- and 2-bit format a ring can hold (asymmetric, fp16 scale and zero per
#: 16 channels: one group per head of the tiny models).
TOK4 = "b4.token.g16.asym.scale-fp16.zero-fp16"
TOK2 = "b2.token.g16.asym.scale-fp16.zero-fp16"


def test_tiny_cohere2_reads_its_rings_through_the_dequant_path() -> None:
    """kv.read = "dequant" (AttnDq: the ring's records dequantized to fp16 on the vector
    unit, fp16 attention over the window). Measured: int8 mean 0.9913, worst call 0.9846;
    4-bit mean 0.9469, 2-bit 0.6152 (the integer path: 0.9936, 0.9622, 0.6415)."""
    cos = {kv: _tiny_cosines("tiny-cohere2", kv, kv_read="dequant")
           for kv in ("int8", TOK4, TOK2)}
    mean = {kv: sum(c) / len(c) for kv, c in cos.items()}
    assert mean["int8"] >= 0.99 and min(cos["int8"]) >= 0.98, cos["int8"]
    assert mean["int8"] > mean[TOK4] > mean[TOK2], mean  # more bits, less damage
    assert mean[TOK4] >= 0.94 and 0.5 < mean[TOK2] < 0.7, mean


def test_a_dequant_decode_of_a_sliding_layer_reads_only_its_window() -> None:
    from isa.instructions import AttnDq

    cfg = load_preset("tiny-cohere2")
    cm = _timing_compile(cfg, kv_read="dequant")
    prog = cm.program(tokens=1, cache_size=40)
    attn = [i for i in prog.instructions if isinstance(i, AttnDq)]
    per_layer = len(attn) // cfg.num_layers
    hd = cfg.head_dim
    # three sliding layers: the last 8 positions of a ring (header 8 bytes); the full one
    assert [(a.ctx, a.pos, a.k_fmt, a.k_nbytes) for a in attn[::per_layer]] == [
        (8, 7, 2, 8 + 8 * hd)] * 3 + [(41, 40, 0, 41 * hd)]


def _w8(**over) -> dict:
    """The w8 numerics (int16 residual, per-token GEMM inputs) as a bit-config field,
    without the residual rotation (which post-norm blocks refuse)."""
    from models.bits import build_numerics

    return build_numerics({"preset": "w8", "rotation": "none", **over}).model_dump()


def test_tiny_cohere2_runs_the_wide_pipeline_against_the_float_reference() -> None:
    """LAYERNORM_WIDE on the int16 residual, the parallel block's MLP normalising the layer
    input again, the logit scale on the wide head (measured: mean 0.9950, worst call 0.9899;
    the static int8 scheme: 0.9936, 0.9917)."""
    cos = _tiny_cosines("tiny-cohere2", numerics=_w8())
    assert sum(cos) / len(cos) >= 0.994 and min(cos) >= 0.989, cos


def test_the_wide_pipeline_of_a_layernorm_model_uses_layernorm_wide() -> None:
    from isa.instructions import Vec, VecFunc

    cfg = load_preset("tiny-cohere2")
    cm = _timing_compile(cfg, numerics=_w8())
    funcs = [VecFunc(i.func) for i in cm.program(tokens=1, cache_size=5).instructions
             if isinstance(i, Vec)]
    # per layer: the attention's norm and the parallel MLP's norm of the same input; then
    # the final norm
    assert funcs.count(VecFunc.LAYERNORM_WIDE) == 2 * cfg.num_layers + 1
    assert VecFunc.RMSNORM_WIDE not in funcs and VecFunc.LAYERNORM not in funcs


def test_tiny_exaone4_runs_the_wide_pipeline_against_the_float_reference() -> None:
    """No pre-norm (QUANT_ROW_WIDE of the int16 residual per token), QK norm on the static
    int8 q/k, the post-attention and post-MLP norms as RMSNORM_WIDE of int32 projection
    outputs straight onto the residual's scale (measured: mean 0.9977, worst call 0.9950;
    the static int8 scheme: 0.9939, 0.985)."""
    cos = _tiny_cosines("tiny-exaone4", numerics=_w8())
    assert sum(cos) / len(cos) >= 0.997 and min(cos) >= 0.994, cos


def test_the_wide_pipeline_of_a_post_norm_model() -> None:
    from isa.instructions import Vec, VecFunc

    cfg = load_preset("tiny-exaone4")
    cm = _timing_compile(cfg, numerics=_w8())
    vecs = [i for i in cm.program(tokens=1, cache_size=5).instructions if isinstance(i, Vec)]
    h, hd = cfg.hidden_size, cfg.head_dim
    group, kv = cfg.num_heads // cfg.num_kv_heads, cfg.num_kv_heads
    # per layer (one core): the attention input and the MLP input quantized per token from
    # the int16 residual; the q and k head norms in int8; the two post-norms on int32 rows
    assert [(VecFunc(v.func).name, v.rows, v.cols, v.p2) for v in vecs
            if v.func in (VecFunc.QUANT_ROW_WIDE, VecFunc.RMSNORM, VecFunc.RMSNORM_WIDE)] == (
        [("QUANT_ROW_WIDE", 1, h, 16)] + [("RMSNORM", group, hd, 0)] * kv
        + [("RMSNORM", 1, hd, 0)] * kv + [("RMSNORM_WIDE", 1, h, 32),
                                          ("QUANT_ROW_WIDE", 1, h, 16),
                                          ("RMSNORM_WIDE", 1, h, 32)]) * cfg.num_layers + [
        ("RMSNORM_WIDE", 1, h, 16)]
    assert cm.mm["act.po32"].size == 4 * cm.m_tile * h  # the int32 projection outputs


def test_tiny_cohere2_runs_the_w8_preset_with_its_rotation() -> None:
    """The w8 preset as it is: the residual rotated by a Sylvester Hadamard (hidden 64), the
    LayerNorms in LAYERNORM_WIDE's rotated mode (channel 0 is the mean), the parallel MLP's
    gate/up with the attention norm's gain folded (measured: mean 0.9944, worst 0.9907)."""
    from models.bits import NUMERICS_PRESETS

    cos = _tiny_cosines("tiny-cohere2", numerics=NUMERICS_PRESETS["w8"].model_dump())
    assert sum(cos) / len(cos) >= 0.994 and min(cos) >= 0.990, cos


@pytest.mark.parametrize("name, numerics, why", [
    ("tiny-cohere2", {"rotation": "residual"},
     r"a LayerNorm \(Cohere\) centres its input, which the rotation keeps only for the "
     r"wide pipeline and a hidden size that is a power of two \(here 64\)"),
    ("tiny-exaone4", _w8(rotation="residual"),
     r"a post-norm \(EXAONE-4\.0, Gemma\) normalises a projection's output"),
])
def test_the_residual_rotation_is_refused_by_name_where_it_cannot_fold(name, numerics,
                                                                        why) -> None:
    from models.compiler import CompileError

    with pytest.raises(CompileError, match=r"bits\.numerics: rotation = 'residual' folds "
                                           r"RMSNorm gains .*" + why):
        _timing_compile(load_preset(name), numerics=numerics)


def _timing_compile(cfg, kv_read: str = "integer", numerics: dict | None = None, **kw):
    from models.bits import build_bit_config
    from models.compiler import HardwareTarget, compile_model
    from sim.device.hw import load_hardware

    opts = {"core_mode": "single", "max_seq": 16, "cap": 64} | kw
    bits = {"weights": "W8", "kv_read": kv_read} | ({"numerics": numerics} if numerics else {})
    return compile_model(cfg, build_bit_config(bits),
                         HardwareTarget.from_hw(load_hardware("tiny")), kv="int8",
                         functional=False, **opts)


def test_tiny_exaone4_blocks_qk_norm_and_post_norms() -> None:
    from isa.instructions import Vec, VecFunc
    from models.compiler.blocks.registry import features

    cfg = load_preset("tiny-exaone4")
    f = features(cfg)
    assert (f.attention, set(f.mlp)) == ("postnorm-gqa", {"postnorm-dense"})
    cm = _timing_compile(cfg)
    prog = cm.program(tokens=1, cache_size=5)
    norms = [(i.rows, i.cols) for i in prog.instructions
             if isinstance(i, Vec) and i.func == VecFunc.RMSNORM]
    hd, h, heads, kv = cfg.head_dim, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads
    # per layer (one core): the q heads of each KV group, then each KV head's k, then the
    # two post norms over whole rows; then the final norm. No norm before the projections.
    group = heads // kv
    per_layer = [(group, hd)] * kv + [(1, hd)] * kv + [(1, h), (1, h)]
    assert norms == per_layer * cfg.num_layers + [(1, h)]


def test_tiny_exaone4_runs_for_timing() -> None:
    import numpy as np

    from sim.device.hw import load_hardware
    from sim.runtime import Accelerator, Model

    cfg = load_preset("tiny-exaone4")
    model = Model(_timing_compile(cfg))
    model.launch(Accelerator(hw=load_hardware("tiny"), functional=False))
    model.infer(np.zeros((10, cfg.hidden_size), np.float32), cache_size=0)
    model.infer(np.zeros((1, cfg.hidden_size), np.float32), cache_size=10)


def test_tiny_exaone4_runs_functionally_against_the_float_reference() -> None:
    """QK norm, post-attention and post-MLP norms and no pre-norms, in integers (measured:
    mean 0.9939, worst call 0.985)."""
    cos = _tiny_cosines("tiny-exaone4")
    assert sum(cos) / len(cos) >= 0.99 and min(cos) >= 0.98, cos


def _real(stem: str, layers: int):
    """The real config.json with its first ``layers`` layers (every feature kept: the layer
    types of those layers), so that a compile at real widths stays short."""
    from models.source import load_model

    path = HF_DIR / f"{stem}.json"
    path = path if path.exists() else PRESETS / f"{stem}.json"
    full = load_model(path)
    return load_model(path, {"num_layers": layers,
                             "layer_types": list(full.layer_types[:layers])})


@pytest.mark.parametrize("stem, layers", [("command-r7b", 4), ("exaone-4.0-1.2b", 2)])
def test_real_configs_compile_and_run_a_decode_step_for_timing(stem: str, layers: int) -> None:
    from isa.instructions import Attn
    from models.bits import build_bit_config
    from models.compiler import HardwareTarget, compile_model
    from sim.device.device import Device, static_roofline
    from sim.device.hw import load_hardware

    cfg = _real(stem, layers)
    hw = load_hardware("aries")
    cm = compile_model(cfg, build_bit_config({"weights": "W8"}), HardwareTarget.from_hw(hw),
                       kv="int8", functional=False, max_seq=16, cap=8192)
    ctx = 8000
    prog = cm.program(tokens=1, cache_size=ctx)
    hd = cfg.head_dim
    attn = [i for i in prog.instructions if isinstance(i, Attn)]
    per_layer = len(attn) // layers
    keys = [(a.ctx, a.k_nbytes) for a in attn[::per_layer]]
    if stem == "command-r7b":  # sliding layers read their 4096-token window, int8 + header
        assert keys == [(4096, 8 + 4096 * hd)] * 3 + [(ctx + 1, (ctx + 1) * hd)]
    else:  # EXAONE-4.0-1.2B: every layer full
        assert keys == [(ctx + 1, (ctx + 1) * hd)] * layers
    run = Device(hw, functional=False, layout=cm.layout(host_bytes=1 << 24)).run(prog)
    assert run.duration_ps * 1e-12 >= static_roofline(prog, hw)["bound_s"]


def test_reference_features_by_their_formulas() -> None:
    import numpy as np

    from models.reference import ReferenceModel, layer_norm

    x = np.array([[1.0, 2.0, 3.0, 6.0]], np.float32)
    xc = x - 3.0
    assert np.allclose(layer_norm(x, np.ones(4, np.float32), 0.0),
                       xc / np.sqrt((xc**2).mean()), atol=1e-6)
    toks = np.arange(12) * 7 % 256
    base = load_preset("tiny-cohere2")
    ref = ReferenceModel(base)
    logits = ref.prefill(toks)
    # the logit scale multiplies the logits
    unscaled = build_model({**base.model_dump(exclude_none=True), "logit_scale": 1.0})
    assert np.allclose(ReferenceModel(unscaled).prefill(toks) * 0.25, logits, atol=1e-6)
    # a window as long as the sequence masks nothing: tokens up to 8 agree with a window
    # of 64, later ones do not
    wide = build_model({**base.model_dump(exclude_none=True), "sliding_window": 64})
    other = ReferenceModel(wide).prefill(toks)
    assert np.allclose(other[:8], logits[:8], atol=1e-5)
    assert not np.allclose(other[8:], logits[8:], atol=1e-3)
    # chunked: the cache of a sliding layer is masked the same way over calls
    ref.reset()
    chunks = np.concatenate([ref.forward(toks[:5]), ref.forward(toks[5:])])
    assert np.allclose(chunks, logits, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-cohere2", "tiny-exaone4"])
@pytest.mark.parametrize("wide", [False, True])
def test_compiled_files_keep_the_new_norms(name: str, wide: bool, tmp_path: Path) -> None:
    import numpy as np

    from models.bits import build_bit_config
    from models.compiler import CompiledModel, HardwareTarget, compile_model
    from sim.device.hw import load_hardware

    bits = {"weights": "W8"} | ({"numerics": _w8()} if wide else {})
    cm = compile_model(load_preset(name), build_bit_config(bits),
                       HardwareTarget.from_hw(load_hardware("tiny")), kv="int8",
                       functional=True, core_mode="single", max_seq=16, cap=64)
    cm.save(tmp_path / "m.kvm")
    back = CompiledModel.load(tmp_path / "m.kvm")
    assert back.program(tokens=3, cache_size=9) == cm.program(tokens=3, cache_size=9)
    image = [(a, bytes(b)) for a, b in cm.weight_image()]
    assert [(a, bytes(b)) for a, b in back.weight_image()] == image
    assert all(np.array_equal(getattr(x, f).gamma, getattr(y, f).gamma)
               for x, y in zip(cm.numerics.layers, back.numerics.layers, strict=True)
               for f in ("q_norm", "post_mlp_norm") if getattr(x, f).gamma is not None)
