"""The attention block of a layer with norms on both sides of each branch (Gemma 2/3,
``norm_position = "sandwich"``; ``modeling_gemma3.py`` in ``transformers``):

    x_m    = x   + post_attn_norm(o_proj(attn(qk_norm(q(n(x))), qk_norm(k(n(x))), v(n(x)))))
    x_next = x_m + post_mlp_norm(down(gelu(gate(n2(x_m))) * up(n2(x_m))))

with ``n = attn_norm`` and ``n2 = mlp_norm``. It is EXAONE-4.0's post-norm attention
(:mod:`.postnorm`: QK norm, sliding layers, the two-stage post-norm and residual add)
with the GQA input norm in front; the MLP block is :mod:`.sandwich_mlp`.
"""

from __future__ import annotations

from ..builder import Builder
from ..lowering import Lowering
from ..ops import norm
from ..sram import SramPlan
from .postnorm import PostNormAttention


class SandwichAttention(PostNormAttention):
    """:class:`~.base.AttentionBlock` of a sandwich-norm model (Gemma 2/3)."""

    kind = "sandwich-gqa"

    def input_norm(self, b: Builder, lw: Lowering, c: int, plan: SramPlan, layer: int, q,
                   xs: int, m: int) -> int:
        return norm(b, lw, c, plan, f"layers.{layer}.attn_norm", q.attn_norm, xs, m,
                    lw.model.hidden_size, to="vpu_mxu")
