"""The compiler's structure: named flags, the block registry, the frozen compiled model and
its KV-cache specs."""

from __future__ import annotations

import dataclasses

import pytest

from kvsim.errors import ConfigError
from models.bits import BitConfig
from models.compiler import CompiledModel, HardwareTarget, compile_model
from models.compiler.blocks import registry
from models.compiler.flags import CACHE_OPS, FORWARD, FlagLayout, Flags
from models.compiler.kvspec import KvCacheSpec
from models.source import load_model
from sim.device.hw import load_hardware


def _tiny(name: str = "tiny", **kw) -> CompiledModel:
    opts = {"kv": "int8", "core_mode": "single", "max_seq": 16, "cap": 64,
            "functional": False} | kw
    return compile_model(load_model(name), BitConfig(),
                         HardwareTarget.from_hw(load_hardware("tiny")), **opts)


def test_flag_ids_are_the_programs_numbering() -> None:
    f = Flags(FORWARD, (0, 1, 2))
    assert f.per_core("ld0") == {0: 16, 1: 32, 2: 48}
    assert f.sem(2, "bar") == 16 + 16 * 2 + 10
    assert f.sem(1, "out_in") == 16 + 16 + 11 and f.sem(1, "out_mxu") == 16 + 16 + 12
    assert (f.shared("logits"), f.shared("rows_stored")) == (1, 2)
    c = Flags(CACHE_OPS, (0, 1))
    assert c.sem(1, "vpu_in") == 16 + 8 + 4


def test_unknown_flags_and_bad_layouts_are_named() -> None:
    f = Flags(FORWARD, (0,))
    with pytest.raises(KeyError, match="no per-core flag 'nope'; the flags are ld0, ld1"):
        f.per_core("nope")
    with pytest.raises(KeyError, match="no shared flag 'x'; the flags are logits"):
        f.shared("x")
    with pytest.raises(ValueError, match="3 per-core flags exceed a block of 2 ids"):
        FlagLayout(per_core=("a", "b", "c"), shared=(), stride=2)
    with pytest.raises(ValueError, match="must be distinct"):
        FlagLayout(per_core=("a",), shared=(("x", 1), ("y", 1)), stride=4)


def test_registry_picks_blocks_from_features() -> None:
    mla = registry.blocks_for(load_model("tiny-mla"))
    assert mla.attention.kind == "mla"
    assert [mla.mlp(i).kind for i in range(2)] == ["dense", "moe"]
    assert registry.probe_layers(load_model("tiny-mla")) == (0, 1)
    gqa = registry.blocks_for(load_model("tiny"))
    assert gqa.attention.kind == "gqa" and set(gqa.mlps) == {"dense"}


def test_registry_errors_list_the_blocks_that_exist(monkeypatch) -> None:
    monkeypatch.setattr(registry, "features",
                        lambda cfg: registry.Features("ring", ("dense",) * cfg.num_layers))
    with pytest.raises(ConfigError, match="no attention block 'ring'; the attention blocks "
                                          "are gqa, mla"):
        registry.blocks_for(load_model("tiny"))


def test_compiled_model_is_frozen() -> None:
    cm = _tiny()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cm.m_tile = 3  # type: ignore[misc]


def test_kv_cache_specs() -> None:
    cm = _tiny(slots=2)
    cfg = cm.model
    specs = cm.kv_caches()
    assert all(isinstance(s, KvCacheSpec) for s in specs)
    assert len(specs) == 2 * cfg.num_layers * 2
    one = cm.kv_caches(1)
    assert [s.slot for s in one] == [1] * (2 * cfg.num_layers)
    s = one[0]
    assert (s.name, s.component, s.heads, s.width, s.window) == (
        "kv.s1.l0.k", "k", cfg.num_kv_heads, cfg.head_dim, None)
    assert s.region == cm.mm["kv.s1.l0.k"]
    assert s.head_base(1) == s.region.base + s.head_bytes
    with pytest.raises(IndexError, match="head 9 is not in"):
        s.head_base(9)
