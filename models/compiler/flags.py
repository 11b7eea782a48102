"""Named flags (counting semaphores) of the programs the compiler and the cache
operations build.

A flag is an integer id shared by one producer engine and one consumer engine. Ids are
given out here, by name, from a :class:`FlagLayout`: the *shared* flags have fixed ids
below :data:`PER_CORE_BASE`; each core of the program's core list gets a block of
``stride`` ids from :data:`PER_CORE_BASE` on, its named flags numbered in the layout's
order. ``flags.per_core("ld0")[core]`` and ``flags.shared("logits")`` are the ids.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The first id of the per-core blocks (ids below it are the shared flags).
PER_CORE_BASE = 16


@dataclass(frozen=True)
class FlagLayout:
    """Which flags a family of programs uses: per-core names (in id order), the ids of
    the shared flags, and the size of each core's block of ids."""

    per_core: tuple[str, ...]
    shared: tuple[tuple[str, int], ...]
    stride: int

    def __post_init__(self) -> None:
        if len(self.per_core) > self.stride:
            raise ValueError(f"{len(self.per_core)} per-core flags exceed a block of "
                             f"{self.stride} ids")
        if len(set(self.per_core)) != len(self.per_core):
            raise ValueError("a per-core flag is named twice")
        ids = [i for _, i in self.shared]
        if len(set(ids)) != len(ids) or any(not 0 < i < PER_CORE_BASE for i in ids):
            raise ValueError(f"shared flag ids {ids} must be distinct and in "
                             f"1..{PER_CORE_BASE - 1}")


#: The forward programs (one call, a batched step): per core, producer -> consumer.
FORWARD = FlagLayout(
    per_core=(
        "ld0", "ld1",  # DMA_IN -> MXU: weight tile in buffer 0/1
        "free0", "free1",  # MXU -> DMA_IN: buffer 0/1 free again
        "in_mxu",  # DMA_IN -> MXU
        "in_vpu",  # DMA_IN -> VPU
        "mxu_vpu",  # MXU -> VPU
        "vpu_mxu",  # VPU -> MXU
        "mxu_out",  # MXU -> DMA_OUT
        "vpu_out",  # VPU -> DMA_OUT
        "bar",  # any core's DMA_OUT, or the host link -> this core's DMA_IN
        "out_in",  # DMA_OUT -> DMA_IN of the same core: a store the core reloads
        "out_mxu",  # DMA_OUT -> MXU: a logits output buffer is free again
        "vpu_in",  # VPU -> DMA_IN: an index a load reads (a MoE routing table) is written
    ),
    shared=(
        ("logits", 1),  # every core's DMA_OUT -> the D2H engine: the logits are stored
        ("rows_stored", 2),  # copy engine <- every core's DMA_OUT: a tile's rows stored
    ),
    stride=16,
)

#: The on-device cache rearrangement programs (sim.runtime.cacheops).
CACHE_OPS = FlagLayout(per_core=("vpu_out", "out_vpu", "out_in", "in_vpu", "vpu_in"),
                       shared=(), stride=8)


class Flags:
    """The flag ids of one program: ``layout`` over ``cores`` (in the program's order)."""

    def __init__(self, layout: FlagLayout, cores: tuple[int, ...]):
        self.layout = layout
        self.cores = tuple(cores)
        self._shared = dict(layout.shared)
        self._per_core = {
            name: {c: PER_CORE_BASE + layout.stride * i + j for i, c in enumerate(self.cores)}
            for j, name in enumerate(layout.per_core)
        }

    def per_core(self, name: str) -> dict[int, int]:
        """core -> the id of that core's flag ``name``."""
        try:
            return self._per_core[name]
        except KeyError:
            raise KeyError(f"no per-core flag {name!r}; the flags are "
                           f"{', '.join(self.layout.per_core)}") from None

    def shared(self, name: str) -> int:
        try:
            return self._shared[name]
        except KeyError:
            raise KeyError(f"no shared flag {name!r}; the flags are "
                           f"{', '.join(self._shared) or 'none'}") from None

    def sem(self, core: int, name: str) -> int:
        return self.per_core(name)[core]
