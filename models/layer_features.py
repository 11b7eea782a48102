"""Per-layer features of a GQA model beyond the Llama block, and their checks.

Two families bring them (sources: ``Cohere2Config``/``modeling_cohere2.py`` and
``Exaone4Config``/``modeling_exaone4.py`` in ``transformers`` 4.57):

- **Layer types**: each layer is ``"full_attention"`` or ``"sliding_attention"``; a sliding
  layer's query at position ``p`` attends to positions ``p - sliding_window + 1 .. p``
  (HF's sliding mask: ``q_idx - kv_idx < sliding_window``), so its cache needs only the
  last ``sliding_window`` tokens. Cohere2 derives the types from
  ``sliding_window_pattern`` (layer ``i`` is sliding unless ``(i + 1) % pattern == 0``);
  EXAONE-4.0 lists them in ``layer_types``.
- **Positional embedding per layer**: with ``rope_layers = "sliding"`` the full-attention
  layers use no RoPE (Cohere2 always; EXAONE-4.0 when it has sliding layers).
- **Norms**: ``norm_kind = "layer"`` is Cohere's LayerNorm (mean removed, gamma, no bias);
  ``norm_position = "post"`` is EXAONE-4.0's order (attention -> norm -> residual add, MLP
  -> norm -> residual add; no norm before either); ``qk_norm`` is an RMSNorm over each
  query and key head before RoPE (EXAONE-4.0).
- **Parallel block** (Cohere): ``x + attn(n(x)) + mlp(n(x))`` with one norm ``n``.
- **Logit scale** (Cohere ``logit_scale``): logits are multiplied by it.

Gemma 3 (``Gemma3TextConfig``/``modeling_gemma3.py``, ``transformers`` 4.57) brings more:
``norm_position = "sandwich"`` (a norm before and one after attention and the MLP, each
output norm before its residual add), a GeGLU MLP (``hidden_act = "gelu_tanh"``), token
embeddings scaled by ``sqrt(hidden_size)`` on the host (``embed_scale``), norm gains
stored as ``w`` for ``1 + w`` (``norm_unit_offset``, folded when the weights are read),
the attention scale ``query_pre_attn_scalar ** -0.5`` and its own RoPE base for the
sliding layers (``rope_local_theta``, timing only: one RoPE table per model here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .config import ModelConfig

LayerType = Literal["full_attention", "sliding_attention"]
LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention")


def pattern_layer_types(num_layers: int, pattern: int) -> tuple[LayerType, ...]:
    """Cohere2's layer types from ``sliding_window_pattern``: every ``pattern``-th layer
    (1-based) is full, the others sliding (Cohere2Config, ``layer_types`` default)."""
    if pattern < 1:
        raise ValueError(f"sliding_window_pattern: must be >= 1, got {pattern}")
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(num_layers))


def has_layer_features(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` uses any feature of this module (a Llama-style block otherwise)."""
    return bool(cfg.layer_types is not None and "sliding_attention" in cfg.layer_types
                or cfg.rope_layers != "all" or cfg.norm_kind != "rms"
                or cfg.norm_position != "pre" or cfg.qk_norm or cfg.parallel_block
                or cfg.logit_scale != 1.0 or cfg.hidden_act != "silu"
                or cfg.embed_scale != 1.0 or cfg.norm_unit_offset
                or cfg.query_pre_attn_scalar is not None or cfg.rope_local_theta is not None)


def check_layer_features(cfg: ModelConfig) -> None:
    """Raise ``ValueError`` naming the field when the features do not fit together."""
    types = cfg.layer_types
    if types is not None and len(types) != cfg.num_layers:
        raise ValueError(f"layer_types: {len(types)} entries for num_layers {cfg.num_layers}")
    sliding = types is not None and "sliding_attention" in types
    if sliding and cfg.sliding_window is None:
        raise ValueError("sliding_window: layer_types has sliding layers but no window")
    if cfg.sliding_window is not None and not sliding:
        raise ValueError("sliding_window: set, but layer_types has no sliding layer")
    if cfg.rope_layers == "sliding" and not sliding:
        raise ValueError("rope_layers: 'sliding' needs sliding layers in layer_types "
                         "(else no layer would have a positional embedding)")
    if cfg.parallel_block and cfg.norm_position != "pre":
        raise ValueError(f"parallel_block: a parallel block has one norm before attention "
                         f"and MLP, not norm_position {cfg.norm_position!r}")
    if cfg.rope_local_theta is not None and not sliding:
        raise ValueError("rope_local_theta: the RoPE base of sliding layers needs sliding "
                         "layers in layer_types")
    if has_layer_features(cfg) and (cfg.is_mla or cfg.is_moe):
        raise ValueError("layer_types/norm_kind/norm_position/qk_norm/parallel_block/"
                         "logit_scale/hidden_act/embed_scale/norm_unit_offset/"
                         "query_pre_attn_scalar/rope_local_theta: supported for GQA models "
                         "with a dense MLP only")
