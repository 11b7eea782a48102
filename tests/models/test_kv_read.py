"""The two KV read paths (``bits.kv_read`` / ``[kv] read``): ``integer`` (Attn, the cache
consumed as integers) and ``dequant`` (AttnDq: a vector-unit dequant pass to fp16, fp16
attention). Same program structure and bytes, different attention cycles, same program in
functional and timing runs, and the model still right on both paths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from isa.encoding import encode_program
from isa.instructions import Attn, AttnDq
from models.bits import W4V8, BitConfig, NumericsOptions, build_bit_config
from models.compiler import CompiledModel, CompileError, HardwareTarget, compile_model
from models.source import load_preset
from sim.device.device import Device
from sim.device.hw import load_hardware

from .test_compiler import _decode_cosines, _run_program

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")
#: The KV formats the issue names: native int8, KIVI 4/2-bit (per-channel keys), QServe KV4
#: and a 2-bit per-token format.
LAYOUTS = ("int8", "kivi-4", "kivi-2", "qserve-kv4", "tok2")


def _tiny(kv: str, read: str, functional: bool = True):
    return compile_model(TINY, BitConfig(kv_read=read), HardwareTarget.from_hw(TINY_HW), kv=kv,
                         core_mode="single", max_seq=16, cap=64, functional=functional)


def _attn_fields(ins: Attn) -> dict:
    skip = {"score_mult", "score_shift", "out_mult", "out_shift"}
    return {f.name: getattr(ins, f.name) for f in dataclasses.fields(Attn)
            if f.name not in skip}


@pytest.mark.parametrize("kv", LAYOUTS)
def test_both_read_paths_have_the_same_program_structure_and_bytes(kv: str) -> None:
    a = _tiny(kv, "integer", functional=False).program(tokens=1, cache_size=40)
    b = _tiny(kv, "dequant", functional=False).program(tokens=1, cache_size=40)
    assert len(a) == len(b) and a.formats == b.formats
    n_attn = 0
    for x, y in zip(a, b, strict=True):
        if type(x) is Attn:
            assert type(y) is AttnDq and _attn_fields(x) == _attn_fields(y)
            n_attn += 1
        else:
            assert x == y
    assert n_attn == TINY.num_layers * TINY.num_kv_heads
    ra, rb = _run_program(_tiny(kv, "integer", False), False, 1, 40), \
        _run_program(_tiny(kv, "dequant", False), False, 1, 40)
    assert ra.stats["link_kind"] == rb.stats["link_kind"]  # the same bytes move


@pytest.mark.parametrize("kv", ["kivi-2", "tok2"])
def test_dequant_functional_and_timing_runs_agree_cycle_for_cycle(kv: str) -> None:
    f = _run_program(_tiny(kv, "dequant"), True, 12, 0)
    t = _run_program(_tiny(kv, "dequant", False), False, 12, 0)
    assert f.duration_ps == t.duration_ps and f.stats == t.stats


def test_dequant_attention_costs_cycles_where_it_is_compute_bound() -> None:
    """A 256-token prefill of Qwen2.5-0.5B on ARIES: the dequant pass and the fp16 MACs
    (a quarter of the int8 rate) lengthen the attention; the bytes moved are the same."""
    hw = load_hardware("aries")
    model = load_preset("qwen2.5-0.5b")
    runs = {}
    for read in ("integer", "dequant"):
        cm = compile_model(model, build_bit_config({"kv_read": read}),
                           HardwareTarget.from_hw(hw), kv="kivi-4", core_mode="global8",
                           max_seq=256, cap=512, functional=False)
        dev = Device(hw, functional=False, layout=cm.layout(host_bytes=1 << 24))
        runs[read] = dev.run(cm.program(tokens=256, cache_size=0))
    assert runs["dequant"].duration_ps > runs["integer"].duration_ps
    assert runs["dequant"].stats["link_kind"] == runs["integer"].stats["link_kind"]


def test_both_read_paths_follow_the_float_reference() -> None:
    """Logit cosine to the float model with the same weights over a prefill and decode
    steps (tiny synthetic model): the fp16 path is as close as the integer one."""
    cos = {(kv, read): float(np.mean(_decode_cosines(_tiny(kv, read), same_weights=True)))
           for kv in ("int8", "kivi-2") for read in ("integer", "dequant")}
    for kv in ("int8", "kivi-2"):
        assert cos[(kv, "dequant")] >= 0.99, cos
        assert abs(cos[(kv, "dequant")] - cos[(kv, "integer")]) < 0.005, cos


def test_dequant_read_of_an_mla_model_is_refused() -> None:
    with pytest.raises(CompileError, match="kv.read"):
        compile_model(load_preset("tiny-mla"), BitConfig(kv_read="dequant"),
                      HardwareTarget.from_hw(TINY_HW), kv="int8", core_mode="single",
                      max_seq=16, cap=64, functional=False)


def test_a_dequant_g32_compiled_model_file_round_trips(tmp_path) -> None:
    """The read path and the weight groups travel in the compiled-model file: a loaded
    model lowers the same programs (attn.dq scales and gemm.g rows included)."""
    bits = BitConfig(weights=W4V8, numerics=NumericsOptions(weight_group="g32"),
                     kv_read="dequant")
    cm = compile_model(TINY, bits, HardwareTarget.from_hw(TINY_HW), kv="kivi-2",
                       core_mode="single", max_seq=16, cap=64)
    cm.save(tmp_path / "m.kvm")
    back = CompiledModel.load(tmp_path / "m.kvm")
    assert (back.bits.kv_read, back.bits.numerics.weight_group) == ("dequant", "g32")
    for tokens, cache in ((1, 10), (12, 0)):
        assert encode_program(back.program(tokens=tokens, cache_size=cache)) == \
            encode_program(cm.program(tokens=tokens, cache_size=cache))
