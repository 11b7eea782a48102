"""A hand-written program: one linear layer (GEMV) with double-buffered weight streaming
and a host round trip. It is the embedded default scenario of ``kvsim run`` until full
models are compiled, and a compact example of how programs use flags.

Data flow: the host writes an int8 input vector ``x[k]`` to DRAM over the host link; each
core loads ``x`` into its SRAM, then streams its share of the weight rows in tiles through
two SRAM buffers (tile ``t+1`` loads while tile ``t`` multiplies), requantizes to int8,
stores its slice of ``y[n]`` to DRAM; the host reads ``y`` back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isa.columns import ColumnProgram, ColumnsBuilder, ProgramColumns
from isa.instructions import (
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    MemoryLayout,
    Nop,
    Region,
    Space,
)
from kvsim.errors import ConfigError

ALIGN = 64


def _align(x: int, a: int = ALIGN) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class GemvLayer:
    """The program plus where its data lives, and the data needed to check its result."""

    program: ColumnProgram  # instruction objects made on first use
    layout: MemoryLayout
    x_host: int
    y_host: int
    w_dram: int
    k: int
    n: int
    w_bits: int
    shift: int
    tile_rows: int

    def weight_bytes(self) -> int:
        return self.n * self.k * self.w_bits // 8


def gemv_layer(
    *,
    k: int,
    n: int,
    w_bits: int,
    num_cores: int,
    sram_bytes: int,
    dram_bytes: int,
    host_bytes: int,
    tile_bytes: int | None = None,
    shift: int = 12,
) -> GemvLayer:
    """Build the program for ``y = requant(W x)`` with ``W`` of ``n x k`` at ``w_bits``."""
    if w_bits not in (4, 8):
        raise ConfigError(f"workload.w_bits: must be 4 or 8, got {w_bits}")
    if n % num_cores:
        raise ConfigError(f"workload.n: {n} must be a multiple of the {num_cores} cores")
    row_bytes = k * w_bits // 8
    rows_per_core = n // num_cores
    # SRAM plan per core: x, two weight buffers, scales, output slice.
    fixed = _align(k) + _align(4 * rows_per_core) + _align(rows_per_core)
    budget = tile_bytes if tile_bytes is not None else (sram_bytes - fixed) // 2
    tile_rows = max(1, min(rows_per_core, budget // row_bytes))
    if fixed + 2 * _align(tile_rows * row_bytes) > sram_bytes:
        raise ConfigError(
            f"workload.tile_bytes: a weight tile of {tile_rows} rows x {row_bytes} bytes does "
            f"not fit in {sram_bytes} bytes of SRAM with the vectors"
        )
    # DRAM map
    x_dram = 0
    y_dram = _align(x_dram + k)
    s_dram = _align(y_dram + n)
    w_dram = _align(s_dram + 4 * n, 4096)
    dram_end = w_dram + n * row_bytes
    # SRAM map (same on every core)
    x_s = 0
    s_s = _align(x_s + k)
    y_s = _align(s_s + 4 * rows_per_core)
    buf = [_align(y_s + rows_per_core)]
    buf.append(_align(buf[0] + tile_rows * row_bytes))
    # host buffers
    x_host, y_host = 0, _align(k, 4096)

    # flags: 1 = x in DRAM; per core c: base 10+10c: +0 x/scales loaded, +1/+2 tile loaded in
    # buffer 0/1, +3/+4 buffer 0/1 free, +5 output stored, +6 all tiles multiplied.
    cols = _gemv_columns(num_cores=num_cores, k=k, n=n, w_bits=w_bits, shift=shift,
                         rows_per_core=rows_per_core, tile_rows=tile_rows,
                         row_bytes=row_bytes, x_host=x_host, y_host=y_host, x_dram=x_dram,
                         y_dram=y_dram, s_dram=s_dram, w_dram=w_dram, x_s=x_s, s_s=s_s,
                         y_s=y_s, buf=buf)

    regions = (
        Region("x", Space.DRAM, x_dram, k, "host_io"),
        Region("y", Space.DRAM, y_dram, n, "host_io"),
        Region("scales", Space.DRAM, s_dram, 4 * n, "weights"),
        Region("weights", Space.DRAM, w_dram, n * row_bytes, "weights"),
    )
    layout = MemoryLayout(
        dram_bytes=max(dram_bytes, dram_end),
        sram_bytes=sram_bytes,
        host_bytes=host_bytes,
        num_cores=num_cores,
        regions=regions,
    )
    return GemvLayer(
        program=ColumnProgram(cols, name=f"gemv {n}x{k} w{w_bits}"),
        layout=layout,
        x_host=x_host,
        y_host=y_host,
        w_dram=w_dram,
        k=k,
        n=n,
        w_bits=w_bits,
        shift=shift,
        tile_rows=tile_rows,
    )


def _gemv_columns(*, num_cores: int, k: int, n: int, w_bits: int, shift: int,
                  rows_per_core: int, tile_rows: int, row_bytes: int, x_host: int,
                  y_host: int, x_dram: int, y_dram: int, s_dram: int, w_dram: int, x_s: int,
                  s_s: int, y_s: int, buf: list[int]) -> ProgramColumns:
    """The GEMV's instructions as columns, in program order: the host write; per core a
    ``Nop`` waiting for ``x``, the loads of ``x`` and the scales, per weight tile its load
    then its GEMM (buffers alternating), the store of the output slice; the host read."""
    ntiles = -(-rows_per_core // tile_rows)
    per_core = 4 + 2 * ntiles  # instructions per core
    c = np.arange(num_cores)
    f = 10 + 10 * c  # each core's first flag
    base = 1 + per_core * c  # each core's first instruction
    row0 = c * rows_per_core
    # per (core, tile), core-major
    t = np.tile(np.arange(ntiles), num_cores)
    tc = np.repeat(c, ntiles)
    tf = np.repeat(f, ntiles)
    tb = t % 2
    rows = np.minimum(tile_rows, rows_per_core - t * tile_rows)
    at = np.repeat(base, ntiles) + 3 + 2 * t
    none = np.full(len(t), -1)

    cb = ColumnsBuilder()
    cb.add(HostWrite, 1, at=[0], src=x_host, dst=x_dram, nbytes=k, signal=(1,) * num_cores)
    cb.add(Nop, num_cores, at=base, core=c, on=Engine.DMA_IN, wait=(1,))
    cb.add(DmaLoad, num_cores, at=base + 1, core=c, src=x_dram, dst=x_s, nbytes=k)
    cb.add(DmaLoad, num_cores, at=base + 2, core=c, src=s_dram + 4 * row0, dst=s_s,
           nbytes=4 * rows_per_core, signal=f[:, None])
    # tile t's load waits for its buffer to be freed by the GEMM of tile t-2
    cb.add(DmaLoad, len(t), at=at, core=tc, src=w_dram + (np.repeat(row0, ntiles) + t
                                                          * tile_rows) * row_bytes,
           dst=np.asarray(buf)[tb], nbytes=rows * row_bytes,
           wait=np.where(t >= 2, tf + 3 + tb, none)[:, None], signal=(tf + 1 + tb)[:, None])
    # the first GEMM also waits for x and the scales; a GEMM frees its buffer for tile t+2,
    # and the last one of a core signals that the output slice is complete
    cb.add(Gemm, len(t), at=at + 1, core=tc, m=1, k=k, n=rows, w_bits=w_bits, a=x_s,
           w=np.asarray(buf)[tb], out=y_s + t * tile_rows, scale=s_s + 4 * t * tile_rows,
           shift=shift,
           wait=np.stack([np.where(t == 0, tf, none), tf + 1 + tb], axis=1),
           signal=np.stack([np.where(t + 2 < ntiles, tf + 3 + tb, none),
                            np.where(t == ntiles - 1, tf + 6, none)], axis=1))
    cb.add(DmaStore, num_cores, at=base + per_core - 1, core=c, src=y_s, dst=y_dram + row0,
           nbytes=rows_per_core, wait=(f + 6)[:, None], signal=(f + 5)[:, None])
    cb.add(HostRead, 1, at=[1 + per_core * num_cores], src=y_dram, dst=y_host, nbytes=n,
           wait=tuple((f + 5).tolist()))
    return cb.build()


def demo_data(layer: GemvLayer, seed: int) -> dict[str, np.ndarray]:
    """Deterministic int8 input, weights (packed when 4-bit) and per-row multipliers."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=layer.k, dtype=np.int8)
    lo, hi = (-8, 8) if layer.w_bits == 4 else (-128, 128)
    w = rng.integers(lo, hi, size=(layer.n, layer.k), dtype=np.int8)
    scale = rng.integers(1, 64, size=layer.n, dtype=np.int32)
    if layer.w_bits == 4:
        u = (w.astype(np.int16) & 0x0F).astype(np.uint8)
        packed = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
    else:
        packed = w.view(np.uint8)
    return {"x": x, "w": w, "w_bytes": packed.reshape(-1), "scale": scale}
