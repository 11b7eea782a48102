"""The ``w4g32`` numerics on the embedded real model (SmolLM2-135M-Instruct): W4V8 weights
(4-bit group-wise g32 through ``gemm.gr``; v_proj and the head 8-bit), the int8 KV cache
and the integer read path on ``aries``, teacher-forced over 257 tokens of
``models/data/english.txt`` through the simulated NPU against the float reference.

Issue 13's target: top-1 agreement >= 0.80 and mean KL <= 0.25. Measured (deterministic:
fixed file, fixed text, fixed encoding; calibrated with machine-independent products,
:mod:`models.exact`): top-1 219/256 = 0.855, KL 0.0778, perplexity 19.56 (float 17.53).
The numerics study's emulator measured 0.891 / 0.034 with an int16 residual carrying a
per-token exponent and per-token q/k/v; this build keeps a static int16 residual scale and
static q/k/v (the options the compiler builds).

Also the ``w8`` numerics (W8, rotated int16 residual) through the dequantize-on-read KV path
(``attn.dq``, fp16 attention): measured top-1 242/256 = 0.945, KL 0.0210 (the integer read
path's targets are top-1 >= 0.90, KL <= 0.05)."""

from __future__ import annotations

import pytest

from models.bits import NUMERICS_PRESETS, W4V8, W8, BitConfig
from models.source import EMBEDDED_MODEL, english_text, resolve_model
from sim.app.quality import evaluate
from tests.groups import REAL_OTHER, REAL_W8

TEXT_TOKENS = 257


@pytest.fixture(scope="module")
def text():
    src = resolve_model(EMBEDDED_MODEL)
    ids = src.tokenizer().encode(english_text())[:TEXT_TOKENS]
    assert len(ids) == TEXT_TOKENS
    return src, ids


@pytest.fixture(scope="module")
def quality(text):
    src, ids = text
    bits = BitConfig(weights=W4V8, numerics=NUMERICS_PRESETS["w4g32"])
    return evaluate(src, ids, bits=bits, kv="int8", hw="aries")


@pytest.mark.xdist_group(REAL_OTHER)
def test_w4g32_numerics_meet_the_teacher_forced_targets(quality) -> None:
    q = quality
    print(f"w4g32 numerics, {q.tokens} tokens: top-1 {q.top1_agreement:.4f}, KL "
          f"{q.kl_mean:.4f}, perplexity {q.perplexity:.2f} (float {q.reference_perplexity:.2f})")
    assert q.degenerate is None
    assert q.top1_agreement >= 0.80 and q.kl_mean <= 0.25
    # the measured figures (deterministic)
    assert round(q.top1_agreement * (TEXT_TOKENS - 1)) == 219
    assert q.kl_mean == pytest.approx(0.07785, abs=5e-4)
    # as the README quotes them
    assert (f"{q.top1_agreement:.3f}", f"{q.kl_mean:.3f}", f"{q.perplexity:.2f}",
            f"{q.reference_perplexity:.2f}") == ("0.855", "0.078", "19.56", "17.53")


@pytest.mark.xdist_group(REAL_W8)
def test_w8_numerics_through_the_dequant_read_path(text) -> None:
    src, ids = text
    bits = BitConfig(weights=W8, numerics=NUMERICS_PRESETS["w8"], kv_read="dequant")
    q = evaluate(src, ids, bits=bits, kv="int8", hw="aries")
    print(f"w8 numerics, dequant read: top-1 {q.top1_agreement:.4f}, KL {q.kl_mean:.4f}")
    assert q.degenerate is None and q.kv_read == "dequant"
    assert q.top1_agreement >= 0.90 and q.kl_mean <= 0.05
    assert round(q.top1_agreement * (TEXT_TOKENS - 1)) == 242
    assert q.kl_mean == pytest.approx(0.02097, abs=5e-4)
    assert (f"{q.top1_agreement:.3f}", f"{q.kl_mean:.3f}") == ("0.945", "0.021")  # README
