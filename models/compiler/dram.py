"""The DRAM memory map of a compiled model: every tensor's weight codes and parameters, the
RoPE tables, the regions of its blocks (KV caches per slot and layer, activations), the
shared activation buffers and host I/O buffers, in that order."""

from __future__ import annotations

from isa import kvformats

from ..bits import BitConfig
from ..config import ModelConfig
from ..reference import rope_dim
from .blocks.io import LAST_REGION, LOGITS_REGION
from .blocks.postnorm import POST_WIDE_REGION
from .blocks.registry import blocks_for
from .builder import CORE_MODES
from .memmap import MemoryMap, dram_shortfall
from .numerics import residual_bits
from .wgroup import weight_group_size, weight_row_bytes


def build_memory_map(cfg: ModelConfig, bits: BitConfig, kv: str, *, cap: int, slots: int,
                     max_seq: int, m_tile: int) -> MemoryMap:
    """The memory map of ``slots`` caches of ``cap`` tokens, calls of up to ``max_seq``
    tokens and token tiles of ``m_tile``."""
    mm = MemoryMap()
    pair = kvformats.pair(kv)
    blocks = blocks_for(cfg)
    group = weight_group_size(bits)
    for spec in cfg.tensors():
        if spec.kind == "matrix":
            if spec.name == "embed" and not cfg.tie_word_embeddings:
                continue  # the embedding runs on the host
            n, k = spec.shape
            wbits = bits.weights.bits_for(spec.role)
            mm.add(f"w.{spec.name}", n * weight_row_bytes(k, wbits, group), "weights")
            mm.add(f"p.{spec.name}", 8 * n, "weights")
        elif spec.role == "norm":
            mm.add(f"p.{spec.name}", 2 * spec.shape[0], "weights")
    rot = rope_dim(cfg)
    mm.add("rope.cos", cap * rot, "weights")
    mm.add("rope.sin", cap * rot, "weights")
    h = cfg.hidden_size
    blocks.attention.add_regions(mm, pair=pair, cap=cap, slots=slots, m_tile=m_tile)
    for mlp in blocks.mlps.values():
        mlp.add_regions(mm, m_tile=m_tile)
    rb, hb = activation_bytes(bits)
    mm.add("act.x0", rb * m_tile * h, "activations")
    mm.add("act.x1", rb * m_tile * h, "activations")
    mm.add("act.xm", rb * m_tile * h, "activations")
    mm.add("act.ao", m_tile * cfg.num_heads * cfg.head_dim, "activations")
    shared = cfg.shared_expert_width
    mm.add("act.hb", hb * m_tile * max(cfg.intermediate_size, shared), "activations")
    mm.add("io.emb", 4 * max_seq * h, "host_io")
    mm.add("io.logits", 4 * cfg.vocab_size, "host_io")
    # scratch for on-device cache rearrangement (sim.runtime.cacheops): one cache's worth of int8
    # values per core, so compaction never reads a token it has already overwritten
    mm.add("act.kvtmp", max(CORE_MODES.values()) * cap * blocks.attention.cache_width,
           "activations")
    if rb > 1 and cfg.norm_position != "pre":  # the wide post-norms' int32 inputs
        mm.add(POST_WIDE_REGION, 4 * m_tile * h, "activations")
    return mm


def activation_bytes(bits: BitConfig) -> tuple[int, int]:
    """Bytes per value of the residual stream and of the SwiGLU output in DRAM: (1, 1) for
    the int8 scheme, (2 or 4, 4) for the wide pipeline (int32 SwiGLU outputs, quantized
    per token by the down projection's core)."""
    rb = residual_bits(bits.numerics) // 8
    return rb, (4 if rb > 1 else 1)


def batch_memory_map(build, *, max_tokens: int, max_seqs: int, hidden: int,
                     vocab: int, residual_bytes: int = 1) -> MemoryMap:
    """``build(max_seq)`` (the compiler's memory map for calls of up to ``max_seq``
    tokens) with ``max_tokens`` tokens of input, plus the gathered hidden states and the
    logits of ``max_seqs`` sequences (a batched step: :func:`.driver.lower_step`);
    ``residual_bytes``: bytes per hidden value (:func:`activation_bytes`)."""
    mm = build(max_tokens)
    mm.add(LAST_REGION, max_seqs * hidden * residual_bytes, "activations")
    mm.add(LOGITS_REGION, 4 * max_seqs * vocab, "host_io")
    return mm


def dram_problem(model: ModelConfig, bits: BitConfig, kv: str, *, cap: int, slots: int,
                 max_seq: int, dram_bytes: int, hw_name: str) -> str | None:
    """Why the memory map of ``slots`` cache slots (one token per pass: the smallest
    activations) does not fit ``dram_bytes``, or None. Computed from the maps of one and two
    slots, without building the map of all of them: every slot adds the same page-aligned
    regions (tests/sim/test_config_errors.py checks that this is exact)."""
    one = build_memory_map(model, bits, kv, cap=cap, slots=1, max_seq=max_seq, m_tile=1)
    if slots == 1:
        return one.too_big(dram_bytes, hw_name)
    two = build_memory_map(model, bits, kv, cap=cap, slots=2, max_seq=max_seq, m_tile=1)
    more = slots - 1
    kv1 = one.bytes_of_kind("kv_cache")
    return dram_shortfall(one.total_bytes + more * (two.total_bytes - one.total_bytes),
                          one.bytes_of_kind("weights"),
                          kv1 + more * (two.bytes_of_kind("kv_cache") - kv1), dram_bytes, hw_name)
