"""The DRAM memory map of a compiled model: weights, per-layer KV caches per cache slot,
activation buffers and host I/O buffers, each a named region with a traffic kind."""

from __future__ import annotations

from dataclasses import dataclass, field

from isa.instructions import Region, Space

#: Region alignment in DRAM (a page; keeps regions channel-interleave aligned).
REGION_ALIGN = 4096


def align(x: int, a: int) -> int:
    return -(-x // a) * a


def fmt_bytes(n: int | float) -> str:
    """``n`` bytes in the largest binary unit that keeps three significant figures."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n / size < 100 else f"{n / size:,.0f} {unit}"
    return f"{n:,.0f} B"


def dram_shortfall(total: int, weights: int, kv: int, dram_bytes: int,
                   hw_name: str) -> str | None:
    """Why ``total`` bytes (of which ``weights`` and ``kv``) do not fit ``dram_bytes``, or
    None when they do."""
    if total <= dram_bytes:
        return None
    return (f"needs {fmt_bytes(total)} of DRAM (weights {fmt_bytes(weights)}, KV cache "
            f"{fmt_bytes(kv)}); {hw_name} has {fmt_bytes(dram_bytes)}")


@dataclass
class MemoryMap:
    """A bump allocator over DRAM that names every region."""

    regions: list[Region] = field(default_factory=list)
    _by_name: dict[str, Region] = field(default_factory=dict)
    top: int = 0

    def add(self, name: str, size: int, kind: str, *, align_to: int = REGION_ALIGN) -> Region:
        if name in self._by_name:
            raise ValueError(f"region {name!r} defined twice")
        base = align(self.top, align_to)
        r = Region(name, Space.DRAM, base, max(1, size), kind)
        self.regions.append(r)
        self._by_name[name] = r
        self.top = base + r.size
        return r

    def __getitem__(self, name: str) -> Region:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def bytes_of_kind(self, kind: str) -> int:
        return sum(r.size for r in self.regions if r.kind == kind)

    @property
    def total_bytes(self) -> int:
        return align(self.top, REGION_ALIGN)

    def too_big(self, dram_bytes: int, hw_name: str) -> str | None:
        """Why this map does not fit ``dram_bytes`` of DRAM, or None when it does."""
        return dram_shortfall(self.total_bytes, self.bytes_of_kind("weights"),
                              self.bytes_of_kind("kv_cache"), dram_bytes, hw_name)

    def to_json(self) -> list[dict]:
        return [{"name": r.name, "base": r.base, "size": r.size, "kind": r.kind}
                for r in self.regions]

    @classmethod
    def from_json(cls, items: list[dict]) -> MemoryMap:
        mm = cls()
        for it in items:
            r = Region(it["name"], Space.DRAM, int(it["base"]), int(it["size"]), it["kind"])
            mm.regions.append(r)
            mm._by_name[r.name] = r
            mm.top = max(mm.top, r.end)
        return mm
