"""The MLP block of a sandwich-norm layer (Gemma 2/3; the layer as a whole in
:mod:`.sandwich`): the gated MLP on ``mlp_norm(x_m)`` (GeGLU for ``hidden_act =
"gelu_tanh"``), then the norm after it and the residual add, ``x_next = x_m +
post_mlp_norm(down(...))``, through the post-norm stages of :mod:`.postnorm`.
"""

from __future__ import annotations

from ...config import ModelConfig
from ..builder import Builder
from ..lowering import Lowering, TileSeq
from ..memmap import MemoryMap
from .dense import stage_mlp_up
from .postnorm import proj_post_norm_residual


class SandwichDenseMlp:
    """:class:`~.base.MlpBlock` of a sandwich-norm layer: norm, gated MLP, norm, add."""

    kind = "sandwich-dense"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def add_regions(self, mm: MemoryMap, *, m_tile: int) -> None:
        return None  # act.po belongs to the attention block

    def lower(self, b: Builder, lw: Lowering, layer: int, x_next: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        p = f"layers.{layer}."
        stage_mlp_up(b, lw, layer, q, m, norm_name="mlp_norm")
        proj_post_norm_residual(
            b, lw, lw.matrix(p + "down_proj", q.down), p + "post_mlp_norm", q.post_mlp_norm,
            q.add2, m=m, src=lw.mm["act.hb"].base, k=lw.model.intermediate_size,
            resid=lw.mm["act.xm"].base, dst=x_next, what=("MLP output", "down_proj"),
            per_token=True)
