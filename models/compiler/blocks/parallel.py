"""The MLP of a parallel block (Cohere, Command-R7B): ``x + attn(n(x)) + mlp(n(x))`` with
one norm ``n`` (the layer's ``attn_norm``).

The attention block has written ``act.xm = x + attn(n(x))``; this block normalises the
layer input ``x`` again with the same norm (one more norm pass per layer, costed as such,
instead of keeping ``n(x)`` of every core in DRAM), runs the SwiGLU slices on it (stage D
of :mod:`.dense`) and adds the down projection to ``act.xm`` -> the next layer's input
(stage E). The layer input is the activation buffer the driver does not write to:
``act.x0`` when ``x_next`` is ``act.x1`` and the other way round (:mod:`..driver`).
"""

from __future__ import annotations

from ...config import ModelConfig
from ..builder import Builder
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap
from .dense import stage_mlp_down, stage_mlp_up


class ParallelDenseMlp:
    """:class:`~.base.MlpBlock` of a dense layer in a parallel block."""

    kind = "parallel-dense"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        return None

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        x0, x1 = lw.mm["act.x0"].base, lw.mm["act.x1"].base
        x = x0 if x_next == x1 else x1  # the layer input (the driver's other buffer)
        stage_mlp_up(b, lw, layer, q, m, src=x, norm_name="attn_norm")
        stage_mlp_down(b, lw, layer, q, x_next, m)
