"""Speculative decoding on the simulated card: drafters that need no second checkpoint
(prompt lookup, self-speculation with layers skipped) and any other behind one interface,
verification of every draft in one ``infer`` that returns the logits of every position,
and the rejected tail cut with the runtime's ``filter_cache_tail``.

- :mod:`.spec`: the drafter spec strings (``prompt-lookup:k=4``, ``self:layers=N,k=K``);
- :mod:`.drafters`: :class:`Drafter` and the drafters;
- :mod:`.selfdraft`: the layer-skipping draft compiled as its own program, sharing the
  verifier's weights and caches in DRAM;
- :mod:`.verify`: greedy acceptance and the rejection rule of speculative sampling;
- :mod:`.decode`: the draft-verify-cut loop on the runtime;
- :mod:`.profile`: acceptance as a rate or measured counts, for timing-only runs and the
  serving simulator;
- :mod:`.setup`: a drafter from a spec for a launched model.
"""

from __future__ import annotations

import importlib
from typing import Any

from sim.runtime.speculative.profile import AcceptanceProfile
from sim.runtime.speculative.spec import MAX_K, DraftSpec, parse_speculate

#: Names loaded on first use (they import the runtime and the device; configs that only
#: parse a drafter spec do not need them).
_LAZY = {"Round": "decode", "SpecResult": "decode", "plain_decode": "decode",
         "speculative_decode": "decode", "CallableDrafter": "drafters", "Draft": "drafters",
         "Drafter": "drafters", "ModelDrafter": "drafters", "PromptLookup": "drafters",
         "lookup": "drafters"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"sim.runtime.speculative.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'sim.runtime.speculative' has no attribute {name!r}")


__all__ = ["MAX_K", "AcceptanceProfile", "CallableDrafter", "Draft", "DraftSpec", "Drafter",
           "ModelDrafter", "PromptLookup", "Round", "SpecResult", "lookup", "parse_speculate",
           "plain_decode", "speculative_decode"]
