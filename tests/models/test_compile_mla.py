"""Timing-only compilation of MLA + MoE models (tiny-mla, DeepSeek-V2-Lite): programs that
validate and run on the device, caches in the memory map, a decode step that reads only
its token's experts, and the cache streamed once per layer in its stored format."""

from __future__ import annotations

import bisect
from fractions import Fraction
from functools import cache

import pytest

from isa import kvformats
from isa.instructions import Attn, DmaLoad, KvWrite
from models.bits import BitConfig
from models.compiler import CompiledModel, CompileError, HardwareTarget, compile_model
from models.compiler.blocks.moe import contributors
from models.source import load_model, load_preset
from sim.device.device import Device
from sim.device.hw import load_hardware

HOST_BYTES = 1 << 24
#: DMA event size for the DeepSeek runs: the preset's 64 KiB is simulation granularity
#: (sim/device/presets/aries.toml); 1 MiB events give the same bytes and ~the same time, faster.
ARIES_FAST = {"dma.chunk_bytes": 1 << 20}
DSV2_CAP = 4096  # tokens: a cache of a few thousand tokens next to the W8 weights
DSV2_SEQ = 4  # a short prefill (every prompt token routes to 6 of 64 experts)
RECORD = 576  # DeepSeek MLA record: kv_lora_rank 512 + qk_rope_head_dim 64 (FACTS.md)


@cache
def _hw(name: str, fast: bool = False):
    return load_hardware(name, ARIES_FAST if fast else None)


@cache
def _dsv2(kv: str) -> CompiledModel:
    return compile_model(load_preset("deepseek-v2-lite"), BitConfig(),
                         HardwareTarget.from_hw(_hw("aries", True)), kv=kv, max_seq=DSV2_SEQ,
                         cap=DSV2_CAP, functional=False)


@cache
def _dsv2_decode(kv: str, cache_size: int):
    """(program, run) of one decode step of DeepSeek-V2-Lite at ``cache_size`` tokens."""
    cm = _dsv2(kv)
    prog = cm.program(tokens=1, cache_size=cache_size)
    dev = Device(_hw("aries", True), functional=False, layout=cm.layout(host_bytes=HOST_BYTES))
    return prog, dev.run(prog)  # Device.run validates the program first


def _read(run, kind: str) -> int:
    return run.stats["link_kind"].get(("dram_read", kind), 0)


def _weight_code_bytes(cm: CompiledModel, prog) -> int:
    """Bytes the program's DMA loads read from weight-code regions (``w.*``)."""
    regions = sorted(cm.mm.regions, key=lambda r: r.base)
    bases = [r.base for r in regions]
    total = 0
    for ins in prog:
        if isinstance(ins, DmaLoad):
            r = regions[bisect.bisect_right(bases, ins.src) - 1]
            if r.name.startswith("w."):
                total += ins.total_bytes
    return total


