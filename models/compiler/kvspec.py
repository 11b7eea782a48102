"""What the device holds of one KV cache: one frozen record per (slot, layer, component).

Every module that reads or edits caches (the runtime's dump/load, on-device cache
operations, serving's block geometry, run metrics) reads these records.
"""

from __future__ import annotations

from dataclasses import dataclass

from isa.instructions import Region
from isa.kvformats import KVFormat


@dataclass(frozen=True)
class KvCacheSpec:
    """One cache region: ``heads`` sub-caches (one per KV head) of ``head_bytes`` each,
    each a ``width``-value-per-token cache of ``format`` (``isa.kvformats``) in its region
    layout. ``window``: the tokens a sliding-window layer attends to (None: all)."""

    name: str
    slot: int
    layer: int
    component: str  # "k" | "v" (GQA) | "c" (MLA [latent | rope key] records)
    region: Region
    format: KVFormat
    width: int  # values per token of one head
    heads: int
    head_bytes: int
    window: int | None = None

    def head_base(self, head: int) -> int:
        """DRAM address of KV head ``head``'s sub-cache."""
        if not 0 <= head < self.heads:
            raise IndexError(f"{self.name}: head {head} is not in 0..{self.heads - 1}")
        return self.region.base + head * self.head_bytes
