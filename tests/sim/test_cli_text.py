"""``kvsim eval`` and ``kvsim generate`` on the embedded real model: their JSON objects,
the degenerate-output guard as an error by default, and bad arguments refused."""

from __future__ import annotations

import json

import pytest

from sim.app.cli.main import main
from tests.groups import REAL_OTHER

# Today's default numerics (one static int8 scale for the residual stream) zero every
# logit of SmolLM2-135M: the guard must refuse the run.
OLD = ["--numerics", "static-int8"]


@pytest.mark.xdist_group(REAL_OTHER)
def test_generate_refuses_degenerate_output_by_default(capsys) -> None:
    assert main(["generate", "--prompt", "The capital of France is", "--max-new-tokens",
                 "2", *OLD]) == 2
    err = capsys.readouterr().err
    assert "kvsim: error: NPU logits of the prompt: all 49152 logits are zero" in err


@pytest.mark.xdist_group(REAL_OTHER)
def test_eval_json_with_the_guard_overridden(capsys) -> None:
    assert main(["eval", "--max-tokens", "16", "--allow-degenerate", "--json", *OLD]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"tokens", "perplexity", "reference_perplexity", "kl_mean",
            "top1_agreement"} <= set(out)
    assert (out["tokens"], out["model"], out["real_weights"], out["kv"], out["kv_read"],
            out["text"]) == (16, "smollm2-135m", True, "int8", "integer",
                             "models/data/english.txt")
    assert out["degenerate"] == "15 of 16 logits rows are constant (first: row 1)"
    assert out["top1_agreement"] == 0.0


@pytest.mark.parametrize(("args", "needle"), [
    (["eval", "--max-tokens", "3"], "--max-tokens: must be >= 16, got 3"),
    (["eval", "--text", "/nonexistent/t.txt"], "--text /nonexistent/t.txt: cannot read"),
    (["eval", "--bits", "W5"], "bits: unknown weight-bit preset 'W5'"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "temperature: must be a finite"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens: must be an"),
    (["generate", "--prompt", "x", "--model", "tiny"], "synthetic weights and no tokenizer"),
])
def test_bad_arguments_are_one_clear_error(args, needle, capsys) -> None:
    assert main(args) == 2
    assert needle in capsys.readouterr().err
