"""Loading models as users hold them: GGUF files, Hugging Face folders, bare config.json
files, presets; one name for all of them (``models.source.resolve_model``)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.gguf import (
    GGUFWeights,
    gguf_tokenizer,
    open_gguf,
    permute_rope_rows,
    unpermute_rope_rows,
)
from models.reference import ReferenceModel
from models.source import load_model, open_weights, resolve_model
from models.weights import SyntheticWeights

from .model_files import TINY_LLAMA, write_gguf, write_hf_folder

Q = gguf.GGMLQuantizationType


def _same_arch(a, b) -> bool:
    return a.model_dump(exclude={"name"}) == b.model_dump(exclude={"name"})


def test_rope_permutation_round_trips_and_interleaves() -> None:
    d, heads = 8, 2
    w = np.arange(heads * d, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    g = permute_rope_rows(w, heads)
    # HF pairs row i with i + d/2; GGUF stores each pair next to each other (2i, 2i+1)
    assert g[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    assert np.array_equal(unpermute_rope_rows(g, heads), w)
    assert np.array_equal(unpermute_rope_rows(g[:, 0], heads), w[:, 0])  # a bias too


def test_gguf_f32_gives_back_the_exact_weights_in_hf_layout(tmp_path: Path) -> None:
    synth = SyntheticWeights(TINY_LLAMA, seed=3)
    p = write_gguf(tmp_path / "m.gguf", TINY_LLAMA, synth, matrix_type=Q.F32)
    f = open_gguf(p)
    assert _same_arch(f.config, TINY_LLAMA) and f.config.name == "m"
    w = GGUFWeights(f.config, p)
    for spec in TINY_LLAMA.tensors():
        assert np.array_equal(w.tensor(spec.name), synth.tensor(spec.name)), spec.name


@pytest.mark.parametrize("qtype, rel_err", [(Q.F16, 1e-3), (Q.Q8_0, 0.01), (Q.Q4_1, 0.1),
                                            (Q.Q4_0, 0.15)])
def test_gguf_quantized_tensors_dequantize_close(tmp_path: Path, qtype, rel_err) -> None:
    synth = SyntheticWeights(TINY_LLAMA, seed=4)
    p = write_gguf(tmp_path / "m.gguf", TINY_LLAMA, synth, matrix_type=qtype)
    w = GGUFWeights(open_gguf(p).config, p)
    for name in ("layers.0.q_proj", "layers.1.k_proj", "layers.1.down_proj", "embed"):
        a, b = w.tensor(name), synth.tensor(name)
        assert a.dtype == np.float32 and a.shape == b.shape
        err = np.abs(a - b).max() / np.abs(b).max()
        assert 0 < err < rel_err, (name, err)  # quantized (not exact), and close


def test_gguf_and_hf_folder_of_the_same_weights_give_the_same_logits(tmp_path: Path) -> None:
    synth = SyntheticWeights(TINY_LLAMA, seed=5)
    g = resolve_model(write_gguf(tmp_path / "m.gguf", TINY_LLAMA, synth, matrix_type=Q.F32))
    h = resolve_model(write_hf_folder(tmp_path / "hf", TINY_LLAMA, synth, shards=3))
    assert (g.kind, h.kind) == ("gguf", "hf") and g.real and h.real
    assert h.weights == {"kind": "safetensors", "paths": [
        str(tmp_path / "hf" / f"model-0000{i}-of-00003.safetensors") for i in (1, 2, 3)]}
    assert _same_arch(g.config, h.config)
    tokens = [5, 77, 200, 3, 9, 120]
    lg = ReferenceModel(g.config, g.open_weights()).prefill(tokens)
    lh = ReferenceModel(h.config, h.open_weights()).prefill(tokens)
    assert np.abs(lg - lh).max() == 0.0


def test_every_way_to_name_a_model(tmp_path: Path) -> None:
    synth = SyntheticWeights(TINY_LLAMA, seed=0)
    folder = write_hf_folder(tmp_path / "hf", TINY_LLAMA, synth)
    preset = resolve_model("tiny")
    assert (preset.kind, preset.real, preset.weight_spec(7)) == (
        "preset", False, {"kind": "synthetic", "seed": 7})
    bare = resolve_model(folder / "config.json")
    assert (bare.kind, bare.real, bare.config.name) == ("config", False, "hf")
    assert _same_arch(bare.config, TINY_LLAMA)
    gg = resolve_model(str(write_gguf(tmp_path / "m.gguf", TINY_LLAMA, synth)))
    assert gg.weight_spec(7) == {"kind": "gguf", "path": str(tmp_path / "m.gguf")}
    for name in (folder, folder / "config.json", tmp_path / "m.gguf"):
        assert _same_arch(load_model(name), TINY_LLAMA)
        assert load_model(str(name), {"num_layers": 1}).num_layers == 1
    with pytest.raises(ConfigError, match="synthetic weights and no tokenizer"):
        bare.tokenizer()
    with pytest.raises(ConfigError, match="weights: unknown kind 'npz'"):
        open_weights(TINY_LLAMA, {"kind": "npz"})


def test_fewer_layers_than_the_file_read_only_what_they_need(tmp_path: Path) -> None:
    synth = SyntheticWeights(TINY_LLAMA, seed=1)
    p = write_gguf(tmp_path / "m.gguf", TINY_LLAMA, synth, matrix_type=Q.F32)
    one = load_model(p, {"num_layers": 1})
    w = open_weights(one, {"kind": "gguf", "path": str(p)})
    assert np.array_equal(w.tensor("layers.0.v_proj"), synth.tensor("layers.0.v_proj"))
    with pytest.raises(ConfigError, match="has no tensor 'layers.1.v_proj'"):
        w.tensor("layers.1.v_proj")


def test_gguf_tokenizer_from_vocabulary(tmp_path: Path) -> None:
    p = write_gguf(tmp_path / "m.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA))
    tok = gguf_tokenizer(open_gguf(p))
    text = "Hello, wörld 42!"
    ids = tok.encode(text)
    assert ids == list(text.encode())  # a byte vocabulary without merges: one id per byte
    assert tok.decode(ids) == text and tok.vocab_size == 256


def test_hf_folder_tokenizer_and_chat_template(tmp_path: Path) -> None:
    p = write_gguf(tmp_path / "m.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA))
    folder = write_hf_folder(tmp_path / "hf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA))
    gguf_tokenizer(open_gguf(p)).backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
                         "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
        "bos_token": "A", "eos_token": "B"}))
    tok = resolve_model(folder).tokenizer()
    assert tok.encode("hi") == [ord("h"), ord("i")] and (tok.bos_id, tok.eos_id) == (65, 66)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "[user]hi[assistant]")


def test_a_run_on_a_gguf_model(tmp_path: Path) -> None:
    from sim.app.config import load_run_config
    from sim.app.run import run

    p = write_gguf(tmp_path / "m.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA, seed=2))
    cfg = tmp_path / "run.toml"
    cfg.write_text('[hardware]\npreset = "tiny"\n[model]\npreset = "tiny"\n'
                   '[compile]\ncore_mode = "single"\n'
                   '[workload]\nprompt_tokens = 8\noutput_tokens = 2\n')
    res = run(load_run_config(cfg, [f"model.preset='{p}'", "sim.fidelity='functional'"]))
    m = res.metrics.to_metrics()
    assert m["scenario"].startswith("m W8 kv=int8: prefill 8 + decode 2")
    assert m["functional"] and len(m["generated_tokens"]) == 2
    # the same run on a GGUF file of other weights generates from those weights
    q = write_gguf(tmp_path / "q.gguf", TINY_LLAMA, SyntheticWeights(TINY_LLAMA, seed=9))
    other = run(load_run_config(cfg, [f"model.preset='{q}'", "sim.fidelity='functional'"]))
    o = other.metrics.to_metrics()
    assert o["prefill"] != m["prefill"] or o["generated_tokens"] != m["generated_tokens"]


@pytest.mark.parametrize("form", ["gguf", "folder", "config.json"])
def test_kvsim_compile_takes_every_form(tmp_path: Path, form: str) -> None:
    from models.compiler import CompiledModel
    from sim.app.cli.main import main

    synth = SyntheticWeights(TINY_LLAMA, seed=6)
    name = {"gguf": write_gguf(tmp_path / "m.gguf", TINY_LLAMA, synth),
            "folder": write_hf_folder(tmp_path / "hf", TINY_LLAMA, synth),
            "config.json": write_hf_folder(tmp_path / "hf", TINY_LLAMA, synth) / "config.json",
            }[form]
    out = tmp_path / "m.kvm"
    assert main(["compile", "--model", str(name), "--hw", "tiny", "--core-mode", "single",
                 "--max-seq", "8", "--cache-length", "32", "--timing-only", "--seed", "3",
                 "-o", str(out)]) == 0
    cm = CompiledModel.load(out)
    assert _same_arch(cm.model, TINY_LLAMA)
    assert cm.weights == {
        "gguf": {"kind": "gguf", "path": str(name)},
        "folder": {"kind": "safetensors", "paths": [str(tmp_path / "hf/model.safetensors")]},
        "config.json": {"kind": "synthetic", "seed": 3}}[form]
    assert np.array_equal(cm.weight_source().tensor("layers.1.up_proj"),
                          synth.tensor("layers.1.up_proj")) == (form == "folder")
