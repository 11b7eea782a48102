"""The paged KV cache as the scheduler sees it (vLLM's block manager, FACTS.md): a pool of
blocks of ``block_tokens`` tokens in the DRAM the model leaves free (or an explicit
budget); the KV format sets the bytes of a block.

A block holds ``block_tokens`` tokens at the format's steady rate (its quantized records or
per-channel groups, every layer and head). Formats that keep some tokens at full precision
(a sink, a recent window) or pad to pages store a sequence of ``n`` tokens in more bytes
than ``n`` steady tokens; a sequence then holds ``ceil(bytes(n) / block_bytes)`` blocks,
with ``bytes(n)`` the format's exact byte count (:meth:`isa.kvformats.KVFormat.bytes`
over every layer and head). For formats without such tokens (bf16, int8) that is
``ceil(n / block_tokens)``, vLLM's count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isa import kvformats
from models.compiler import CompiledModel
from models.compiler.blocks.mla import mla_record_width


def _caches(cm: CompiledModel) -> list[tuple[kvformats.KVFormat, int, int]]:
    """(format, width, heads x layers) of each kind of cache of one sequence."""
    cfg = cm.model
    if cfg.is_mla:
        return [(cm.k_fmt, mla_record_width(cfg), cfg.num_layers)]
    n = cfg.num_layers * cfg.num_kv_heads
    return [(cm.k_fmt, cfg.head_dim, n), (cm.v_fmt, cfg.head_dim, n)]


def steady_bytes_per_token(fmt: kvformats.KVFormat, width: int) -> float:
    """Bytes per token of a long cache in ``fmt`` (its quantized records or groups)."""
    if fmt.bits == 16:
        return float(fmt.fp_record_bytes(width))
    if fmt.axis == "channel":
        return fmt.block_bytes(width) / fmt.group
    return float(fmt.record_bytes(width))


@dataclass(frozen=True)
class KvGeometry:
    """Blocks of the paged KV cache of one chip."""

    block_tokens: int
    block_bytes: int
    num_blocks: int
    capacity_bytes: int  # bytes given to the KV cache
    reserved_bytes: int  # DRAM the model keeps (weights, activations, host I/O buffers)
    max_tokens: int  # longest sequence the table below covers
    bytes_per_token: float  # steady bytes per token (every layer and head)
    bf16_bytes_per_token: float
    _blocks: np.ndarray  # blocks of a sequence of n tokens, n = 0..max_tokens

    def blocks(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` cached tokens holds."""
        if tokens > self.max_tokens:
            raise ValueError(f"{tokens} tokens exceed the longest sequence "
                             f"({self.max_tokens}) of this geometry")
        return int(self._blocks[tokens])

    def block_table(self) -> list[int]:
        """Blocks of a sequence of ``n`` cached tokens for ``n = 0 .. max_tokens`` (a list:
        the scheduler's per-step lookups)."""
        return self._blocks.tolist()

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_tokens

    def describe(self) -> dict:
        return {"block_tokens": self.block_tokens, "block_bytes": self.block_bytes,
                "num_blocks": self.num_blocks, "capacity_bytes": self.capacity_bytes,
                "capacity_tokens": self.capacity_tokens,
                "reserved_bytes": self.reserved_bytes,
                "bytes_per_token": self.bytes_per_token,
                "compression_vs_bf16": self.bf16_bytes_per_token / self.bytes_per_token}


def kv_geometry(cm: CompiledModel, dram_bytes: int, *, block_tokens: int, max_tokens: int,
                budget_bytes: int | None = None) -> KvGeometry:
    """The block pool of ``cm`` on a chip with ``dram_bytes`` of DRAM: the KV cache gets
    ``budget_bytes``, or what the model's other regions (weights, activations, host I/O)
    leave. The compiled per-slot cache regions are not counted: the pool replaces them."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    caches = _caches(cm)
    bf16 = kvformats.parse("bf16")
    per_tok = sum(n * steady_bytes_per_token(f, w) for f, w, n in caches)
    ref = sum(n * steady_bytes_per_token(bf16, w) for _, w, n in caches)
    block_bytes = math.ceil(per_tok * block_tokens)
    reserved = sum(r.size for r in cm.mm.regions if r.kind != "kv_cache")
    free = dram_bytes - reserved
    cap = free if budget_bytes is None else budget_bytes
    if budget_bytes is not None and budget_bytes > free:
        raise ValueError(f"kv_budget_bytes {budget_bytes:,} exceeds the {free:,} bytes of "
                         f"DRAM the model leaves free")
    total = np.zeros(max_tokens + 1, np.int64)
    for f, w, n in caches:
        total += n * np.array([f.bytes(t, w) for t in range(max_tokens + 1)], np.int64)
    blocks = -(-total // block_bytes)
    return KvGeometry(block_tokens=block_tokens, block_bytes=block_bytes,
                      num_blocks=max(0, cap) // block_bytes, capacity_bytes=max(0, cap),
                      reserved_bytes=reserved, max_tokens=max_tokens,
                      bytes_per_token=per_tok, bf16_bytes_per_token=ref, _blocks=blocks)


def simple_geometry(*, block_tokens: int, num_blocks: int, max_tokens: int,
                    block_bytes: int = 1) -> KvGeometry:
    """A pool of ``num_blocks`` blocks where a sequence of ``n`` tokens holds
    ``ceil(n / block_tokens)`` (tests, and formats without full-precision tokens)."""
    n = np.arange(max_tokens + 1, dtype=np.int64)
    return KvGeometry(block_tokens=block_tokens, block_bytes=block_bytes,
                      num_blocks=num_blocks, capacity_bytes=num_blocks * block_bytes,
                      reserved_bytes=0, max_tokens=max_tokens,
                      bytes_per_token=block_bytes / block_tokens,
                      bf16_bytes_per_token=block_bytes / block_tokens,
                      _blocks=-(-n // block_tokens))
