"""A model with some of its layers skipped: the draft model of self-speculative decoding.

The draft runs the layers ``keep`` (in order) of a model and nothing else: the same
embedding, the same LM head, the same weights of every layer it keeps (Zhang et al.,
"Draft & Verify: Lossless Large Language Model Acceleration via Self-Speculative
Decoding", ACL 2024: the draft is the model itself with intermediate layers skipped, so no
second checkpoint exists). Its config is the model's with ``num_layers = len(keep)``;
its weights (:class:`LayerSubsetWeights`) read layer ``j`` from the model's layer
``keep[j]``. The weight spec a compiled draft records, ``{"kind": "layers", "base":
<the model's spec>, "of_layers": L, "layers": keep}``, opens them again
(:func:`models.source.open_weights`).

Only models whose layers are all alike can skip layers this way: a dense MLP and one
attention kind in every layer (no mixture-of-experts layers, no sliding-window pattern),
so that the subset is itself a model of the same architecture.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.errors import ConfigError

if TYPE_CHECKING:  # (no import at run time: models.source, in a cycle with config, uses this)
    from .config import ModelConfig


def uniform_layers_problem(cfg: ModelConfig) -> str | None:
    """Why ``cfg``'s layers cannot be skipped (they differ from each other), or None."""
    if cfg.is_moe:
        return "its layers are mixture-of-experts layers (their experts and dense layers differ)"
    if cfg.is_mla:
        return "it uses multi-head latent attention (layer skipping is built for GQA models)"
    if cfg.layer_types is not None and len(set(cfg.layer_types)) > 1:
        return "its layers mix sliding-window and full attention"
    return None


def check_keep(cfg: ModelConfig, keep: Sequence[int], *, where: str) -> tuple[int, ...]:
    """``keep`` as a sorted tuple of distinct layer indices of ``cfg``, at least one and
    fewer than all of them, or a :class:`ConfigError` naming ``where``."""
    out = tuple(sorted({int(i) for i in keep}))
    L = cfg.num_layers
    if len(out) != len(keep):
        raise ConfigError(f"{where}: lists a layer twice")
    if not out or out[0] < 0 or out[-1] >= L:
        raise ConfigError(f"{where}: layers must lie in 0..{L - 1}, got {list(keep)}")
    if len(out) >= L:
        raise ConfigError(f"{where}: keeps all {L} layers; a draft must skip at least one")
    if (why := uniform_layers_problem(cfg)) is not None:
        raise ConfigError(f"{where}: model {cfg.name or cfg.family!r} cannot skip layers: {why}")
    return out


def subset_config(cfg: ModelConfig, keep: Sequence[int]) -> ModelConfig:
    """The config of the model that runs only the layers ``keep`` (checked)."""
    keep = check_keep(cfg, keep, where="layers")
    name = f"{cfg.name or cfg.family} layers {layer_ranges(keep)}"
    return cfg.model_copy(update={"num_layers": len(keep), "name": name})


def subset_spec(spec: dict[str, Any], of_layers: int, keep: Sequence[int]) -> dict[str, Any]:
    """The weight spec of the layer subset ``keep`` of a model of ``of_layers`` layers whose
    weights ``spec`` describes."""
    return {"kind": "layers", "base": spec, "of_layers": int(of_layers),
            "layers": [int(i) for i in keep]}


def base_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec of the full model's weights behind a layer-subset spec (else ``spec``)."""
    while spec.get("kind") == "layers":
        spec = spec["base"]
    return spec


def layer_ranges(keep: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    parts: list[str] = []
    start = prev = None
    for i in list(keep) + [None]:
        if i is not None and prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    return ",".join(parts)


class LayerSubsetWeights:
    """The weights of a layer subset: layer ``j`` of ``config`` is layer ``keep[j]`` of
    ``base``; every other tensor (embedding, final norm, LM head) is ``base``'s."""

    def __init__(self, config: ModelConfig, base, keep: Sequence[int]):
        if len(keep) != config.num_layers:
            raise ConfigError(f"weights: a subset of {len(keep)} layers for a model of "
                              f"{config.num_layers}")
        self.config = config
        self.base = base
        self.keep = tuple(int(i) for i in keep)

    def name_in_base(self, name: str) -> str:
        """The base model's name of tensor ``name``."""
        if name.startswith("layers."):
            _, j, rest = name.split(".", 2)
            return f"layers.{self.keep[int(j)]}.{rest}"
        return name

    def tensor(self, name: str) -> np.ndarray:
        return self.base.tensor(self.name_in_base(name))


__all__ = ["LayerSubsetWeights", "base_spec", "check_keep", "layer_ranges", "subset_config",
           "subset_spec", "uniform_layers_problem"]
