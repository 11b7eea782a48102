"""Multi-head latent attention (MLA, DeepSeek-V2 style): the block, its regions and caches.
The stages are :mod:`.mla_prep` (A0, A) and :mod:`.mla_attend` (B, C); shapes and work
splits :mod:`.mla_shape`; a functional compile's weights in the device's basis and its
calibration :mod:`.mla_calib`, its weight image :mod:`.mla_image`.

MLA attention runs in the *absorbed* form, so the cache holds one record per token and
layer, ``[normalised latent (kv_lora_rank) | RoPE key (qk_rope_head_dim)]``, in the single
region ``kv.s<slot>.l<layer>.c`` (format: the compiled KV layout's K format; the QuantMLA
formats quantize the last ``rope_width`` values of a record apart). ``W = kv_lora_rank +
qk_rope_head_dim`` is the record width and the attention head width. Per layer:

- A (every core): attention RMSNorm; the query path (``q_proj``, or ``q_a_proj`` ->
  ``q_a_norm`` -> ``q_b_proj``; with a query latent the ``q_a_proj`` rows are split over
  the cores in a stage A0 before A), split by heads over the cores, balancing weight
  bytes with the cache owner's work; per head, the absorption ``q_lat = q_nope @ W_UK``
  (the head's ``k_b_proj`` block, a GEMM of ``qk_nope_head_dim`` -> ``kv_lora_rank``: its
  bytes streamed as a ``kv_lora_rank x qk_nope_head_dim`` operand, as a compiler that
  stores ``k_b_proj`` transposed for the absorbed form would) and RoPE on the query's rope
  part; the score queries ``[q_lat | q_rope]`` go to ``act.qs``. The cache owner (one core
  per layer, rotating with the layer) also projects ``kv_a_proj`` (W outputs),
  RMS-normalises the latent, rotates the rope key and appends the record with one
  ``KvWrite``. For more than one token the two parts are joined into token records
  through ``act.kv`` (the vector unit has no strided output).
- B: ``Attn`` over the cache with ``kv_heads = 1`` and ``head_dim = W``: the latent is both
  key and value, so the cache is streamed once; the instruction's two DRAM streams split
  the stored cache's ``fmt.bytes(ctx, W)`` bytes in halves (K: the first, V: the rest),
  so together they read the cache exactly once (``v_nbytes = 0`` is not an option: the
  validator rejects zero-byte accesses). (The PV product is counted over W values
  per head, W - kv_lora_rank more than the latent.) Then per head the value
  up-projection ``v_b_proj`` (``kv_lora_rank`` -> ``v_head_dim``) of the output's latent
  part, into ``act.ao``. A decode step (one token) runs the whole stage on the cache owner,
  so the cache crosses DRAM once per layer; a prefill tile (arithmetic-bound) splits the
  heads over the cores, each streaming the cache.
- C: ``o_proj`` slices and the residual add (as GQA's stage C, with ``num_heads *
  v_head_dim`` inputs).

A tile of several sequences (a batched step) attends in two parts with a barrier between
(:func:`.mla_attend.stage_attend_batch`).

Functionally (:mod:`.mla_calib`): ``k_b_proj`` is stored per head transposed, so the
absorption reads its own operand; ``Attn`` sees its V address inside the K region and
takes the one latent cache as key and value (:mod:`isa.semantics`); the PV product also
runs over the rope part of each record, whose outputs nothing reads. A MoE layer's MLP
is :mod:`.moe`'s (functional too: :mod:`.moe_calib`).
"""

from __future__ import annotations

from isa.kvformats import KVPair

from ...config import ModelConfig
from ..builder import Builder
from ..kvspec import KvCacheSpec
from ..lowering import Lowering, TileSeq, kv_region
from ..memmap import MemoryMap
from .mla_attend import stage_attend, stage_attend_batch, stage_o
from .mla_prep import stage_prep, stage_q_latent
from .mla_shape import absorbed_params_region, mla_kv_problem, mla_record_width

__all__ = ["MlaAttention", "mla_kv_problem", "mla_record_width"]


class MlaAttention:
    """:class:`~.base.AttentionBlock` of an MLA model."""

    kind = "mla"
    components = ("c",)

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def kv_problem(self, kv: str) -> str | None:
        return mla_kv_problem(self.cfg, kv)

    @property
    def cache_width(self) -> int:
        return mla_record_width(self.cfg)

    def add_regions(self, mm: MemoryMap, *, pair: KVPair, cap: int, slots: int,
                    m_tile: int) -> None:
        # per-head multipliers of the absorption GEMMs, one [latent | rope key] cache per
        # slot and layer, score queries, attention outputs
        cfg = self.cfg
        assert cfg.kv_lora_rank is not None
        w = mla_record_width(cfg)
        for layer in range(cfg.num_layers):
            mm.add(absorbed_params_region(layer), 8 * cfg.num_heads * cfg.kv_lora_rank,
                   "weights")
        for s in range(slots):
            for layer in range(cfg.num_layers):
                mm.add(kv_region(s, layer, "c"), pair.k.max_bytes(cap, w), "kv_cache")
        mm.add("act.qs", m_tile * cfg.num_heads * w, "activations")
        mm.add("act.lat", m_tile * cfg.num_heads * w, "activations")
        mm.add("act.kv", m_tile * w, "activations")
        if cfg.q_lora_rank:
            mm.add("act.qa", m_tile * cfg.q_lora_rank, "activations")

    def kv_specs(self, mm: MemoryMap, *, pair: KVPair, cap: int,
                 slots: int) -> list[KvCacheSpec]:
        w, fmt = mla_record_width(self.cfg), pair.k
        return [KvCacheSpec(name, s, layer, "c", mm[name], fmt, w, 1, fmt.max_bytes(cap, w))
                for s in range(slots) for layer in range(self.cfg.num_layers)
                for name in (kv_region(s, layer, "c"),)]

    def lower(self, b: Builder, lw: Lowering, layer: int, x: int, m: int,
              segs: tuple[TileSeq, ...]) -> None:
        q = lw.numerics.layers[layer]
        if self.cfg.q_lora_rank:
            stage_q_latent(b, lw, layer, q, x, m)
        stage_prep(b, lw, layer, q, x, m, segs)
        if len(segs) == 1:
            stage_attend(b, lw, layer, q, m, segs[0].pos0, segs[0].slot)
        else:
            stage_attend_batch(b, lw, layer, q, m, segs)
        stage_o(b, lw, layer, q, x, m)

