"""A generate run with a prompt text (``workload.prompt``): its tokens are the prompt, the
generated text and the float reference's continuation land in ``metrics.json`` beside the
weights' label (real or synthetic), and the degenerate-output guard stops a functional run
of real weights whose logits cannot be right unless ``sim.allow_degenerate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.app.cli.main import main
from tests.groups import REAL_OTHER, REAL_W8

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "real-model.toml"
TINY = ["--set", "hardware.preset=tiny", "--set", "model.preset=tiny", "--set",
        "compile.core_mode=single", "--set", "workload.prompt_tokens=8", "--set",
        "workload.output_tokens=2"]
SMOL = ["--set", "model.preset=smollm2-135m", "--set", "sim.fidelity=functional",
        "--set", "workload.prompt=The capital of France is", "--set",
        "workload.output_tokens=2", "--set", "outputs.trace=off",
        # today's default numerics: one static int8 scale, every logit of SmolLM2 zero
        "--set", "bits.numerics.preset=static-int8"]


def _metrics(out) -> dict:
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("fidelity", ["timing", "functional"])
def test_synthetic_weights_are_labelled(tmp_path, fidelity) -> None:
    assert main(["run", "--out", str(tmp_path), "-q", *TINY, "--set",
                 f"sim.fidelity={fidelity}"]) == 0
    m = _metrics(tmp_path)
    assert m["weights"] == {"kind": "synthetic", "real": False}
    if fidelity == "timing":
        assert m["text"] is None
    else:  # synthetic weights: no tokenizer, no text, no guard
        assert m["text"] == {"prompt": None, "generated_text": None, "degenerate": None}


def test_a_prompt_text_needs_a_model_with_a_tokenizer(tmp_path, capsys) -> None:
    assert main(["run", "--out", str(tmp_path / "o"), "-q", *TINY, "--set",
                 "workload.prompt=Hello"]) == 2
    assert "workload.prompt: the model has synthetic weights and no tokenizer" in \
        capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.xdist_group(REAL_OTHER)
def test_the_guard_stops_a_real_model_run_on_degenerate_logits(tmp_path, capsys) -> None:
    assert main(["run", "--out", str(tmp_path / "o"), "-q", *SMOL]) == 2
    err = capsys.readouterr().err
    assert "kvsim: error: NPU logits of the prompt: " in err
    assert "sim.allow_degenerate = true" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.xdist_group(REAL_OTHER)
def test_allow_degenerate_records_it_with_the_texts(tmp_path) -> None:
    assert main(["run", "--out", str(tmp_path), "-q", *SMOL, "--set",
                 "sim.allow_degenerate=true"]) == 0
    m = _metrics(tmp_path)
    assert m["weights"]["real"] is True and m["weights"]["kind"] == "gguf"
    assert m["config"]["workload"]["prompt_tokens"] == 5  # the prompt text's tokens
    t = m["text"]
    assert t["prompt"] == "The capital of France is"
    assert t["reference_text"] == " Paris."  # the float reference's 2 greedy tokens
    assert t["first_difference"] == 0
    assert t["degenerate"].startswith("NPU logits of the prompt: ")


@pytest.mark.xdist_group(REAL_W8)
def test_the_real_model_config_continues_its_prompt_as_the_reference_does(tmp_path) -> None:
    assert main(["run", str(CONFIG), "--out", str(tmp_path), "-q", "--set",
                 "outputs.trace=off"]) == 0
    t = _metrics(tmp_path)["text"]
    assert t["degenerate"] is None
    # the answer is the reference's; past it the two part at a near-tie (" The United
    # States ..." vs " The answer is ..."): the float reference runs the GGUF's Q4_1
    # weights, the device their W8 re-quantization (tests/sim/test_numerics_real.py holds
    # the device's own weights against the float model and matches 16 tokens)
    assert t["generated_text"].startswith(" Paris.\n\n"), t["generated_text"]
    assert t["reference_text"].startswith(" Paris.\n\n"), t["reference_text"]
    assert t["first_difference"] == 5, (t["generated_text"], t["reference_text"])
