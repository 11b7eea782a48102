"""The mixture-of-experts router on the vector unit: top-k expert choice and gate weights.

``topk_gate_rows(x, mult, shift, k, flags, out)`` takes int8 router logits ``x[r, e]`` (one
row per token, one column per routed expert) and writes each row's routing-table entry:
``k`` pairs ``(expert id, gate weight)`` as int32, best expert first.

- Choice: the ``k`` largest logits, ties to the lower expert id (a stable sort of the
  negated logits, as the float reference's ``argsort(kind="stable")``). Softmax is
  monotone, so the top-k of the logits is the top-k of the probabilities.
- Weights in Q24 (:data:`.softmax.P`), from the logits in Q20
  ``l = round_half_up((x - rowmax) * mult / 2**shift)`` and :func:`.softmax.softmax_q`:
  with ``flags & RENORM`` the softmax over the ``k`` chosen logits (Mixtral's
  ``MixtralSparseMoeBlock``; Qwen2-MoE's ``norm_topk_prob``), else the chosen entries of
  the softmax over all ``e`` logits (DeepSeek-V2's ``MoEGate`` and Qwen2-MoE without
  ``norm_topk_prob``).

A routing table row of ``k`` entries takes ``8 * k`` bytes; it is what later
instructions read the chosen experts' weight addresses and gate weights from.

``gate_acc_rows(y, gates, shift, accumulate, out)`` scales an expert's int32 output rows by
their tokens' gate weights: ``out[r, :] = sat32((out[r, :] if accumulate else 0) +
rs(y[r, :] * gates[r], shift))`` (``|y * g| < 2**31 * 2**31``: int64 holds it).
``sigmoid_rows(x, mult, shift, out)``: int8 ``x`` -> Q24 ``sigmoid(rs(x * mult, shift) /
2**20)`` (Qwen2-MoE's shared-expert gate; :func:`.softmax.isigmoid` in Q20, times 16).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import round_shift, sat32
from .softmax import F, P, isigmoid, softmax_q

#: ``flags`` bit: renormalise the chosen weights (softmax over the top-k logits).
RENORM = 1
#: The largest ``k`` (:data:`isa.vecfuncs.MAX_TOPK`, 16) is an assumption of the model: the
#: published routers use 2 (Mixtral), 4 (Qwen1.5-MoE-A2.7B), 6 (DeepSeek-V2-Lite), 8
#: (Qwen2-57B-A14B, DeepSeek-V3).


@njit(cache=True)
def topk_gate_rows(x, mult, shift, k, flags, out):
    """int8 ``x[r, e]`` -> int32 ``out[r, 2*k]`` (id, weight pairs); see the module doc.
    Needs ``1 <= k <= e``."""
    r, e = x.shape
    logits = np.empty(e, np.int64)
    probs = np.empty(e, np.int64)
    chosen = np.empty(k, np.int64)
    sub = np.empty(k, np.int64)
    subp = np.empty(k, np.int64)
    taken = np.zeros(e, np.bool_)
    for i in range(r):
        m = np.int64(x[i, 0])
        for t in range(1, e):
            if x[i, t] > m:
                m = np.int64(x[i, t])
        for t in range(e):
            logits[t] = round_shift((np.int64(x[i, t]) - m) * np.int64(mult), shift)
            taken[t] = False
        for j in range(k):  # selection: the best not yet taken, the lower id on a tie
            best = -1
            for t in range(e):
                if not taken[t] and (best < 0 or x[i, t] > x[i, best]):
                    best = t
            taken[best] = True
            chosen[j] = best
        if flags & RENORM:
            for j in range(k):
                sub[j] = logits[chosen[j]]
            softmax_q(sub, subp)
            for j in range(k):
                out[i, 2 * j] = chosen[j]
                out[i, 2 * j + 1] = subp[j]
        else:
            softmax_q(logits, probs)
            for j in range(k):
                out[i, 2 * j] = chosen[j]
                out[i, 2 * j + 1] = probs[chosen[j]]


@njit(cache=True)
def gate_acc_rows(y, gates, shift, accumulate, out):
    """int32 ``y[r, c]`` times the Q24 (or any ``shift``) ``gates[r]`` into int32 ``out``;
    see the module doc."""
    r, c = y.shape
    for i in range(r):
        g = np.int64(gates[i])
        for j in range(c):
            v = round_shift(np.int64(y[i, j]) * g, shift)
            if accumulate:
                v += np.int64(out[i, j])
            out[i, j] = sat32(v)


@njit(cache=True)
def sigmoid_rows(x, mult, shift, out):
    """int8 ``x[r, c]`` -> int32 ``out[r, c]``: Q24 sigmoid of the Q20 logits
    ``rs(x * mult, shift)``."""
    r, c = x.shape
    for i in range(r):
        for j in range(c):
            z = round_shift(np.int64(x[i, j]) * np.int64(mult), shift)
            out[i, j] = isigmoid(z) << (P - F)
