"""The float reference (:mod:`models.reference`) past :data:`WHOLE_ROWS` rows: its attention
and LM head in blocks of rows, so a long text's ``H x n x T`` scores and ``n x vocab``
logits are never held at once.

Up to :data:`WHOLE_ROWS` rows both run as one product over every row, as the reference
always did, so every figure measured on texts of up to 2,048 tokens keeps its bits. Past
it the blocked products compute the same sums in the same float dtype (float64: the
reference's :data:`models.reference.FLOAT`), each over the keys its rows can see; a
blocked product's BLAS kernel may tile its rows differently from the whole product, so
the blocked results can differ in the last bits (~1e-16 relative in float64; a test holds
them within 1e-12 of the whole product).
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig

#: Up to this many rows, attention and the LM head run as one product over every row.
WHOLE_ROWS = 2048
#: Queries per block of :func:`attend_blocked` (the scores of one head and one block:
#: ``ATTN_QUERY_ROWS x T`` float64, 16 MB at 8,192 tokens, where the whole ``H x n x T``
#: product would take 4.8 GB for 9 heads).
ATTN_QUERY_ROWS = 256
#: Rows per block of :func:`head_logits` past :data:`WHOLE_ROWS` (``rows x vocab``
#: float64 at a time: 100 MB for a 49,152-token vocabulary).
HEAD_ROWS = 256


def row_blocks(n: int, rows: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` blocks of at most ``rows`` rows covering ``0 .. n-1`` (one block up to
    :data:`WHOLE_ROWS` rows, :func:`blocks_of` past it)."""
    return [(0, n)] if n <= WHOLE_ROWS else blocks_of(n, rows)


def blocks_of(n: int, rows: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` blocks of at most ``rows`` rows covering ``0 .. n-1``, none of one row
    unless ``n`` is 1 (numpy's matmul takes its matrix-vector path for one row)."""
    edges = list(range(0, n, rows)) + [n]
    if len(edges) > 2 and edges[-1] - edges[-2] == 1:
        edges[-2] -= 1
    return list(zip(edges[:-1], edges[1:], strict=True))


def tail_rows(h: np.ndarray, rows: int) -> np.ndarray:
    """The rows of ``h`` whose logits give its last ``rows``: all of them up to
    :data:`WHOLE_ROWS` (one product, the bits of the whole call's), else the last
    ``max(rows, 2)`` (two at least, see :func:`blocks_of`)."""
    return h if h.shape[0] <= WHOLE_ROWS else h[-max(rows, 2):]


def head_logits(config: ModelConfig, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The LM head ``w`` (``(vocab, hidden)``) over final-normed hidden states ``h``
    (``(n, hidden)``, the reference's float dtype): ``(n, vocab)`` logits in ``h``'s
    dtype (the model's logit scale applied), the reference's own expression; past
    :data:`WHOLE_ROWS` rows, :data:`HEAD_ROWS` rows at a time."""
    f = h.dtype.type
    blocks = row_blocks(h.shape[0], HEAD_ROWS)
    out = None if len(blocks) == 1 else np.empty((h.shape[0], w.shape[0]), h.dtype)
    for lo, hi in blocks:
        # copy=False: the product is already in h's dtype when w's is no wider (a copy of
        # 2,048 x 49,152 float64 logits is 0.8 GB); the same values either way
        logits = (h[lo:hi] @ w.T).astype(h.dtype, copy=False)
        if config.logit_scale != 1.0:
            logits = (logits * f(config.logit_scale)).astype(h.dtype)
        if out is None:
            return logits
        out[lo:hi] = logits
    return out


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
           window: int | None = None) -> np.ndarray:
    """The reference's causal attention: ``q`` ``(n, H, dq)``, ``k`` ``(T, H, dq)``, ``v``
    ``(T, H, dv)`` (query ``i`` at position ``T - n + i``, seeing only the last ``window``
    positions up to its own if given) -> ``(n, H * dv)`` in ``q``'s dtype. Up to
    :data:`WHOLE_ROWS` queries one ``(H, n, T)`` product (:func:`attend_whole`), past it
    :func:`attend_blocked`."""
    if q.shape[0] > WHOLE_ROWS:
        return attend_blocked(q, k, v, scale, window)
    return attend_whole(q, k, v, scale, window)


def attend_whole(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                 window: int | None = None) -> np.ndarray:
    """:func:`attend` as one ``(H, n, T)`` product over every head and query."""
    n, t = q.shape[0], k.shape[0]
    scores = np.matmul(q.transpose(1, 0, 2), k.transpose(1, 2, 0))  # (H, n, T)
    scores *= q.dtype.type(scale)
    qpos = (t - n + np.arange(n))[:, None]
    future = np.arange(t)[None, :] > qpos
    if window is not None:
        future |= np.arange(t)[None, :] <= qpos - window
    scores[:, future] = -np.inf
    # models.reference.softmax in place: the same operations on the same values, one
    # H x n x T array instead of five (1.2 GB less at 2,048 tokens of 9 heads in float64)
    scores -= np.max(scores, axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= np.sum(scores, axis=-1, keepdims=True)
    out = np.matmul(scores, v.transpose(1, 0, 2))  # (H, n, dv)
    return out.transpose(1, 0, 2).reshape(n, -1).astype(q.dtype)


def attend_blocked(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                   window: int | None = None) -> np.ndarray:
    """:func:`attend` one head and :data:`ATTN_QUERY_ROWS` queries at a time, each block's
    scores over the keys up to its last query's position."""
    n, t = q.shape[0], k.shape[0]
    heads, dv = q.shape[1], v.shape[2]
    f = q.dtype.type
    out = np.empty((n, heads, dv), q.dtype)
    qpos_all = t - n + np.arange(n)
    for lo, hi in blocks_of(n, ATTN_QUERY_ROWS):
        qpos = qpos_all[lo:hi, None]
        seen = int(qpos_all[hi - 1]) + 1  # columns past this are masked in every row
        masked = np.arange(seen)[None, :] > qpos
        if window is not None:
            masked |= np.arange(seen)[None, :] <= qpos - window
        for h in range(heads):
            scores = np.matmul(q[lo:hi, h, :], k[:seen, h, :].T)
            scores *= f(scale)
            scores[masked] = -np.inf
            scores -= np.max(scores, axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= np.sum(scores, axis=-1, keepdims=True)
            out[lo:hi, h, :] = np.matmul(scores, v[:seen, h, :])
    return out.reshape(n, -1)


__all__ = ["ATTN_QUERY_ROWS", "HEAD_ROWS", "WHOLE_ROWS", "attend", "attend_blocked",
           "attend_whole", "blocks_of", "head_logits", "row_blocks", "tail_rows"]
