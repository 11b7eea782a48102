"""The decode of a generate run with ``[speculate]``: the prompt's prefill and speculative
rounds (:func:`sim.runtime.speculative.speculative_decode`) instead of one call per token, every
call labelled by its phase (``prefill``, ``draft``, ``verify``, ``tail_cut``) for the run's
``calls`` and ``time_breakdown``; the ``speculation`` entry of ``metrics.json`` (a
:class:`traces.speculation_results.SpeculationFigures`).

A functional run accepts drafts by its own logits (greedy: the text is plain decoding's);
a timing-only run draws how many tokens each round drafts and accepts from the section's
acceptance profile (seeded), and runs the same calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.app.breakdown import Labelled
from sim.app.config import RunConfig
from sim.runtime import CallRecord, Model
from sim.runtime.speculative.decode import speculative_decode
from sim.runtime.speculative.setup import make_drafter
from traces.speculation_results import SpeculationFigures


@dataclass
class SpecDecode:
    """What the run's metrics need of a speculative decode."""

    prefill_calls: list[CallRecord]
    decode_calls: list[CallRecord]  # every call after the prefill: drafts, verifications, cuts
    labelled: list[Labelled]
    tokens: list[int]
    cache: int  # tokens in the cache at the end
    figures: SpeculationFigures


def decode_speculatively(cfg: RunConfig, model: Model, prompt: np.ndarray,
                         embeddings: Callable[[np.ndarray], np.ndarray], guard,
                         cache: int) -> SpecDecode:
    """Prefill ``prompt`` after ``cache`` tokens of context and decode
    ``workload.output_tokens`` tokens speculatively."""
    s = cfg.speculate
    assert s is not None
    spec = s.spec()
    acc = model.acc
    functional = acc.functional

    def embed(tokens) -> np.ndarray:
        return embeddings(np.asarray(list(tokens), np.int64))

    drafter, info = make_drafter(spec, model, embed, seed=s.seed, where="speculate.drafter")
    profile = None if functional else s.profile()
    before = acc.num_calls
    res = speculative_decode(model, [int(t) for t in prompt], drafter=drafter, k=spec.k,
                             max_new_tokens=cfg.workload.output_tokens, embed=embed,
                             seed=s.seed, cut=spec.cut, profile=profile,
                             check_logits=guard.logits, start_cache=cache)
    calls = acc.calls_since(before)
    labelled = [Labelled(c, phase, step, tokens, cached)
                for c, (phase, step, tokens, cached) in zip(calls, res.labels, strict=True)]
    prefill = [lab.call for lab in labelled if lab.phase == "prefill"]
    decode = [lab.call for lab in labelled if lab.phase != "prefill"]
    end = res.rounds[-1].cache_size + res.rounds[-1].accepted + 1 if res.rounds else \
        cache + len(prompt)
    figures = res.figures(info, "measured: the run's own logits" if functional else
                          f"drawn from the profile {json.dumps(profile.to_json())} "
                          f"(seed {s.seed})")
    return SpecDecode(prefill, decode, labelled, res.tokens, end, figures)


__all__ = ["SpecDecode", "decode_speculatively"]
