"""The quality of a cache edit beside its cost (``sim.app.quality.evaluate_edit``) on the tiny
synthetic model: the first 256 tokens teacher-forced, the cache edited on the host (dump
over PCIe, edit, load back) or on the device, the rest teacher-forced, the predictions
after the edit compared with the float reference. Figures are deterministic: asserted
exactly."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import build_bit_config
from sim.app.cli.main import main
from sim.app.quality import evaluate_edit, parse_edit
from sim.runtime.cacheops import round_trip

IDS = np.random.default_rng(5).integers(0, 256, size=300).tolist()
AT = 256
BITS = build_bit_config({})


def run(edit, side: str = "host"):
    return evaluate_edit("tiny", IDS, bits=BITS, hw="tiny", edit=edit, at=AT, side=side)


@pytest.fixture(scope="module")
def kivi2():
    return run("requantize:kivi-2"), run("requantize:kivi-2", "device")


def test_requantization_on_host_and_device_same_quality_device_cheaper(kivi2) -> None:
    host, dev = kivi2
    # the same bytes in the cache after the edit, so the same figures
    assert host.quality == dev.quality and host.unedited == dev.unedited
    q, u = host.quality, host.unedited
    assert (q.first_position, q.tokens, [(b.start, b.end) for b in q.buckets]) == (
        AT, 300, [(256, 299)])
    assert q.kl_mean == pytest.approx(0.003937224106207338, rel=1e-9)
    assert q.top1_agreement == pytest.approx(16 / 43)
    assert u.kl_mean == pytest.approx(0.000251859272674079, rel=1e-9)
    assert q.kl_mean > 10 * u.kl_mean  # the 2-bit grid damages the later predictions
    # the cost: the host moves the whole cache over PCIe both ways, the device none
    assert (host.side, host.time_s, host.pcie_bytes, host.new_cache_size) == (
        "host", pytest.approx(162.514e-6, rel=1e-12), 98304, AT)
    assert (dev.side, dev.time_s, dev.pcie_bytes, dev.dram_bytes) == (
        "device", pytest.approx(88.936e-6, rel=1e-12), 0, 145504)
    assert dev.time_s < host.time_s


def test_more_bits_less_damage(kivi2) -> None:
    four = run("requantize:kivi-4")
    assert four.quality.kl_mean == pytest.approx(0.00043223374961223943, rel=1e-9)
    assert four.unedited.kl_mean < four.quality.kl_mean < kivi2[0].quality.kl_mean
    assert four.quality.top1_agreement > kivi2[0].quality.top1_agreement


def test_a_users_quantize_pack_unpack_dequantize_round_trip() -> None:
    # int8 -> 4-bit codes (scale 16, an assumption of this test) packed two per byte
    def quantize(x):
        return (np.clip(np.rint(x / 16), -8, 7) + 8).astype(np.uint8)

    def pack(q):
        flat = q.reshape(-1)
        return flat[0::2] | (flat[1::2] << 4), q.shape

    def unpack(packed):
        b, shape = packed
        return np.stack([b & 15, b >> 4], axis=1).reshape(shape)

    def dequantize(q):
        return (q.astype(np.int16) - 8) * 16

    r = run(round_trip(quantize, pack, unpack, dequantize))
    assert r.quality.kl_mean == pytest.approx(0.00468759195924732, rel=1e-9)
    # packing is lossless: the same figures as the 4-bit grid applied in place
    def grid(views):
        for v in views:
            v.values[:] = (np.clip(np.rint(v.values / 16), -8, 7) * 16).astype(np.int8)

    assert run(grid).quality == r.quality
    assert (r.pcie_bytes, r.new_cache_size) == (98304, AT)
    with pytest.raises(ConfigError, match="has no device op"):
        run(round_trip(quantize, pack, unpack, dequantize), "device")


def test_eviction_by_score_and_by_positions() -> None:
    score = run("evict:4,32,64")
    assert score.new_cache_size == 100
    assert score.quality.kl_mean == pytest.approx(0.007625518665515968, rel=1e-9)
    host, dev = run("drop:10-49"), run("drop:10-49", "device")
    assert host.quality == dev.quality and host.new_cache_size == dev.new_cache_size == 216
    assert host.quality.kl_mean == pytest.approx(0.004213614012447112, rel=1e-9)
    assert dev.pcie_bytes == 0 < host.pcie_bytes and dev.time_s < host.time_s


@pytest.mark.parametrize(("spec", "needle"), [
    ("requantize:int7", "--edit requantize: unknown KV format 'int7'"),
    ("squash:2", "--edit: unknown edit 'squash'"),
    ("kivi-2", "--edit: 'kivi-2' is not an edit"),
    ("evict:4,32", "--edit: evict takes SINKS,RECENT,BUDGET"),
    ("drop:9-3", "--edit: drop takes FIRST-LAST"),
])
def test_bad_edit_names_are_refused_naming_the_flag(spec, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_edit(spec, where="--edit")


@pytest.mark.parametrize(("kw", "needle"), [
    ({"at": 0}, "at: 0 must be an integer in 1..298"),
    ({"at": 299}, "at: 299 must be"),
    ({"at": 2.5}, "at: 2.5 must be"),
    ({"at": AT, "side": "fpga"}, "side: 'fpga' is not one of host, device"),
    ({"at": AT, "edit": "evict:4,32,64", "side": "device"}, "has no device op"),
])
def test_bad_edit_options_are_refused(kw, needle) -> None:
    kw = {"edit": "requantize:kivi-4", **kw}
    with pytest.raises(ConfigError, match=needle):
        evaluate_edit("tiny", IDS, bits=BITS, hw="tiny", **kw)


@pytest.mark.parametrize(("args", "needle"), [
    (["--edit", "requantize:kivi-9", "--edit-at", "20"], "--edit requantize: unknown KV"),
    (["--edit", "requantize:kivi-2"], "--edit and --edit-at go together"),
    (["--edit", "requantize:kivi-2", "--edit-at", "900", "--max-tokens", "32"],
     "--edit-at: must lie in 1..30"),
])
def test_kvsim_eval_edit_flags_are_checked(args, needle, capsys) -> None:
    assert main(["eval", *args]) == 2
    assert needle in capsys.readouterr().err


def test_an_edit_the_device_cannot_do_is_refused_before_any_run(monkeypatch) -> None:
    import sim.app.quality as quality
    from sim.runtime.cacheops import CacheOpError

    def too_big(cm) -> None:
        raise CacheOpError("kivi-4.k: a region exceeds the scratch area")

    def no_run(*args, **kwargs):
        raise AssertionError("simulated before the device check")

    monkeypatch.setattr(quality, "edited_logits", no_run)
    edit = quality.CacheEdit("requantize:kivi-4", parse_edit("requantize:kivi-4").host,
                             lambda m, n: None, too_big)
    with pytest.raises(CacheOpError, match="exceeds the scratch area"):
        run(edit, "device")
