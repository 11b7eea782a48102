"""Routed loads and GEMMs of the MoE block (:mod:`.moe`): a weight matrix of *some* expert,
chosen by the routing table in SRAM when the load runs.

The experts of a layer sit in DRAM at a uniform stride (:func:`expert_stride`), so
expert 0's addresses plus ``id * stride`` address expert ``id``; ``dma.load.ix``
(:class:`~isa.instructions.DmaLoadIndexed`) reads ``id`` from the table entry at
``index`` and every engine times it as the load of expert 0, so these GEMMs take the same
cycles whatever the router chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from isa.instructions import NO_ADDR, DmaLoadIndexed

from ...config import ModelConfig
from ..builder import Builder, Matrix, gemm_kind
from ..errors import CompileError
from ..memmap import MemoryMap
from ..sram import SramPlan


@dataclass(frozen=True)
class ExpertTable:
    """Where one layer's routed experts are: ``count`` experts, each one's regions (codes
    and parameters alike) ``stride`` bytes after the previous one's."""

    count: int
    stride: int


def expert_stride(mm: MemoryMap, cfg: ModelConfig, layer: int) -> int:
    """Bytes from each routed expert's regions of MoE layer ``layer`` to the next one's:
    the map lays the experts out one after another in the same shapes, so one stride
    addresses them all (the routed loads of blocks/moe.py rely on it; checked here for
    every region of every expert)."""
    assert cfg.n_routed_experts is not None
    names = [r.name for r in mm.regions if r.name.startswith(f"w.layers.{layer}.experts.0.")
             or r.name.startswith(f"p.layers.{layer}.experts.0.")]
    if cfg.n_routed_experts == 1 or not names:
        return 0
    e0 = f"layers.{layer}.experts.0."
    stride = mm[names[0].replace(e0, f"layers.{layer}.experts.1.")].base - mm[names[0]].base
    for e in range(cfg.n_routed_experts):
        for name in names:
            other = name.replace(e0, f"layers.{layer}.experts.{e}.")
            if mm[other].base != mm[name].base + e * stride or mm[other].size != mm[name].size:
                raise CompileError(f"{other}: not {e} x {stride} bytes after {name}; the "
                                   "routed loads need one stride between experts")
    return stride


def load_ix(b: Builder, c: int, src: int, dst: int, nbytes: int, *, index: int,
            table: ExpertTable, to: str, wait: tuple[int, ...] = ()) -> None:
    """:meth:`Builder.load` of expert ``table[index]``'s bytes at ``src`` (expert 0's)."""
    b.emit(DmaLoadIndexed(core=c, src=src, dst=dst, nbytes=nbytes, index=index,
                          stride=table.stride, count=table.count,
                          wait=b.take_bar(c) + wait, signal=(b.sem(c, to),)))


def gemm_ix(b: Builder, c: int, mat: Matrix, *, index: int, table: ExpertTable, a: int,
            out: int, plan: SramPlan, mult: int | None = None,
            first_wait: tuple[int, ...] = (), last_signal: tuple[int, ...] = (),
            index_wait: tuple[int, ...] = ()) -> None:
    """``out[0, :] = a[0, k] @ W_e.T`` (one token, every row of ``mat``), ``W_e`` the
    expert ``table[index]`` names (``mat``: expert 0's): its per-row multipliers (into
    ``mult``, or a new buffer) and its weight tiles through the two tile buffers by routed
    loads, as :meth:`Builder.gemm` streams a fixed matrix. ``index_wait``: what the first
    routed load waits for (the table's writer)."""
    t = b.target
    n = mat.n
    if mult is None:
        mult = plan.take(4 * n, f"{mat.name} multipliers")
    load_ix(b, c, mat.p_addr + 4 * n, mult, 4 * n, index=index, table=table, to="in_mxu",
            wait=index_wait)
    wait0 = first_wait + (b.sem(c, "in_mxu"),)
    kind, extra = gemm_kind(mat)
    if mat.gemm_row:
        extra.update(row_meta=NO_ADDR, row_shift=mat.row_shift, out_bits=mat.out_bits)
    elt = (4 if mat.out_bits == 32 else 1) if mat.gemm_row else 1
    tiles = b.weight_tiles(mat, (0, n))
    for i, (lo, hi) in enumerate(tiles):
        k = b.tiles[c]
        b.tiles[c] += 1
        buf = k % 2
        b.emit(DmaLoadIndexed(core=c, src=mat.w_addr + lo * mat.row_bytes,
                              dst=buf * t.tile_bytes, nbytes=(hi - lo) * mat.row_bytes,
                              index=index, stride=table.stride, count=table.count,
                              wait=(b.sem(c, f"free{buf}"),) if k >= 2 else (),
                              signal=(b.sem(c, f"ld{buf}"),)))
        b.emit(kind(**extra, core=c, m=1, k=mat.k, n=hi - lo, w_bits=mat.bits, a=a,
                    w=buf * t.tile_bytes, out=out + lo * elt, bias=NO_ADDR,
                    scale=mult + 4 * lo, shift=mat.shift, out_stride=0,
                    wait=(b.sem(c, f"ld{buf}"),) + (wait0 if i == 0 else ()),
                    signal=(b.sem(c, f"free{buf}"),) + (last_signal if i == len(tiles) - 1
                                                        else ())))
