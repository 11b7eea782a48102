"""Cache operations on a model with sliding-window layers (tiny-cohere2: three layers of an
8-token window keep a ring of 8 + 16 - 1 = 23 slots, then a full layer): dumps say what a
ring holds, a dump of another window is refused by name, eviction inside the window works
on the device and on the host alike (same bytes, same next logits, each at its cost) and
eviction of a position the ring no longer holds is a clear error that changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from isa import kvformats
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.config import build_model
from models.reference import ReferenceModel
from models.source import load_preset
from sim.device.device import static_roofline
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model
from sim.runtime.cacheops import (
    CacheOpError,
    evict_positions,
    rearrange_program,
    requantize_through,
    unpack_file,
)
from sim.units import ns_to_ps, transfer_ps

HW = load_hardware("tiny")
COHERE = load_preset("tiny-cohere2")
WINDOW = 8
RING = WINDOW + 16 - 1  # the window plus a 16-token tile's other tokens
TOKENS = 32  # two prefill tiles: the rings hold positions 32 - 23 = 9 .. 31
#: A per-token 4-bit format without a full-precision window (one group per head).
TOK4 = "b4.token.g16.asym.scale-fp16.zero-fp16"


def _compile(cfg=COHERE, functional=True):
    return compile_model(cfg, build_bit_config({"weights": "W8"}), HardwareTarget.from_hw(HW),
                         kv="int8", functional=functional, core_mode="single", max_seq=16,
                         cap=64)


@pytest.fixture(scope="module")
def cm():
    return _compile()


@pytest.fixture(scope="module")
def emb(cm):
    ref = ReferenceModel(COHERE, cm.weight_source(), weight_bits=cm.bits.weights)
    toks = np.random.default_rng(1).integers(0, COHERE.vocab_size, size=TOKENS + 1)
    return ref.embed(toks)


def _launched(cm, emb, functional=True):
    model = Model(cm)
    model.launch(Accelerator(hw=HW, functional=functional))
    for a in range(0, TOKENS, 16):
        model.infer(emb[a:a + 16], cache_size=a)
    return model


def test_the_rings_hold_the_window_and_a_tile(cm) -> None:
    rings = [c for c in cm.kv_caches() if c.format.ring]
    assert {c.layer for c in rings} == {0, 1, 2}
    assert {kvformats.to_text(c.format) for c in rings} == {f"b8.none.fp-bf16.ring{RING}.slide8"}


def test_a_dump_file_says_the_window_and_the_positions_held(cm, emb, tmp_path) -> None:
    model = _launched(cm, emb)
    model.dump_cache_memory_to(tmp_path, cache_id=0)
    meta = {p.name: unpack_file(p.read_bytes(), p.name)[0]
            for p in sorted(tmp_path.glob("cache_*.bin"))}
    ring = meta["cache_0000k.bin"]
    assert (ring["window"], ring["ring_slots"], ring["held"]) == (WINDOW, RING,
                                                                 [[TOKENS - RING, TOKENS]])
    assert "window" not in meta["cache_0003k.bin"]  # the full layer keeps every token
    # the same model loads it back; one whose window differs refuses it by that field
    model.load_cache_memory_from(tmp_path, cache_id=0)
    other = build_model({**COHERE.model_dump(exclude_none=True), "sliding_window": 6})
    narrow = Model(_compile(other))
    narrow.launch(Accelerator(hw=HW, functional=True))
    before = narrow.dump_cache_memory()
    with pytest.raises(CacheOpError, match=r"cache_0000k\.bin: window 8 tokens .*window of "
                                           r".*: 6 tokens"):
        narrow.load_cache_memory_from(tmp_path, cache_id=0)
    assert narrow.dump_cache_memory() == before


def test_evicting_inside_the_window_on_device_and_on_host_agree(cm, emb) -> None:
    drop = [12, 30]  # both held by every ring (9..31)
    dev, host = _launched(cm, emb), _launched(cm, emb)
    rd = dev.evict_on_device(drop, cache_size=TOKENS)
    rh = host.edit_cache_on_host(evict_positions(drop), cache_size=TOKENS)
    assert rd.new_cache_size == rh.new_cache_size == TOKENS - 2
    assert dev.dump_cache_memory() == host.dump_cache_memory()
    n = TOKENS - 2
    assert np.array_equal(dev.infer(emb[TOKENS:], cache_size=n)[0],
                          host.infer(emb[TOKENS:], cache_size=n)[0])
    # the costs: the device moves DRAM bytes only, exactly its program's; the host pays
    # the whole dump crossing PCIe both ways, two calls and its edit
    prog = rearrange_program(cm, slot=0, keep=list(range(13, 30)) + [31], dst=12)
    assert rd.pcie_bytes == 0
    assert rd.dram_bytes == static_roofline(prog, HW)["dram_bytes"]
    infos = host.get_cache_infos()
    total = sum(i.size for i in infos)
    assert rh.pcie_bytes == 2 * total
    link = HW.host_link
    lat = ns_to_ps(link.latency_ns)
    d2h = sum(lat + transfer_ps(i.size, link.d2h_effective_bytes_per_s) for i in infos)
    h2d = sum(lat + transfer_ps(i.size, link.h2d_effective_bytes_per_s) for i in infos)
    calls = 2 * ns_to_ps(HW.host.call_overhead_ns)
    assert rh.time_s == pytest.approx((d2h + h2d + calls) / 1e12 + rh.host_model_s, rel=0.01)
    assert rd.time_s < rh.time_s


def test_the_host_view_of_a_ring_starts_at_its_first_held_position(cm, emb) -> None:
    model = _launched(cm, emb)
    seen = {}

    def look(views):
        seen.update({v.name: (v.first, v.end, v.window) for v in views})

    model.edit_cache_on_host(look, cache_size=TOKENS)
    assert seen["kv.s0.l0.k"] == (TOKENS - RING, TOKENS, WINDOW)
    assert seen["kv.s0.l3.v"] == (0, TOKENS, None)


def test_evicting_beyond_the_window_is_refused_and_changes_nothing(cm, emb) -> None:
    model = _launched(cm, emb)
    before = model.dump_cache_memory()
    where = r"position 3 is outside the sliding window of layer 0 \(kv\.s0\.l0\.k\): its ring " \
            r"holds positions 9\.\.31"
    with pytest.raises(CacheOpError, match="evict: " + where):
        model.evict_on_device([3, 20], cache_size=TOKENS)
    with pytest.raises(CacheOpError, match="evict_positions: " + where):
        model.edit_cache_on_host(evict_positions([3]), cache_size=TOKENS)
    with pytest.raises(CacheOpError, match="move_cache_tail: position 5 is outside"):
        model.move_cache_tail(5, 4, TOKENS)
    # inside the window, but so many that the next token's window would reach below 9
    with pytest.raises(CacheOpError, match=r"next token's window of 8 positions starts at "
                                           r"8, but the sliding-window ring of layer 0"):
        model.evict_on_device(list(range(9, 26)), cache_size=TOKENS)
    assert model.dump_cache_memory() == before


def test_truncating_moves_keep_working_inside_the_window(cm, emb) -> None:
    """move_cache_tail and filter_cache_tail rewrite the rings from a held position on;
    the next decode reads its window from them."""
    model = _launched(cm, emb)
    assert model.move_cache_tail(20, 4, TOKENS) == 24
    assert model.filter_cache_tail(24, 4, [1, 0, 1, 1]) == 23
    logits = model.infer(emb[TOKENS:], cache_size=23)[0]
    assert np.isfinite(logits).all() and np.ptp(logits) > 0


def test_timing_only_mode_refuses_by_the_cache_size(emb) -> None:
    model = _launched(_compile(functional=False), emb, functional=False)
    with pytest.raises(CacheOpError, match="position 3 is outside the sliding window"):
        model.evict_on_device([3], cache_size=TOKENS)
    r = model.evict_on_device([30], cache_size=TOKENS)
    assert r.new_cache_size == TOKENS - 1 and r.pcie_bytes == 0 and r.dram_bytes > 0


def test_requantizing_a_ring_passes_the_positions_it_holds(cm, emb) -> None:
    """On the device (the rings' held positions 9..31 through the scratch area) and on the
    host the same bytes; the full layer passes all 32 positions."""
    dev, host = _launched(cm, emb), _launched(cm, emb)
    before = dev.dump_cache_memory()
    rd = dev.requantize_on_device(TOK4, cache_size=TOKENS)
    host.edit_cache_on_host(requantize_through(TOK4), cache_size=TOKENS)
    assert dev.dump_cache_memory() == host.dump_cache_memory() != before
    assert rd.pcie_bytes == 0 and rd.new_cache_size == TOKENS
    logits = [m.infer(emb[TOKENS:], cache_size=TOKENS)[0] for m in (dev, host)]
    assert np.array_equal(*logits)
