"""A drafter from a :class:`~.spec.DraftSpec`, for a launched model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from models.skip import layer_ranges
from sim.runtime import Model

from .drafters import Drafter, DrafterInfo, ModelDrafter, PromptLookup
from .selfdraft import launch_self_draft
from .spec import DraftSpec


def make_drafter(spec: DraftSpec, model: Model, embed: Callable[[Sequence[int]], np.ndarray],
                 *, temperature: float = 0.0, seed: int = 0,
                 where: str = "drafter") -> tuple[Drafter, DrafterInfo]:
    """The drafter ``spec`` describes on the launched ``model`` and what to report about
    it: a self-draft is compiled and launched here (its layers, and the DRAM map's view
    of it: the weights it shares, its own bytes)."""
    if spec.method == "prompt-lookup":
        return PromptLookup(model.acc, ngram=spec.ngram), DrafterInfo(spec.text())
    keep = spec.keep(model.compiled.model.num_layers, where=where)
    draft = launch_self_draft(model, keep)
    drafter = ModelDrafter(draft, embed, shares_cache=True, temperature=temperature,
                           seed=seed, name=f"self (layers {layer_ranges(keep)})")
    return drafter, DrafterInfo(spec.text(), layers=tuple(keep),
                                launch_s=model.acc.calls[-1].time_s, dram=draft.map.as_metrics())


__all__ = ["make_drafter"]
