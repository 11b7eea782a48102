"""The quality metrics (teacher-forced perplexity, KL, top-1 agreement) and the
degenerate-output guard, against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.quality import (
    DegenerateOutput,
    collapsed,
    compare,
    degenerate_logits,
    kl_per_position,
    log_softmax,
    next_token_nll,
    perplexity,
    repeat_share,
    top1_agreement,
)

CONFIG = dict(model="m", real_weights=False, bits="W8", numerics={}, kv="int8",
              kv_read="integer", hw="tiny", prefill_s=0.0)


def test_log_softmax_normalises_and_ignores_row_offsets() -> None:
    x = np.random.default_rng(0).normal(size=(3, 7)) * 50
    lp = log_softmax(x)
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(log_softmax(x + np.array([[1e4], [-3.0], [0.5]])), lp,
                               atol=1e-9)


def test_perplexity_of_a_uniform_guess_is_the_vocabulary() -> None:
    assert perplexity(np.zeros((5, 11)), [0, 1, 2, 3, 4]) == pytest.approx(11.0)


def test_perplexity_of_a_sure_and_right_model_is_one_and_nll_is_by_hand() -> None:
    tokens = [2, 0, 1]
    logits = np.full((3, 3), -100.0)
    logits[0, 0] = logits[1, 1] = 100.0  # predicts tokens 0 then 1: right
    assert perplexity(logits, tokens) == pytest.approx(1.0)
    two = np.log(np.array([[1.0, 3.0], [1.0, 1.0]]))  # P(next=1) = 3/4, then 1/2
    np.testing.assert_allclose(next_token_nll(two, [0, 1]), [-math.log(0.75)])
    assert perplexity(two, [0, 1]) == pytest.approx(4 / 3)


def test_kl_by_hand_zero_for_equal_rows_and_asymmetric() -> None:
    p = np.log(np.array([[0.5, 0.5]]))
    q = np.log(np.array([[0.25, 0.75]]))
    expect = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_per_position(p, q)[0] == pytest.approx(expect)
    back = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kl_per_position(q, p)[0] == pytest.approx(back)
    assert kl_per_position(p + 7.0, p)[0] == pytest.approx(0.0, abs=1e-15)


def test_top1_agreement_counts_matching_argmax() -> None:
    ref = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0.0]])
    npu = np.array([[0, 2, 0], [0, 1, 0], [0, 0, 5], [9, 1, 0.0]])
    assert top1_agreement(ref, npu) == 0.5


@pytest.mark.parametrize(("logits", "needle"), [
    (np.zeros((4, 8)), "all 32 logits are zero"),
    (np.full((2, 8), 3.0), "2 of 2 logits rows are constant"),
    (np.array([[0.0, 1.0], [2.0, 2.0]]), "1 of 2 logits rows are constant (first: row 1)"),
    (np.array([[0.0, np.nan], [1.0, 2.0]]), "1 of 4 logits are NaN or inf"),
])
def test_the_guard_names_what_is_wrong(logits, needle) -> None:
    assert needle in degenerate_logits(logits)


def test_the_guard_passes_ordinary_logits() -> None:
    assert degenerate_logits(np.random.default_rng(1).normal(size=(4, 16))) is None


def test_collapse_to_one_token_is_caught_only_when_the_reference_does_not() -> None:
    assert repeat_share([3, 3, 3, 4]) == 0.75
    stuck, varied = [7] * 10, list(range(10))
    assert "collapsed to token 7 (100% of 10 tokens)" in collapsed(stuck, varied)
    assert collapsed(stuck, [7] * 10) is None  # the reference repeats too
    assert collapsed(varied, stuck) is None
    assert collapsed([7] * 5, varied) is None  # too short to say


def test_compare_refuses_degenerate_logits_unless_asked() -> None:
    rng = np.random.default_rng(2)
    ref, tokens = rng.normal(size=(6, 10)), [1, 2, 3, 4, 5, 6]
    with pytest.raises(DegenerateOutput, match="all 60 logits are zero"):
        compare(ref, np.zeros((6, 10)), tokens, **CONFIG)
    q = compare(ref, np.zeros((6, 10)), tokens, allow_degenerate=True, **CONFIG)
    assert q.degenerate == "all 60 logits are zero"
    assert q.perplexity == pytest.approx(10.0) and q.tokens == 6
    same = compare(ref, ref, tokens, **CONFIG)
    assert (same.kl_mean, same.top1_agreement, same.degenerate) == (0.0, 1.0, None)
    assert same.perplexity == same.reference_perplexity


def _whole(ref, npu, tokens, first=0):
    """The figures over the whole arrays at once (the computation before streaming)."""
    from models.quality import _kl, _nll, log_softmax
    r, q = ref[first:-1], npu[first:-1]
    lp, lq = log_softmax(r), log_softmax(q)
    tail = np.asarray(tokens[first:], np.int64)
    kl = _kl(lp, lq)
    return (float(np.exp(_nll(lq, tail).mean())), float(np.exp(_nll(lp, tail).mean())),
            float(kl.mean()), float(kl.max()),
            float((r.argmax(axis=-1) == q.argmax(axis=-1)).mean()))


@pytest.mark.parametrize(("n", "first", "blocks"), [(300, 0, 7), (300, 41, 256), (40, 3, 1)])
def test_streamed_figures_equal_the_whole_arrays_bit_for_bit(n, first, blocks) -> None:
    from models.quality import QualityStream
    rng = np.random.default_rng(n + first)
    ref = rng.normal(0, 3, (n, 97))  # the float reference's float64
    npu = (ref + rng.normal(0, 0.5, (n, 97))).astype(np.float32)
    tokens = rng.integers(0, 97, n).tolist()
    stream = QualityStream(tokens, first=first)
    for lo in range(0, n, blocks):  # rows before ``first`` are skipped
        stream.add(ref[lo:lo + blocks], npu[lo:lo + blocks], lo)
    q = stream.result(**CONFIG)
    got = (q.perplexity, q.reference_perplexity, q.kl_mean, q.kl_max, q.top1_agreement)
    assert got == _whole(ref, npu, tokens, first)
    assert compare(ref, npu, tokens, first=first, **CONFIG) == q


def test_streamed_degenerate_check_names_what_the_whole_check_names() -> None:
    from models.quality import QualityStream
    npu = np.ones((6, 5), np.float32)
    npu[4] = np.arange(5)
    tokens = [0, 1, 2, 3, 4, 0]
    stream = QualityStream(tokens, first=1)
    stream.add(npu[:3], npu[:3], 0)
    stream.add(npu[3:], npu[3:], 3)
    assert stream.degenerate() == degenerate_logits(npu[1:])
    with pytest.raises(ValueError, match="does not continue"):
        QualityStream(tokens).add(npu[2:], npu[2:], 2)
