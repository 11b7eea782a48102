"""Gemma 3 (``gemma3_text``): the config mapping of a published config.json, its weights'
names and their ``1 + w`` norms, the sandwich-norm and GeGLU blocks in timing mode, and a
tiny synthetic instance against the float reference in both integer pipelines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from isa.instructions import Vec, VecFunc
from kvsim.errors import ConfigError
from models.bits import build_bit_config, build_numerics
from models.compiler import CompileError
from models.hf import hf_config_to_model
from models.reference import ReferenceModel
from models.source import load_model, load_preset, open_weights
from sim.runtime.ready import ready_model

PRESETS = Path(__file__).resolve().parents[2] / "models" / "presets"


def test_gemma_3_1b_config_maps_to_its_features() -> None:
    # models/presets/gemma-3-1b.json: the config.json of google/gemma-3-1b-it
    c = load_preset("gemma-3-1b")
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == ("gemma3", 26, 1152, 4, 1, 256, 6912, 262144)
    # sliding_window_pattern 6: every sixth layer is full, the others keep 512 tokens
    assert [i for i in range(26) if c.layer_window(i) is None] == [5, 11, 17, 23]
    assert {c.layer_window(i) for i in range(26)} == {None, 512}
    assert all(c.layer_has_rope(i) for i in range(26))
    assert (c.norm_position, c.qk_norm, c.hidden_act, c.norm_unit_offset,
            c.tie_word_embeddings) == ("sandwich", True, "gelu_tanh", True, True)
    assert c.embed_scale == pytest.approx(1152**0.5) and c.query_pre_attn_scalar == 256.0
    # its sliding layers rotate with base 1e4, its full ones with 1e6
    assert (c.rope_theta, c.rope_local_theta) == (1e6, 1e4)
    # keras-hub's Gemma 3 presets: 999,885,952 parameters (embeddings tied)
    assert c.param_count == 999_885_952
    assert [s.name for s in c.layer_tensors(0)] == [
        "layers.0.attn_norm", "layers.0.q_proj", "layers.0.k_proj", "layers.0.v_proj",
        "layers.0.q_norm", "layers.0.k_norm", "layers.0.o_proj", "layers.0.post_attn_norm",
        "layers.0.mlp_norm", "layers.0.gate_proj", "layers.0.up_proj", "layers.0.down_proj",
        "layers.0.post_mlp_norm"]


@pytest.mark.parametrize("edit, match", [
    ({"final_logit_softcapping": 30.0}, r"final_logit_softcapping 30.0 \(logit soft-capping"),
    ({"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping 50.0"),
    ({"hidden_activation": "gelu"}, r"hidden_activation 'gelu' \(only 'gelu_pytorch_tanh'\)"),
    ({"use_bidirectional_attention": True}, r"use_bidirectional_attention true"),
    ({"sliding_window_pattern": 0}, r"sliding_window_pattern must be a positive integer"),
    ({"layer_types": ["full_attention"] * 3}, r"layer_types must be a list of 26 entries"),
])
def test_gemma_fields_kvsim_does_not_model_are_named(edit: dict, match: str) -> None:
    data = json.loads((PRESETS / "gemma-3-1b.json").read_text())
    data.update(edit)
    with pytest.raises(ConfigError, match=match):
        hf_config_to_model(data, where="gemma-3-1b.json")


def test_one_rope_base_for_every_layer_drops_rope_local_theta() -> None:
    data = json.loads((PRESETS / "gemma-3-1b.json").read_text())
    data["rope_local_base_freq"] = data["rope_theta"]
    assert hf_config_to_model(data).rope_local_theta is None


def test_safetensors_norms_are_read_as_one_plus_w(tmp_path) -> None:
    from safetensors.numpy import save_file

    from models.weights import SafetensorsWeights, SyntheticWeights, hf_tensor_name

    cfg = load_preset("tiny-gemma3")
    synth = SyntheticWeights(cfg, seed=3)
    stored = {}
    for spec in cfg.tensors():
        w = synth.tensor(spec.name)
        stored[hf_tensor_name(spec.name, family=cfg.family)] = (
            w - 1 if spec.role == "norm" else w)  # the checkpoint holds w of 1 + w
    assert {"model.layers.0.pre_feedforward_layernorm.weight",
            "model.layers.0.post_feedforward_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.self_attn.q_norm.weight"} <= set(stored)
    save_file(stored, str(tmp_path / "model.safetensors"))
    real = SafetensorsWeights(cfg, tmp_path / "model.safetensors")
    for name in ("layers.1.mlp_norm", "layers.1.post_mlp_norm", "layers.0.k_norm",
                 "final_norm", "layers.2.gate_proj", "embed"):
        assert np.allclose(real.tensor(name), synth.tensor(name), atol=1e-6), name


def _cosines(numerics: dict | None) -> list[float]:
    """Prefill 10 tokens, decode 6 (past the 8-token window) of tiny-gemma3 on the tiny
    preset: each call's logit cosine to the float reference with the same W8 weights."""
    cfg = load_preset("tiny-gemma3")
    bits = build_bit_config({"weights": "W8", **({"numerics": numerics} if numerics else {})})
    ready = ready_model(cfg, "tiny", bits=bits, core_mode="single", max_seq=16, cap=64)
    cm = ready.compiled
    model = ready.launch()
    ref = ReferenceModel(cfg, open_weights(cfg, cm.weights), weight_bits=cm.bits.weights)
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, size=16)
    want = ref.prefill(toks)
    emb = ready.embed(toks)
    # the host scales the embeddings as the float model does (sqrt(64) = 8)
    assert np.array_equal(emb, ref.embed(toks))
    assert np.array_equal(emb, 8 * cm.weight_source().tensor("embed")[toks])

    def cos(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    out = [cos(model.infer(emb[:10], cache_size=0)[0], want[9])]
    out += [cos(model.infer(emb[i:i + 1], cache_size=i)[0], want[i]) for i in range(10, 16)]
    funcs = {VecFunc(i.func) for i in cm.program(tokens=1, cache_size=5).instructions
             if isinstance(i, Vec)}
    gelu = VecFunc.GELU_MUL_WIDE if numerics else VecFunc.GELU_MUL
    assert gelu in funcs and not funcs & {VecFunc.SILU_MUL, VecFunc.SILU_MUL_WIDE}
    model.dispose()
    return out


def test_tiny_gemma3_runs_functionally_against_the_float_reference() -> None:
    """Sliding and full layers, QK norm, norms before and after attention and the MLP,
    GeGLU (GELU_MUL), the scaled embeddings and query_pre_attn_scalar, in the static int8
    scheme (measured: mean 0.9912, worst call 0.9812)."""
    cos = _cosines(None)
    assert sum(cos) / len(cos) >= 0.99 and min(cos) >= 0.98, cos


def test_tiny_gemma3_runs_the_wide_pipeline_against_the_float_reference() -> None:
    """The w8 numerics without the rotation (post-norms refuse it): RMSNORM_WIDE before
    each branch, the post-norms on int32 projection outputs, GELU_MUL_WIDE (measured: mean
    0.9974, worst call 0.9936)."""
    cos = _cosines(build_numerics({"preset": "w8", "rotation": "none"}).model_dump())
    assert sum(cos) / len(cos) >= 0.997 and min(cos) >= 0.993, cos


def test_gemma_3_1b_compiles_for_timing_and_refuses_functional() -> None:
    cfg = load_model("gemma-3-1b", {"num_layers": 6, "layer_types": (
        "sliding_attention",) * 5 + ("full_attention",)})
    ready = ready_model(cfg, "aries", max_seq=16, cap=1024, functional=False)
    prog = ready.compiled.program(tokens=1, cache_size=600)
    funcs = [VecFunc(i.func) for i in prog.instructions if isinstance(i, Vec)]
    # one KV head: core 0 normalises the attention input, the q heads and the k head,
    # then the token row of each post-norm; each of the 8 cores normalises the MLP input
    # for its gate/up rows (and the final norm for its LM-head rows) and runs its GeGLU
    assert funcs.count(VecFunc.RMSNORM) == 6 * (1 + 1 + 1 + 1 + 8 + 1) + 8
    assert funcs.count(VecFunc.GELU_MUL) == 6 * 8 and VecFunc.SILU_MUL not in funcs
    with pytest.raises(CompileError, match=r"rope_local_theta 10000.*timing only"):
        ready_model(cfg, "aries", max_seq=16, cap=1024, functional=True)
    with pytest.raises(ConfigError, match=r"rope_local_theta 10000"):
        ReferenceModel(cfg)