def _expected_code_bytes(cm: CompiledModel, experts_of_layer) -> int:
    """Code bytes of every matrix the NPU reads, routed experts only those given."""
    cfg = cm.model
    total = 0
    for spec in cfg.tensors():
        if spec.kind != "matrix" or spec.role == "embedding":
            continue
        parts = spec.name.split(".")
        if "experts" in parts and int(parts[3]) not in experts_of_layer(int(parts[1])):
            continue
        n, k = spec.shape
        total += n * ((k * cm.bits_for(spec.name) + 7) // 8)
    return total


# --- tiny-mla --------------------------------------------------------------------------

@pytest.mark.parametrize(("hw_name", "core_mode"), [("tiny", "single"), ("aries", "global8")])
@pytest.mark.parametrize("overrides", [None, {"q_lora_rank": 16}], ids=["q_proj", "q_lora"])
def test_tiny_mla_prefill_and_decode_run(hw_name, core_mode, overrides) -> None:
    model = load_model("tiny-mla", overrides)
    hw = _hw(hw_name)
    cm = compile_model(model, BitConfig(weights="W4V8"), HardwareTarget.from_hw(hw),
                       kv="int8", core_mode=core_mode, max_seq=48, cap=128, slots=2,
                       functional=False)
    dev = Device(hw, functional=False, layout=cm.layout(host_bytes=HOST_BYTES))
    pre = dev.run(cm.program(tokens=48, cache_size=0, slot=1))
    dec = dev.run(cm.program(tokens=1, cache_size=48, slot=1))
    assert pre.duration_ps > dec.duration_ps > 0
    w = model.kv_lora_rank + model.qk_rope_head_dim
    prog = cm.program(tokens=1, cache_size=48, slot=1)
    writes = [i for i in prog if isinstance(i, KvWrite)]
    attns = [i for i in prog if isinstance(i, Attn)]
    assert len(writes) == len(attns) == model.num_layers
    assert all(i.width == w and i.tokens == 1 and i.pos == 48 for i in writes)
    assert all(i.kv_heads == 1 and i.head_dim == w and i.heads == model.num_heads
               and i.ctx == 49 for i in attns)
    caches = {c.name: c for c in cm.kv_caches()}
    assert {i.dst for i in writes} == {caches[f"kv.s1.l{la}.c"].region.base
                                       for la in range(model.num_layers)}


def test_tiny_mla_prefill_in_several_tiles() -> None:
    hw = _hw("tiny")
    cm = compile_model(load_preset("tiny-mla"), BitConfig(), HardwareTarget.from_hw(hw),
                       core_mode="single", max_seq=256, cap=512, functional=False)
    assert 1 < cm.m_tile < 128
    n = 2 * cm.m_tile + 1  # the last tile has one token
    dev = Device(hw, functional=False, layout=cm.layout(host_bytes=HOST_BYTES))
    run = dev.run(cm.program(tokens=n, cache_size=0))
    prog = cm.program(tokens=n, cache_size=0)
    assert sorted({i.tokens for i in prog if isinstance(i, KvWrite)}) == [1, cm.m_tile]
    assert run.stats["link_kind"][("dram_write", "kv_cache")] > 0


def test_mla_kv_caches_one_latent_record_per_layer() -> None:
    cm = _dsv2("bf16")
    caches = cm.kv_caches()
    assert len(caches) == cm.model.num_layers
    fmt = kvformats.parse("bf16")
    for c in caches:
        assert c.component == "c" and c.heads == 1 and c.width == RECORD
        assert c.region.size == fmt.max_bytes(DSV2_CAP, RECORD) == c.head_bytes
        assert c.region.kind == "kv_cache"
    assert cm.mm.bytes_of_kind("kv_cache") == len(caches) * fmt.max_bytes(DSV2_CAP, RECORD)


def test_mla_kv_layout_must_be_one_format_with_the_models_rope_width() -> None:
    hw = HardwareTarget.from_hw(_hw("tiny"))
    tiny = load_preset("tiny-mla")
    with pytest.raises(CompileError, match="different K and V"):
        compile_model(tiny, BitConfig(), hw, kv="kivi-4", core_mode="single", max_seq=8,
                      cap=64, functional=False)
    with pytest.raises(CompileError, match="qk_rope_head_dim 8"):
        compile_model(tiny, BitConfig(), hw, kv="quantmla-c4r4", core_mode="single",
                      max_seq=8, cap=64, functional=False)
    cm = compile_model(tiny, BitConfig(), hw, kv="b4.token.g8.asym.rope8b4",
                       core_mode="single", max_seq=8, cap=64, functional=False)
    assert cm.k_fmt.rope_width == 8


def test_functional_group_limited_routing_is_refused() -> None:
    """TOPK_GATE routes greedily: DeepSeek-V2's group-limited routing stays timing only
    (functional MLA + MoE: test_moe_functional.py)."""
    cfg = load_model("tiny-mla", {"topk_method": "group_limited_greedy", "n_group": 2,
                                  "topk_group": 1})
    with pytest.raises(CompileError, match="group-limited routing"):
        compile_model(cfg, BitConfig(), HardwareTarget.from_hw(_hw("tiny")),
                      core_mode="single", max_seq=8, cap=64)


# --- DeepSeek-V2-Lite on ARIES -------------------------------------------------------------

def test_deepseek_v2_lite_w8_fits_aries() -> None:
    cm = _dsv2("bf16")
    assert cm.mm.total_bytes <= cm.hw.dram_bytes
    cfg = cm.model
    codes = sum(r.size for r in cm.mm.regions if r.name.startswith("w."))
    assert codes == cfg.weights_total  # W8: one byte per weight, embedding on the host
    assert cm.m_tile == DSV2_SEQ


def _routed_code_bytes(cm: CompiledModel, tokens: int) -> int:
    """Code bytes of a pass of ``tokens`` tokens under the slot schedule (blocks/moe.py):
    every matrix but the routed experts once, ``tokens * num_experts_per_tok`` experts per
    MoE layer, and the router once more on each further core that holds slots."""
    cfg = cm.model
    k = cfg.num_experts_per_tok
    per_expert = _expected_code_bytes(cm, lambda la: {0}) - _expected_code_bytes(
        cm, lambda la: set())
    moe_layers = sum(cfg.layer_is_moe(la) for la in range(cfg.num_layers))
    router = cfg.n_routed_experts * cfg.hidden_size  # W8: one byte per weight
    extra = contributors(cfg, tokens, len(cm.lowering(cm.tile_bytes).target.cores)) - 1
    return (_expected_code_bytes(cm, lambda la: set()) + tokens * k * per_expert
            + moe_layers * extra * router)


def test_decode_reads_its_tokens_experts_worth() -> None:
    """A decode step's routed loads read k experts' weights per MoE layer (whichever the
    router picks: the loads index the routing table), so the step reads the active weights
    plus the router on each further core with a slot."""
    cm = _dsv2("bf16")
    cfg = cm.model
    prog, run = _dsv2_decode("bf16", 1000)
    assert _weight_code_bytes(cm, prog) == _routed_code_bytes(cm, 1)
    # (5 further routers of 64 x 2048 per MoE layer: 0.6 % of the active weights)
    assert _routed_code_bytes(cm, 1) < 1.01 * cfg.active_weights_per_token
    weights = _read(run, "weights")
    assert cfg.active_weights_per_token < weights < 1.015 * cfg.active_weights_per_token
    # every other expert's weights stay in DRAM
    assert weights < 0.2 * cm.mm.bytes_of_kind("weights")


def test_prefill_reads_k_experts_per_token() -> None:
    cm = _dsv2("bf16")
    cfg = cm.model
    prog = cm.programs[f"prefill_{DSV2_SEQ}"]
    assert _weight_code_bytes(cm, prog) == _routed_code_bytes(cm, DSV2_SEQ)
    dev = Device(_hw("aries", True), functional=False, layout=cm.layout(host_bytes=HOST_BYTES))
    run = dev.run(prog)
    assert _read(run, "weights") > _read(_dsv2_decode("bf16", 1000)[1], "weights")
    assert run.stats["link_kind"][("dram_write", "kv_cache")] == cfg.num_layers * (
        kvformats.parse("bf16").bytes(DSV2_SEQ, RECORD))


def test_quantmla_streams_the_cache_by_the_format_ratio() -> None:
    cfg = _dsv2("bf16").model
    pos = 1000
    ctx = pos + 1
    bf16, c4r4 = kvformats.parse("bf16"), kvformats.parse("quantmla-c4r4")
    streamed = {}
    for name, fmt in (("bf16", bf16), ("quantmla-c4r4", c4r4)):
        prog, run = _dsv2_decode(name, pos)
        attn = [i for i in prog if isinstance(i, Attn)]
        assert len(attn) == cfg.num_layers  # one core streams each layer's cache once
        assert all(i.k_nbytes + i.v_nbytes == fmt.read_bytes(0, ctx, RECORD) for i in attn)
        appended_reads = cfg.num_layers * fmt.write_bytes(pos, 1, RECORD)[0]
        streamed[name] = _read(run, "kv_cache") - appended_reads
        assert streamed[name] == cfg.num_layers * fmt.read_bytes(0, ctx, RECORD)
    ratio = Fraction(c4r4.read_bytes(0, ctx, RECORD), bf16.read_bytes(0, ctx, RECORD))
    assert Fraction(streamed["quantmla-c4r4"], streamed["bf16"]) == ratio < Fraction(1, 2)


def test_decode_time_grows_with_context() -> None:
    short = _dsv2_decode("bf16", 64)[1]
    long = _dsv2_decode("bf16", 1000)[1]
    assert long.duration_ps > short.duration_ps
    extra = _read(long, "kv_cache") - _read(short, "kv_cache")
    peak = _hw("aries").dram.channels * _hw("aries").dram.bus_width_bits_per_channel / 8 * (
        _hw("aries").dram.data_rate_mtps * 1e6)
    # the extra context is streamed from DRAM: never faster than the peak bandwidth
    assert (long.duration_ps - short.duration_ps) * 1e-12 > 0.5 * extra / peak
