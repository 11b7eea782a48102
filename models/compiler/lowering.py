"""The lowering context of one compiled model: its config, weight bits, KV formats,
sizes, memory map, integer parameters, hardware target and blocks, with the names and
work splits every block uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from isa import kvformats
from kvsim.errors import ConfigError

from ..config import ModelConfig
from .builder import BlockMemo, Matrix, Target, split
from .memmap import MemoryMap
from .numerics import GemmQ, Numerics

if TYPE_CHECKING:
    from .blocks.registry import ModelBlocks


@dataclass(frozen=True)
class TileSeq:
    """The tokens of one sequence inside a token tile (batched lowering): ``n`` tokens at
    rows ``off .. off+n-1`` of the tile, at cache positions ``pos0 .. pos0+n-1`` of cache
    slot ``slot``; ``route``: the MoE routing key of its first token (the next tokens
    count up from it; None: the tokens' positions, as one sequence's call routes them);
    ``shift``: how far the RoPE positions of its tokens lie beyond their cache positions
    (0 on the vendor's runtime; after an eviction kvsim may keep the text's positions:
    ``Model.infer(position=...)``)."""

    slot: int
    pos0: int
    n: int
    off: int = 0
    route: int | None = None
    shift: int = 0

    @property
    def rope0(self) -> int:
        """The RoPE position of the first token (its row of the cos/sin tables)."""
        return self.pos0 + self.shift



@dataclass(frozen=True)
class Lowering:
    """Everything needed to lower forward passes of one compiled model."""

    model: ModelConfig
    weight_bits: dict[str, int]  # tensor name -> bits
    k_fmt: kvformats.KVFormat
    v_fmt: kvformats.KVFormat
    cap: int  # cache capacity per slot, tokens
    max_seq: int  # most tokens per call
    m_tile: int  # most tokens per pass through the layers
    mm: MemoryMap
    numerics: Numerics
    target: Target
    blocks: ModelBlocks
    #: the blocks lowered so far and what they emitted (the driver replays repeats)
    memo: BlockMemo = field(default_factory=BlockMemo, compare=False, repr=False)
    #: group size of the 4-bit matrices (``bits.numerics.weight_group``; 0 = per channel)
    weight_group: int = 0
    #: how attention reads the cache (``bits.kv_read``): ``integer`` or ``dequant``
    kv_read: str = "integer"
    #: how the wide pipeline's stages use SRAM (``bits.numerics.schedule``): ``lean`` or
    #: ``resident`` (the same integer results)
    wide_schedule: str = "lean"

    # --- names ------------------------------------------------------------------------
    def check_call(self, n: int, cache_size: int, shift: int = 0) -> None:
        """Refuse a call of ``n`` tokens at cache position ``cache_size`` (RoPE positions
        ``shift`` beyond) that this lowering cannot hold."""
        if n < 1:
            raise ConfigError(f"a call needs at least one token, got {n}")
        if n > self.max_seq:
            raise ConfigError(f"{n} tokens exceed the compiled max_sequence_length "
                              f"{self.max_seq}")
        if cache_size < 0 or cache_size + n > self.cap:
            raise ConfigError(f"cache_size {cache_size} + {n} tokens exceed the cache "
                              f"capacity {self.cap}")
        if shift < 0 or cache_size + shift + n > self.cap:
            raise ConfigError(f"RoPE position {cache_size + shift} + {n} tokens: outside the "
                              f"{self.cap} rows of the RoPE tables (a position from the "
                              f"cache size {cache_size} on)")
        if shift and self.model.is_mla:
            raise ConfigError("a RoPE position beyond the cache size: MLA models take none "
                              "(their decoupled RoPE key is cached with its position)")

    @staticmethod
    def kv_region(slot: int, layer: int, comp: str) -> str:
        return kv_region(slot, layer, comp)

    def matrix(self, name: str, gq: GemmQ, *, requant: bool = True) -> Matrix:
        spec = self.model.tensor_spec(name)
        n, k = spec.shape
        bias_name = name.replace("_proj", "_bias")
        try:
            has_bias = bias_name != name and bool(self.model.tensor_spec(bias_name))
        except ConfigError:
            has_bias = False
        wide = self.numerics.wide
        bits = self.weight_bits[name]
        return Matrix(name, n, k, bits, self.mm[f"w.{name}"].base,
                      self.mm[f"p.{name}"].base, has_bias, requant or wide, gq.shift,
                      gemm_row=wide, row_shift=gq.row_shift, out_bits=gq.out_bits,
                      group=self.weight_group if bits == 4 else 0)

    @property
    def lean(self) -> bool:
        """The wide pipeline with the SRAM-lean schedule (``bits.numerics.schedule``)."""
        # post-norm blocks (EXAONE-4.0, Gemma) read the SwiGLU output as int32 rows
        # quantized by their own down projection: they keep the resident schedule
        return (self.numerics.wide and self.wide_schedule == "lean"
                and self.model.norm_position == "pre")

    @property
    def formats(self) -> tuple[str, ...]:
        """The programs' format table: K, V, then the attention block's extra formats
        (a sliding-window model's ring formats)."""
        extra = getattr(self.blocks.attention, "extra_formats", None)
        more = tuple(kvformats.to_text(f) for f in extra(self)) if extra else ()
        return (kvformats.to_text(self.k_fmt), kvformats.to_text(self.v_fmt)) + more

    def rows(self, n: int, c: int, unit: int = 16) -> tuple[int, int]:
        """Core ``c``'s contiguous share of ``n`` rows (whole ``unit``s)."""
        i = self.target.cores.index(c)
        return split(n, len(self.target.cores), unit)[i]


def kv_region(slot: int, layer: int, comp: str) -> str:
    """The memory-map name of component ``comp`` of layer ``layer``'s cache in ``slot``."""
    return f"kv.s{slot}.l{layer}.{comp}"

