"""Quality measured on the simulated NPU (``sim.app.quality.evaluate``): deterministic figures
on the tiny synthetic model, and the degenerate-output guard on the embedded real model
under the old numerics (one static int8 scale for the residual stream)."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import build_bit_config
from models.quality import DegenerateOutput, perplexity
from models.source import EMBEDDED_MODEL, english_text, resolve_model
from sim.app.quality import bit_config, evaluate, reference_logits
from sim.runtime.ready import source_of
from tests.groups import REAL_OTHER

IDS = np.random.default_rng(3).integers(0, 256, size=40)


def test_tiny_figures_are_exact_and_the_reference_is_the_float_model() -> None:
    q = evaluate("tiny", IDS, bits=build_bit_config({}), hw="tiny")
    assert (q.model, q.real_weights, q.tokens, q.bits, q.kv, q.kv_read, q.hw,
            q.degenerate) == ("tiny", False, 40, "W8", "int8", "integer", "tiny", None)
    assert q.perplexity == pytest.approx(265.18519621204075, rel=1e-9)
    assert q.kl_mean == pytest.approx(0.0001445985293045312, rel=1e-9)
    assert q.top1_agreement == pytest.approx(32 / 39)
    ref = reference_logits(source_of("tiny"), IDS)
    assert q.reference_perplexity == pytest.approx(perplexity(ref, IDS), rel=1e-12)
    assert q.prefill_s > 0


def test_a_text_split_over_calls_gives_the_same_logits() -> None:
    one = evaluate("tiny", IDS, bits=build_bit_config({}), hw="tiny")
    split = evaluate("tiny", IDS, bits=build_bit_config({}), hw="tiny", chunk_tokens=16)
    assert (split.perplexity, split.kl_mean) == (one.perplexity, one.kl_mean)
    assert split.prefill_s > one.prefill_s  # three calls: the weights stream three times


def test_evaluations_are_kept_per_configuration() -> None:
    bits = build_bit_config({})
    one = evaluate("tiny", IDS, bits=bits, hw="tiny")
    kivi = evaluate("tiny", IDS, bits=bits, hw="tiny", kv="kivi-4")
    # another key, another run: the same logits here (40 tokens stay in KIVI's fp16
    # window, which holds the int8 pipeline's values exactly), another cache layout's time
    assert kivi.kv == "kivi-4" and kivi.prefill_s != one.prefill_s
    assert evaluate("tiny", IDS, bits=bits, hw="tiny") == one
    # a given reference is not kept: simulated again, the same figures
    ref = reference_logits(source_of("tiny"), IDS)
    assert evaluate("tiny", IDS, bits=bits, hw="tiny", reference=ref) == one
    assert not ref.flags.writeable  # the kept reference is shared, so read-only


@pytest.mark.parametrize(("ids", "needle"), [([5], "at least 2"),
                                             ([0, 256], "ids must lie in 0..255")])
def test_bad_texts_are_refused(ids, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        evaluate("tiny", ids, bits=build_bit_config({}), hw="tiny")


@pytest.mark.parametrize(("kw", "needle"), [
    ({"bits": "W3"}, "bits: unknown weight-bit preset 'W3'"),
    ({"numerics": "fp8"}, "numerics.preset: unknown numerics preset 'fp8'"),
    ({"kv_read": "float"}, "kv_read: 'float' is not one of integer, dequant"),
])
def test_bad_bit_options_are_refused(kw, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        bit_config(**kw)


@pytest.fixture(scope="module")
def smol_ids() -> list[int]:
    src = resolve_model(EMBEDDED_MODEL)
    return src.tokenizer().encode(english_text())[:48]


@pytest.mark.xdist_group(REAL_OTHER)
def test_the_guard_fires_on_the_old_numerics_of_a_real_model(smol_ids) -> None:
    bits = bit_config("W8", numerics="static-int8")
    with pytest.raises(DegenerateOutput, match="NPU logits: .*(zero|constant)"):
        evaluate(EMBEDDED_MODEL, smol_ids, bits=bits)


# That the guard stays quiet on the w8 numerics is asserted by
# tests/sim/test_numerics_real.py (its teacher-forced run compares with the guard on).


LONG_IDS = np.random.default_rng(5).integers(0, 256, size=300)


def test_position_buckets_partition_the_predictions_and_average_to_the_total() -> None:
    q = evaluate("tiny", LONG_IDS, bits=build_bit_config({}), hw="tiny", kv="kivi-2")
    # 299 predictions cut at BUCKET_STARTS (0, 128, 256): contiguous, covering all of them
    assert [(b.start, b.end) for b in q.buckets] == [(0, 128), (128, 256), (256, 299)]
    assert sum(b.positions for b in q.buckets) == q.tokens - 1
    n = q.tokens - 1
    assert sum(b.kl_mean * b.positions for b in q.buckets) / n == pytest.approx(q.kl_mean,
                                                                                rel=1e-12)
    assert sum(b.top1_agreement * b.positions for b in q.buckets) / n == pytest.approx(
        q.top1_agreement, rel=1e-12)
    # kivi-2 keeps the latest 128 tokens in fp16: the earliest positions attend over an
    # unquantized cache, the later ones over 2-bit codes as well
    assert q.buckets[0].kl_mean < q.buckets[2].kl_mean
    assert q.as_dict()["buckets"][1] == {"start": 128, "end": 256,
                                         "kl_mean": q.buckets[1].kl_mean,
                                         "top1_agreement": q.buckets[1].top1_agreement}
