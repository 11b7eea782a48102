"""What a verification call accepts: the longest prefix of the drafts that decoding would
have produced itself, and the token after it (so every call yields at least one token).

- **Greedy**: draft ``i`` is accepted while it is the argmax of the verifier's logits
  after the tokens before it; the next token is the argmax after the accepted prefix.
  Each row of a verification call equals bit for bit the logits of the one-token call at
  that position (``tests/sim/test_all_logits.py``), so the output is exactly greedy
  decoding's, by construction.
- **Sampling** at temperature ``T``: the rejection rule of Leviathan, Kalman and Matias,
  "Fast Inference from Transformers via Speculative Decoding" (ICML 2023) and Chen et
  al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023):
  draft ``x`` drawn from ``q`` is accepted with probability ``min(1, p(x) / q(x))``
  (``p``: the verifier's softmax at ``T``); on the first rejection the next token is
  drawn from ``max(0, p - q)`` renormalised; if every draft is accepted, from ``p`` after
  the last one. The tokens are then distributed as sampling from ``p`` alone. A drafter
  that proposes tokens without a distribution (prompt lookup) is a point mass: ``q(x) = 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(logits / temperature)`` in float64 (rows or one vector)."""
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def accept_greedy(rows: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """``(accepted, next token)`` for verifier logits ``rows`` (``len(drafts) + 1`` rows:
    row ``i`` follows the last accepted token and the first ``i`` drafts)."""
    for i, t in enumerate(drafts):
        best = int(np.argmax(rows[i]))
        if best != int(t):
            return i, best
    return len(drafts), int(np.argmax(rows[len(drafts)]))


def accept_sampled(rows: np.ndarray, drafts: Sequence[int], q: np.ndarray | None,
                   temperature: float, rng: np.random.Generator) -> tuple[int, int]:
    """``(accepted, next token)`` by the rejection rule (module docstring); ``q``: the
    drafter's distributions, one row per draft, or None for point masses."""
    if temperature <= 0:
        return accept_greedy(rows, drafts)
    p = softmax(rows, temperature)
    for i, t in enumerate(drafts):
        t = int(t)
        qi = None if q is None else np.asarray(q[i], np.float64)
        q_t = 1.0 if qi is None else float(qi[t])
        if q_t > 0 and rng.random() < min(1.0, p[i, t] / q_t):
            continue
        if qi is None:
            resid = p[i].copy()
            resid[t] = 0.0
        else:
            resid = np.maximum(p[i] - qi, 0.0)
        total = resid.sum()
        if total <= 0:  # p == q: a rejection has probability 0; keep the draft's law
            resid, total = p[i], 1.0
        return i, int(rng.choice(resid.size, p=resid / total))
    d = len(drafts)
    return d, int(rng.choice(p.shape[1], p=p[d]))


__all__ = ["accept_greedy", "accept_sampled", "softmax"]
