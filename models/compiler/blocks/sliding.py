"""Grouped-query attention with sliding-window layers (Cohere2, EXAONE-4.0 hybrid,
Mistral-style): GQA (:mod:`.gqa`) whose sliding layers keep only their window in the KV
cache and whose full layers may lack RoPE.

A sliding layer's query at position ``p`` attends to ``p - W + 1 .. p`` (``W`` =
``sliding_window``). Its K and V caches are ring regions (:mod:`isa.kv.region`) of
``R = min(cap, W + m_tile - 1)`` slots: a token tile's ``n <= m_tile`` queries need the
``W + n - 1`` positions ending at its last token, and the tile's own keys are appended
before its attention reads them. The ring formats (the model's K and V formats with
``ring = R``, ``slide = W``) are entries 2 and 3 of the programs' format table. Attention
reads the last ``min(T, W + n - 1)`` positions of a cache of ``T`` tokens, so a decode step
of a sliding layer moves ``W`` tokens of K and V and computes over them, whatever the
context; full layers read the whole cache, as in GQA.
"""

from __future__ import annotations

from isa.errors import FormatError
from isa.kvformats import KVFormat, KVPair

from ...config import ModelConfig
from ..kvspec import KvCacheSpec
from ..lowering import Lowering, kv_region
from ..memmap import MemoryMap
from .gqa import GqaAttention

#: Indices of a sliding layer's K and V formats in a program's format table.
RING_K, RING_V = 2, 3


class SlidingGqaAttention(GqaAttention):
    """:class:`~.base.AttentionBlock` of a GQA model with sliding-window or NoPE layers."""

    kind = "sliding-gqa"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.window = cfg.sliding_window

    def kv_problem(self, kv: str) -> str | None:
        from isa import kvformats

        if self.window is None:
            return None
        try:
            for f in kvformats.pair(kv):
                f.sliding(ring=self.window, slide=self.window)
        except FormatError as err:
            return f"sliding-window layers keep a ring of their last tokens: {err}"
        return None

    def ring_slots(self, cap: int, m_tile: int) -> int:
        """Slots of a sliding layer's ring: its window plus a tile's other tokens."""
        assert self.window is not None
        return min(cap, self.window + m_tile - 1)

    def ring_pair(self, pair: KVPair, cap: int, m_tile: int) -> KVPair:
        assert self.window is not None
        r = self.ring_slots(cap, m_tile)
        w = min(self.window, r)  # a cache shorter than the window never drops a token
        return KVPair(pair.k.sliding(ring=r, slide=w), pair.v.sliding(ring=r, slide=w))

    @staticmethod
    def m_tile_of(mm: MemoryMap, cfg: ModelConfig) -> int:
        """The token tile a memory map was built for (``act.x0`` holds one tile's rows)."""
        return mm["act.x0"].size // cfg.hidden_size

    def _pair_of(self, layer: int, pair: KVPair, cap: int, m_tile: int) -> KVPair:
        if self.cfg.layer_window(layer) is None:
            return pair
        return self.ring_pair(pair, cap, m_tile)

    def add_regions(self, mm: MemoryMap, *, pair: KVPair, cap: int, slots: int,
                    m_tile: int) -> None:
        cfg, hd = self.cfg, self.cfg.head_dim
        for s in range(slots):
            for layer in range(cfg.num_layers):
                lp = self._pair_of(layer, pair, cap, m_tile)
                for comp, fmt in (("k", lp.k), ("v", lp.v)):
                    mm.add(kv_region(s, layer, comp), cfg.num_kv_heads * fmt.max_bytes(cap, hd),
                           "kv_cache")

    def kv_specs(self, mm: MemoryMap, *, pair: KVPair, cap: int,
                 slots: int) -> list[KvCacheSpec]:
        cfg, hd = self.cfg, self.cfg.head_dim
        m_tile = self.m_tile_of(mm, cfg)
        out = []
        for s in range(slots):
            for layer in range(cfg.num_layers):
                lp = self._pair_of(layer, pair, cap, m_tile)
                for comp, fmt in (("k", lp.k), ("v", lp.v)):
                    name = kv_region(s, layer, comp)
                    out.append(KvCacheSpec(name, s, layer, comp, mm[name], fmt, hd,
                                           cfg.num_kv_heads, fmt.max_bytes(cap, hd),
                                           window=cfg.layer_window(layer)))
        return out

    # --- the GQA hooks ------------------------------------------------------------------
    def layer_formats(self, lw: Lowering, layer: int) -> tuple[KVFormat, KVFormat, int, int]:
        if self.cfg.layer_window(layer) is None:
            return lw.k_fmt, lw.v_fmt, 0, 1
        rp = self.ring_pair(KVPair(lw.k_fmt, lw.v_fmt), lw.cap, lw.m_tile)
        return rp.k, rp.v, RING_K, RING_V

    def key_span(self, lw: Lowering, layer: int, pos0: int, n: int) -> tuple[int, int]:
        window = self.cfg.layer_window(layer)
        if window is None:
            return 0, pos0 + n
        first = max(0, pos0 - window + 1)  # the first query's window start
        return first, pos0 + n - first

    def rotates(self, layer: int) -> bool:
        return self.cfg.layer_has_rope(layer)

    def extra_formats(self, lw: Lowering) -> tuple[KVFormat, ...]:
        if self.window is None:
            return ()
        return tuple(self.ring_pair(KVPair(lw.k_fmt, lw.v_fmt), lw.cap, lw.m_tile))
