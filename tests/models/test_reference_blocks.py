"""The float reference past 2,048 rows (models.reference_blocks): its blocked attention and
LM head compute what the whole products compute, within 1e-12 relative in float64, and up
to 2,048 rows the whole products are the reference's softmax formula bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from models import reference_blocks as rb
from models.reference import FLOAT, ReferenceModel, softmax
from models.source import load_preset

#: What the blocked float64 products may differ by, relative to the largest value.
REL = 1e-12


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == FLOAT
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= REL * np.max(np.abs(want))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks from 16 rows on, of 7 query rows and 9 head rows (odd, so blocks end
    mid-text and mid-call)."""
    monkeypatch.setattr(rb, "WHOLE_ROWS", 16)
    monkeypatch.setattr(rb, "ATTN_QUERY_ROWS", 7)
    monkeypatch.setattr(rb, "HEAD_ROWS", 9)


def _runs(name: str, ids: list[int], split: int) -> tuple[np.ndarray, np.ndarray]:
    """The logits of ``ids`` as one prefill and as two calls (the second after a cache of
    ``split`` tokens)."""
    ref = ReferenceModel(load_preset(name), seed=1)
    whole = ref.prefill(ids)
    ref.reset()
    parts = np.concatenate([ref.forward(ids[:split]), ref.forward(ids[split:])])
    return whole, parts


@pytest.mark.parametrize("name", ["tiny", "tiny-cohere2", "tiny-mla"])
def test_blocked_reference_is_the_whole_reference_within_1e_12(name, monkeypatch) -> None:
    # tiny: GQA; tiny-cohere2: sliding-window layers (the window's mask in blocks);
    # tiny-mla: MLA's absorbed attention
    ids = np.random.default_rng(7).integers(0, 256, 61).tolist()
    want, want_parts = _runs(name, ids, 23)
    monkeypatch.setattr(rb, "WHOLE_ROWS", 16)
    monkeypatch.setattr(rb, "ATTN_QUERY_ROWS", 7)
    monkeypatch.setattr(rb, "HEAD_ROWS", 9)
    got, got_parts = _runs(name, ids, 23)
    _close(got, want)
    _close(got_parts, want_parts)
    _close(got_parts, got)


def test_last_rows_and_final_hidden_read_the_same_logits(small_blocks) -> None:
    ids = np.random.default_rng(8).integers(0, 256, 40).tolist()
    ref = ReferenceModel(load_preset("tiny"), seed=1)
    whole = ref.prefill(ids)
    ref.reset()
    last = ref.forward_embeddings(ref.embed(ids), last_rows=3)
    ref.reset()
    one = ref.forward_embeddings(ref.embed(ids), last_only=True)
    ref.reset()
    hidden = ref.final_hidden(ref.embed(ids))
    assert hidden.dtype == FLOAT
    _close(last, whole[-3:])
    _close(one, whole[-1:])
    assert np.array_equal(ref.head_logits(hidden), whole)  # the same blocks: the same bits


def test_whole_attention_is_the_softmax_formula_bit_for_bit() -> None:
    # up to WHOLE_ROWS rows the reference computes as it always did (its softmax in place:
    # the same operations on the same values)
    rng = np.random.default_rng(9)
    n, t, heads = 12, 30, 3
    q, k = rng.normal(size=(n, heads, 8)), rng.normal(size=(t, heads, 8))
    v = rng.normal(size=(t, heads, 5))
    for window in (None, 6):
        scores = np.matmul(q.transpose(1, 0, 2), k.transpose(1, 2, 0)) * FLOAT(0.35)
        qpos = (t - n + np.arange(n))[:, None]
        future = np.arange(t)[None, :] > qpos
        if window is not None:
            future |= np.arange(t)[None, :] <= qpos - window
        probs = softmax(np.where(future[None], FLOAT(-np.inf), scores), axis=-1)
        want = np.matmul(probs, v.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, -1)
        assert np.array_equal(rb.attend_whole(q, k, v, 0.35, window), want)
        _close(rb.attend_blocked(q, k, v, 0.35, window), want)


def test_row_blocks_cover_the_rows_without_single_row_blocks(small_blocks) -> None:
    assert rb.row_blocks(16, 9) == [(0, 16)]
    for n in (17, 18, 19, 27, 28, 100):
        blocks = rb.row_blocks(n, 9)
        assert blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
        assert all(1 < hi - lo <= 9 for lo, hi in blocks)
