"""The protocols of the compiler's blocks.

A model is its input, a sequence of layers (each an attention block then an MLP block,
both residual) and its head. A block owns, for its layers: its DRAM regions beyond the
weight and parameter regions of its tensors (which every tensor gets), its KV-cache specs
(attention), and its lowering of one token tile at given positions (``segs``: the pieces of
sequences in the tile, :class:`~models.compiler.lowering.TileSeq`). The residual stream
goes ``x`` -> attention -> ``act.xm`` -> MLP -> ``x_next``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from isa.kvformats import KVPair

    from ..builder import Builder
    from ..kvspec import KvCacheSpec
    from ..lowering import Lowering, TileSeq
    from ..memmap import MemoryMap


class AttentionBlock(Protocol):
    """Attention of every layer of a model (one kind per model)."""

    kind: str
    components: tuple[str, ...]  # the cache components of a layer ("k", "v"; "c")
    #: optional: true when its lowering reads the tile's positions only in its memo's
    #: varying instructions (keys by the tile's shape), so a whole call of one shape
    #: replays at other positions (:mod:`..calltrace`); absent: false
    positions_as_args: bool

    def kv_problem(self, kv: str) -> str | None:
        """Why KV layout ``kv`` cannot hold this attention's cache, or None."""
        ...

    @property
    def cache_width(self) -> int:
        """Values per token of one cache head (the widest component)."""
        ...

    def add_regions(self, mm: MemoryMap, *, pair: KVPair, cap: int, slots: int,
                    m_tile: int) -> None:
        """Add its parameter, KV-cache and activation regions to ``mm``."""
        ...

    def kv_specs(self, mm: MemoryMap, *, pair: KVPair, cap: int,
                 slots: int) -> list[KvCacheSpec]:
        ...

    def lower(self, b: Builder, lw: Lowering, layer: int, x: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        """Attention of layer ``layer`` over the tile at ``x`` and the residual add ->
        ``act.xm``."""
        ...


class MlpBlock(Protocol):
    """The MLP of the layers of one kind."""

    kind: str

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        ...

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        """The MLP of layer ``layer`` on ``act.xm`` and the residual add -> ``x_next``."""
        ...
