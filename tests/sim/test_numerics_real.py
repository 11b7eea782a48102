"""The ``w8`` numerics on the embedded real model (SmolLM2-135M-Instruct), W8 weights and
the int8 KV cache on ``aries``, through the simulated NPU (the greedy checks share one
compile and launch; the teacher-forced run is ``sim.app.quality.evaluate``'s, which the quality
table's int8 row reuses):

- teacher-forced over 257 tokens of ``models/data/english.txt``: top-1 agreement >= 0.90
  and mean KL <= 0.05 against the float reference (the numerics study measured 0.928 /
  0.020 with an emulator of the same recipe);
- greedy continuations of three prompts identical for 16 tokens to the float reference
  *with the device's weights* (the rotated W8 weights, float activations): the study
  found that against the Q4_1 float weights two of three prompts part at a near-tie at
  the fourth token with float activations too, i.e. because of the W8 re-quantization,
  not the integer pipeline. Against the device's weights, "The three primary colors are"
  still parts at its fourth token (a near-tie); the third prompt here is another one.
  Checked by teacher forcing: if the NPU's argmax after every
  prefix of the reference's continuation is the reference's next token, the NPU's own
  greedy continuation is the same (each step sees the same tokens).
"""

from __future__ import annotations

import numpy as np
import pytest

from models.bits import NUMERICS_PRESETS, W8, BitConfig
from models.compiler.rotation import RotatedWeights
from models.reference import ReferenceModel
from models.source import EMBEDDED_MODEL, english_text, resolve_model
from sim.app.quality import evaluate, ready_for_text
from sim.device.hw import load_hardware
from sim.runtime import ModelConfig
from tests.groups import REAL_W8

pytestmark = pytest.mark.xdist_group(REAL_W8)

TEXT_TOKENS = 257
GREEDY_TOKENS = 16
PROMPTS = ("chat:What is the capital of France?",
           "Once upon a time, in a small village by the sea, there lived",
           "chat:Who wrote Romeo and Juliet?")


class _Untied:
    """The device's float weights as a reference model reads them: the rotation unties the
    LM head from the embedding table, so the reference gets an untied config."""

    def __init__(self, inner: RotatedWeights):
        self.inner = inner
        cfg = inner.config  # validated anew: a copy would keep the tied tensor index
        self.config = type(cfg).model_validate({**cfg.model_dump(), "tie_word_embeddings": False})

    def tensor(self, name: str) -> np.ndarray:
        return self.inner.tensor(name)


@pytest.fixture(scope="module")
def run():
    src = resolve_model(EMBEDDED_MODEL)
    tok = src.tokenizer()
    hw = load_hardware("aries")
    bits = BitConfig(weights=W8, numerics=NUMERICS_PRESETS["w8"])
    ready = ready_for_text(src, bits, kv="int8", hw=hw, tokens=TEXT_TOKENS)
    cm = ready.compiled
    model = ready.launch(ModelConfig(all_logits=True))

    def npu(ids: list[int]) -> np.ndarray:
        rows = []
        for t0 in range(0, len(ids), cm.max_seq):
            chunk = np.asarray(ids[t0:t0 + cm.max_seq])
            [out] = model.infer(ready.embed(chunk), cache_size=t0, all_logits=True)
            rows.append(out)
        return np.concatenate(rows)

    dev = _Untied(cm.weight_source())
    ref_w8 = ReferenceModel(dev.config, dev, weight_bits=W8)
    yield src, tok, npu, ref_w8
    model.dispose()


def test_w8_numerics_meet_the_teacher_forced_targets(run) -> None:
    src, tok, _, _ = run
    ids = tok.encode(english_text())[:TEXT_TOKENS]
    assert len(ids) == TEXT_TOKENS
    # through sim.app.quality.evaluate, which keeps the result: the quality table's int8 row
    # (tests/sim/test_quality_table.py, same text, same worker) is this configuration
    q = evaluate(src, ids, bits=BitConfig(weights=W8, numerics=NUMERICS_PRESETS["w8"]),
                 kv="int8", hw="aries")
    assert (q.tokens, q.kv, q.kv_read, q.hw) == (TEXT_TOKENS, "int8", "integer", "aries")
    print(f"w8 numerics, {q.tokens} tokens: top-1 {q.top1_agreement:.4f}, KL "
          f"{q.kl_mean:.4f}, perplexity {q.perplexity:.2f} (float {q.reference_perplexity:.2f})")
    assert q.degenerate is None
    assert q.top1_agreement >= 0.90
    assert q.kl_mean <= 0.05


def _prompt_ids(tok, prompt: str) -> list[int]:
    if prompt.startswith("chat:"):
        text = tok.apply_chat_template([{"role": "user", "content": prompt[5:]}])
        return tok.encode(text)
    return tok.encode(prompt)


def _greedy(ref: ReferenceModel, ids: list[int], n: int) -> list[int]:
    ref.reset()
    out = []
    logits = ref.prefill(ids)[-1]
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = ref.decode(out[-1])
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuations_match_the_float_model_with_the_device_weights(run,
                                                                            prompt) -> None:
    _, tok, npu, ref_w8 = run
    ids = _prompt_ids(tok, prompt)
    cont = _greedy(ref_w8, ids, GREEDY_TOKENS)
    logits = npu(ids + cont[:-1])
    picks = [int(t) for t in np.argmax(logits[len(ids) - 1:], axis=-1)]
    print(f"{prompt!r}: {tok.decode(cont)!r}")
    assert picks == cont
