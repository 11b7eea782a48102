"""Sliding-window GQA (blocks/sliding.py): sliding layers keep a ring of their window in
the KV cache, their attention reads only the window (in bytes and in time), full layers
may lack RoPE; the integer pipeline matches the float reference that masks the window."""

from __future__ import annotations

import numpy as np
import pytest

from isa import kvformats
from isa.instructions import Attn, KvWrite
from models.bits import build_bit_config
from models.compiler import CompileError, HardwareTarget, compile_model
from models.compiler.blocks.registry import features
from models.config import build_model
from models.reference import ReferenceModel
from models.source import load_preset
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model

TINY_HW = load_hardware("tiny")
WINDOW = 4
#: The tiny preset with three sliding layers of a 4-token window, then a full layer
#: without positional embedding (Cohere2's pattern, on the tiny model's blocks).
SWA = build_model({**load_preset("tiny").model_dump(exclude_none=True), "name": "tiny-swa",
                   "num_layers": 4, "sliding_window": WINDOW, "rope_layers": "sliding",
                   "layer_types": ["sliding_attention"] * 3 + ["full_attention"]})


def _compile(cfg=SWA, kv="int8", functional=True, **kw):
    opts = {"core_mode": "single", "max_seq": 16, "cap": 64} | kw
    return compile_model(cfg, build_bit_config({"weights": "W8"}),
                         HardwareTarget.from_hw(TINY_HW), kv=kv, functional=functional, **opts)


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_registry_picks_the_sliding_block() -> None:
    assert features(SWA).attention == "sliding-gqa"
    assert features(load_preset("tiny")).attention == "gqa"
    assert features(load_preset("command-r7b")).attention == "sliding-gqa"


def test_functional_sliding_window_matches_the_float_reference() -> None:
    """A 10-token prefill (its queries' windows differ) and 6 decode steps past the window:
    logit cosine to the float reference with the same W8 weights (measured: mean 0.988,
    worst call 0.982)."""
    cm = _compile()
    specs = cm.kv_caches()
    ring = "b8.none.fp-bf16.ring19.slide4"  # window 4 + a 16-token tile - 1
    assert [(s.layer, kvformats.to_text(s.format), s.window)
            for s in specs if s.component == "k"] == [
        (0, ring, 4), (1, ring, 4), (2, ring, 4), (3, "int8", None)]
    acc = Accelerator(hw=TINY_HW, functional=True)
    model = Model(cm)
    model.launch(acc)
    ref = ReferenceModel(SWA, cm.weight_source(), weight_bits=cm.bits.weights)
    toks = np.random.default_rng(1).integers(0, SWA.vocab_size, size=16)
    want = ref.prefill(toks)
    emb = ref.embed(toks)
    cos = [_cos(model.infer(emb[:10], cache_size=0)[0], want[9])]
    for i in range(10, 16):
        cos.append(_cos(model.infer(emb[i:i + 1], cache_size=i)[0], want[i]))
    assert float(np.mean(cos)) >= 0.985 and min(cos) >= 0.97, cos
    # the windows matter: a reference that attends to everything is further off
    full = build_model({**SWA.model_dump(exclude_none=True), "sliding_window": None,
                        "layer_types": None, "rope_layers": "all"})
    other = ReferenceModel(full, seed=0, weight_bits=cm.bits.weights)
    assert np.array_equal(other.weights.tensor("layers.0.q_proj"),
                          ref.weights.tensor("layers.0.q_proj"))
    assert _cos(other.prefill(toks)[15], want[15]) < 0.95


def test_decode_of_a_sliding_layer_reads_only_its_window() -> None:
    cm = _compile(functional=False, cap=512)
    prog = cm.program(tokens=1, cache_size=400)
    hd = SWA.head_dim
    attn = [i for i in prog.instructions if isinstance(i, Attn)]
    writes = [i for i in prog.instructions if isinstance(i, KvWrite)]
    per_layer = len(attn) // SWA.num_layers  # one Attn per KV head per layer
    # sliding layers: the last 4 positions (header 8 bytes + 4 int8 records); the full
    # layer: all 401
    assert [(a.ctx, a.pos, a.k_nbytes, a.k_fmt) for a in attn[::per_layer]] == [
        (4, 3, 8 + 4 * hd, 2)] * 3 + [(401, 400, 401 * hd, 0)]
    ring = cm.kv_caches()[0]
    assert ring.head_bytes == 8 + (WINDOW + cm.m_tile - 1) * hd  # the ring, not 512 tokens
    assert {w.fmt for w in writes} == {0, 1, 2, 3}
    assert prog.formats[2] == f"b8.none.fp-bf16.ring{WINDOW + cm.m_tile - 1}.slide4"


def test_sliding_layers_refuse_formats_without_a_ring() -> None:
    with pytest.raises(CompileError, match="sliding-window layers keep a ring"):
        _compile(kv="kivi-4", functional=False)


def test_a_batched_step_attends_each_sequence_over_its_own_window() -> None:
    from models.compiler.driver import StepSeq, lower_step

    cm = _compile(functional=False, slots=2)
    prog = lower_step(cm.lowering(), [StepSeq(0, 1, 30, logits=False),
                                      StepSeq(1, 3, 2, logits=False)])
    attn = [(a.q_len, a.ctx, a.pos, a.k_fmt) for a in prog.instructions
            if isinstance(a, Attn)]
    # per KV head of layer 0 (sliding): slot 0 decodes at 30 (its last 4 positions), slot 1
    # prefills 2..4 (positions 0..4: the first query's window starts at 0)
    assert attn[:2] == [(1, 4, 3, 2), (3, 5, 2, 2)]
    # the last layer (full): everything cached
    assert attn[-2:] == [(1, 31, 30, 0), (3, 5, 2, 0)]
