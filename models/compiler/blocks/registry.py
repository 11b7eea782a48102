"""Which blocks a model is built from, chosen from its features: the attention kind (one
per model) and the MLP kind of each layer.

A new block is one file in this folder plus one line in :data:`ATTENTION` or :data:`MLP`
(and, for a new feature, one line in :func:`features`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvsim.errors import ConfigError

from ...config import ModelConfig
from .base import AttentionBlock, MlpBlock
from .dense import DenseMlp
from .gqa import GqaAttention
from .mla import MlaAttention
from .moe import MoeMlp
from .parallel import ParallelDenseMlp
from .postnorm import PostNormAttention
from .postnorm_mlp import PostNormDenseMlp
from .sandwich import SandwichAttention
from .sandwich_mlp import SandwichDenseMlp
from .sliding import SlidingGqaAttention

#: attention kind -> block class
ATTENTION: dict[str, Callable[[ModelConfig], AttentionBlock]] = {
    "gqa": GqaAttention,
    "mla": MlaAttention,
    "sliding-gqa": SlidingGqaAttention,
    "postnorm-gqa": PostNormAttention,
    "sandwich-gqa": SandwichAttention,
}
#: MLP kind -> block class
MLP: dict[str, Callable[[ModelConfig], MlpBlock]] = {
    "dense": DenseMlp,
    "moe": MoeMlp,
    "parallel-dense": ParallelDenseMlp,
    "postnorm-dense": PostNormDenseMlp,
    "sandwich-dense": SandwichDenseMlp,
}


@dataclass(frozen=True)
class Features:
    """What the registry chooses blocks by."""

    attention: str
    mlp: tuple[str, ...]  # per layer


def _attention_kind(cfg: ModelConfig) -> str:
    if cfg.is_mla:
        return "mla"
    if cfg.norm_position == "sandwich":
        return "sandwich-gqa"
    if cfg.norm_position == "post" or cfg.qk_norm:
        return "postnorm-gqa"
    layers = range(cfg.num_layers)
    if any(cfg.layer_window(i) is not None or not cfg.layer_has_rope(i) for i in layers):
        return "sliding-gqa"
    return "gqa"


def features(cfg: ModelConfig) -> Features:
    dense = {"pre": "parallel-dense" if cfg.parallel_block else "dense",
             "post": "postnorm-dense", "sandwich": "sandwich-dense"}[cfg.norm_position]
    return Features(_attention_kind(cfg),
                    tuple("moe" if cfg.layer_is_moe(i) else dense
                          for i in range(cfg.num_layers)))


def _pick(table: dict, kind: str, what: str, cfg: ModelConfig):
    try:
        return table[kind](cfg)
    except KeyError:
        raise ConfigError(f"model {cfg.name!r}: no {what} block {kind!r}; the {what} blocks "
                          f"are {', '.join(sorted(table))}") from None


@dataclass(frozen=True)
class ModelBlocks:
    """The blocks of one model: its attention, and the MLP of each layer."""

    features: Features
    attention: AttentionBlock
    mlps: dict[str, MlpBlock]  # kind -> block

    def mlp(self, layer: int) -> MlpBlock:
        return self.mlps[self.features.mlp[layer]]


def blocks_for(cfg: ModelConfig) -> ModelBlocks:
    """The blocks ``cfg`` is built from; a :class:`ConfigError` listing the blocks that
    exist when a feature has none."""
    f = features(cfg)
    mlps = {kind: _pick(MLP, kind, "MLP", cfg) for kind in dict.fromkeys(f.mlp)}
    return ModelBlocks(f, _pick(ATTENTION, f.attention, "attention", cfg), mlps)


def probe_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """One layer of each kind (first of each MLP kind): every layer of a kind needs the
    same SRAM (the work split rotates over the cores with the layer, the routing changes
    no buffer size), so lowering these few layers tells whether a token tile fits."""
    first: dict[str, int] = {}
    for layer, kind in enumerate(features(cfg).mlp):
        first.setdefault(kind, layer)
    return tuple(sorted(first.values()))
