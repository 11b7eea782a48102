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
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import round_shift
from .softmax import softmax_q

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
