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

from isa.errors import ConfigError
from isa.instructions import (
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Instruction,
    MemoryLayout,
    Nop,
    Program,
    Region,
    Space,
)

ALIGN = 64


def _align(x: int, a: int = ALIGN) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class GemvLayer:
    """The program plus where its data lives, and the data needed to check its result."""

    program: Program
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

    ins: list[Instruction] = [
        HostWrite(src=x_host, dst=x_dram, nbytes=k, signal=(1,) * num_cores)
    ]
    # flags: 1 = x in DRAM; per core c: base 10+10c: +0 x/scales loaded, +1/+2 tile loaded in
    # buffer 0/1, +3/+4 buffer 0/1 free, +5 output stored, +6 all tiles multiplied.
    done_flags = []
    for c in range(num_cores):
        f = 10 + 10 * c
        row0 = c * rows_per_core
        ins.append(Nop(core=c, on=Engine.DMA_IN, wait=(1,)))
        ins.append(DmaLoad(core=c, src=x_dram, dst=x_s, nbytes=k))
        ins.append(DmaLoad(core=c, src=s_dram + 4 * row0, dst=s_s, nbytes=4 * rows_per_core,
                           signal=(f,)))
        ntiles = -(-rows_per_core // tile_rows)
        for t in range(ntiles):
            rows = min(tile_rows, rows_per_core - t * tile_rows)
            b = t % 2
            ins.append(
                DmaLoad(
                    core=c,
                    src=w_dram + (row0 + t * tile_rows) * row_bytes,
                    dst=buf[b],
                    nbytes=rows * row_bytes,
                    wait=(f + 3 + b,) if t >= 2 else (),
                    signal=(f + 1 + b,),
                )
            )
            ins.append(
                Gemm(
                    core=c, m=1, k=k, n=rows, w_bits=w_bits,
                    a=x_s, w=buf[b], out=y_s + t * tile_rows,
                    scale=s_s + 4 * t * tile_rows, shift=shift,
                    wait=((f,) if t == 0 else ()) + (f + 1 + b,),
                    signal=(f + 3 + b,) if t + 2 < ntiles else (),
                )
            )
        # the last GEMM of the core also signals f+6: the output slice is complete
        g = ins[-1]
        ins[-1] = g.replace(signal=g.signal + (f + 6,))
        ins.append(DmaStore(core=c, src=y_s, dst=y_dram + row0, nbytes=rows_per_core,
                            wait=(f + 6,), signal=(f + 5,)))
        done_flags.append(f + 5)
    ins.append(HostRead(src=y_dram, dst=y_host, nbytes=n, wait=tuple(done_flags)))

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
        program=Program(tuple(ins), name=f"gemv {n}x{k} w{w_bits}"),
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
