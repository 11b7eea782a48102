"""The event recorder: components report what happened; they never write files.

Detail levels: ``off`` records nothing, ``ops`` one span per instruction / runtime call,
``tiles`` also one span per DMA chunk, DRAM channel burst and link chunk. ``max_events``
bounds memory on long runs: past it, spans are counted in ``dropped`` and not stored.
Byte intervals (for bandwidth counters) are kept at ``ops`` and above, subject to the same
limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LEVELS = {"off": 0, "ops": 1, "tiles": 2}


@dataclass(frozen=True, slots=True)
class Span:
    block: str  # a hardware block: "core0", "dram", "pcie", "host", "runtime"
    lane: str  # an engine or channel inside it: "dma_in", "ch3", "h2d"
    name: str
    start_ps: int
    end_ps: int
    args: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ByteInterval:
    block: str
    lane: str
    start_ps: int
    end_ps: int
    nbytes: int


@dataclass
class Recorder:
    level: str = "ops"
    max_events: int = 2_000_000
    spans: list[Span] = field(default_factory=list)
    bytes: list[ByteInterval] = field(default_factory=list)
    dropped: int = 0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"trace level {self.level!r}: valid levels are {', '.join(LEVELS)}")
        self._rank = LEVELS[self.level]

    def wants(self, detail: str) -> bool:
        return self._rank >= LEVELS[detail]

    def _room(self) -> bool:
        if len(self.spans) + len(self.bytes) < self.max_events:
            return True
        self.dropped += 1
        return False

    def span(
        self,
        block: str,
        lane: str,
        name: str,
        start_ps: int,
        end_ps: int,
        *,
        detail: str = "ops",
        args: dict[str, Any] | None = None,
    ) -> None:
        if self._rank >= LEVELS[detail] and self._room():
            self.spans.append(Span(block, lane, name, start_ps, end_ps, args))

    def moved(self, block: str, lane: str, start_ps: int, end_ps: int, nbytes: int) -> None:
        """Bytes that crossed a channel or link between two times (for bandwidth counters)."""
        if self._rank >= 1 and self._room():
            self.bytes.append(ByteInterval(block, lane, start_ps, end_ps, nbytes))
