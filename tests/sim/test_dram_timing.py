"""Formula tests of the DRAM protocol model (sim/device/dram/timing.py) on LPDDR4X: each figure
against a hand calculation from the timing parameters, as Ramulator's tests check unloaded
latency and peak throughput against theory. aries: 4167 MT/s, tCK = 2 / 4167e6 s = 0.47996 ns."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.errors import ConfigError
from sim.device.dram.patterns import (
    AccessPattern,
    closed_form_efficiency,
    protocol_summary,
    refresh_loss,
    refresh_stall_ck,
    stream_efficiency,
)
from sim.device.dram.timing import (
    ChannelState,
    chunk_channels_ck,
    chunk_channels_ck_reference,
    chunk_time_ps,
    timing_from_config,
)
from sim.device.hw import load_hardware
from sim.units import KiB, MiB

TCK_PS = 2e6 / 4167.0


def _hw(**overrides):
    """aries with the JEDEC-ideal schedule (no row interference between masters: the
    formulas below are those of one stream alone) and ``overrides``."""
    return load_hardware("aries", {"dram.timing.row_run_bytes": None, **overrides})


def _timing(**overrides):
    return timing_from_config(_hw(**{f"dram.timing.{k}": v for k, v in overrides.items()}).dram)


def _ps(cycles: int) -> int:
    return math.ceil(cycles * TCK_PS - 1e-6)


def test_timing_rounds_up_to_whole_cycles_and_trefi_down():
    t = _timing()
    assert t.tck_ps == pytest.approx(479.9616, abs=1e-4)
    # ceil(ns / 0.47996): 18 -> 37.5 -> 38, 21 -> 43.75 -> 44, 42 -> 87.5 -> 88, 10 -> 20.8
    # -> 21, 40 -> 83.3 -> 84, 7.5 -> 15.6 -> 16, 380 -> 791.7 -> 792; tREFI floor(8133.9)
    assert (t.rcd_ck, t.rp_pb_ck, t.rp_ab_ck, t.ras_ck, t.rrd_ck, t.faw_ck) == (
        38, 38, 44, 88, 21, 84)
    n = t.named  # LPDDR4X's own values, by their JEDEC names
    assert (n["tWR"], n["tWTR"], n["tRTP"], t.rfc_ab_ck, t.refi_ck, n["tDQSCK(max)"]) == (
        38, 21, 16, 792, 8133, 8)
    assert (t.ccd_ck, t.burst_bytes, t.bytes_per_ck) == (8, 32, 4.0)
    # peak of one x16 channel: 2 B x 4167 MT/s
    assert t.channel_peak_bytes_per_s == pytest.approx(2 * 4167e6)
    # turnarounds (JESD209-4): RD->WR = RL + tDQSCK + BL/2 - WL + tWPRE = 36 + 8 + 8 - 18 + 2;
    # WR->RD = WL + 1 + BL/2 + tWTR = 18 + 1 + 8 + 21; RD->PRE = tRTP; WR->PRE = WL+BL/2+1+tWR
    assert (t.read_to_write_ck, t.write_to_read_ck) == (36, 48)
    assert (t.read_to_precharge_ck, t.write_to_precharge_ck) == (16, 18 + 8 + 1 + 38)


def test_unloaded_read_latency_is_trcd_plus_rl_plus_one_burst():
    t = _timing()
    s = ChannelState.fresh(t)
    # ACT at 0, READ at tRCD, data done RL + BL/2 later
    assert chunk_time_ps(s, 0, 32, False, 0, t) == _ps(38 + 36 + 8)
    # a row hit arriving then: READ at once (bus and tRCD long free)
    t0 = _ps(82)
    assert chunk_time_ps(s, 32, 32, False, t0, t) == _ps(82 + 36 + 8)


def test_a_dma_chunk_streams_its_rows_back_to_back():
    t = _timing()
    s = ChannelState.fresh(t)
    # 64 KiB = 8 KiB per channel = 4 rows (banks 0..3) of 64 bursts; ACTs at 0, 21, 42, 63
    # hide behind the data: first READ at tRCD, 256 READs tCCD apart, data RL + BL/2 after
    assert chunk_time_ps(s, 0, 64 * KiB, False, 0, t) == _ps(38 + 255 * 8 + 36 + 8)
    # the next chunk continues on the bus (rows of banks 4..7 long open)
    assert chunk_time_ps(s, 64 * KiB, 64 * KiB, False, 0, t) == _ps(38 + 511 * 8 + 36 + 8)


def test_row_miss_in_the_same_bank_waits_tras_then_trp():
    t = _timing()
    s = ChannelState.fresh(t)
    chunk_time_ps(s, 0, 32, False, 0, t)
    # 16 KiB per channel further (one page x 8 banks) x 8 channels: channel 0, bank 0, row 1
    # PRE at max(tRAS, tRCD + tRTP) = 88, ACT at 88 + tRPpb = 126 (= tRC), READ at 164
    assert chunk_time_ps(s, 128 * KiB, 32, False, 0, t) == _ps(126 + 38 + 36 + 8)


def test_activations_to_other_banks_are_spaced_by_trrd_and_tfaw():
    t = _timing(tfaw_ns=60.0)  # 125.01 -> 126 cycles: tFAW binds beyond 4 x tRRD = 84
    assert t.faw_ck == 126
    s = ChannelState.fresh(t)
    ends = [chunk_time_ps(s, k * 16 * KiB, 32, False, 0, t) for k in range(5)]
    # banks 0..4 of channel 0: ACT at 0, 21, 42, 63, then max(84, 0 + tFAW) = 126
    assert ends == [_ps(a + 38 + 36 + 8) for a in (0, 21, 42, 63, 126)]


def test_read_write_turnaround():
    t = _timing()
    s = ChannelState.fresh(t)
    assert chunk_time_ps(s, 0, 32, False, 0, t) == _ps(38 + 44)
    # WRITE in the open row: at READ + RD->WR = 38 + 36, done WL + 1 + BL/2 later
    assert chunk_time_ps(s, 32, 32, True, 0, t) == _ps(74 + 18 + 1 + 8)
    # READ again: at WRITE + WR->RD = 74 + 48
    assert chunk_time_ps(s, 64, 32, False, 0, t) == _ps(122 + 44)


def test_refresh_blocks_the_channel_and_idle_refreshes_cost_nothing():
    t = _timing()
    s = ChannelState.fresh(t)
    # arriving when the first refresh is due: PREA at tREFI, REF at +tRPab, ACT at +tRFCab
    assert chunk_time_ps(s, 0, 32, False, _ps(8133), t) == _ps(8133 + 44 + 792 + 82)
    s = ChannelState.fresh(t)
    # three refreshes done while idle: no wait, only the rows are closed
    t0 = 3 * 8133 + 5000
    assert chunk_time_ps(s, 0, 32, False, _ps(t0), t) == _ps(t0 + 82)


def test_refresh_only_loss_is_trfcab_over_trefi():
    t = _timing()
    assert refresh_loss(t) == 792 / 8133
    # with closing and reopening free (tRTP within the burst, tRPab = tRCD = 0), a long
    # sequential stream loses exactly the refresh
    free = _timing(trtp_ns=0.0, trp_ab_ns=0.0, trcd_ns=0.0)
    seq = AccessPattern("s", "", "sequential")
    assert refresh_stall_ck(free) == 792
    assert closed_form_efficiency(seq, free) == pytest.approx(1 - 792 / 8133, abs=1e-15)
    # the per-chunk model over 8 MiB (1 MiB = 262,144 cycles of data per channel) is off by
    # at most one refresh stall over the stream's length
    assert stream_efficiency(seq, free) == pytest.approx(1 - 792 / 8133, abs=792 / 262144)


def test_lone_sequential_stream_is_peak_times_refresh_times_page_open_overhead():
    t = _timing()
    seq = AccessPattern("s", "", "sequential")
    # per tREFI: refresh (tRFCab), and around it: close (tRTP - BL/2 after the last data),
    # precharge-all (tRPab), reopen (tRCD); activations of the next rows hide behind the
    # 512 cycles of data of each 2 KiB row
    page_open = 1 - (16 - 8 + 44 + 38) / (8133 - 792)
    hand = (1 - 792 / 8133) * page_open
    assert hand == pytest.approx(1 - 882 / 8133, abs=1e-15)
    assert closed_form_efficiency(seq, t) == pytest.approx(hand, abs=1e-15)
    assert stream_efficiency(seq, t) == pytest.approx(hand, abs=882 / 262144)


def test_page_miss_bound_records_in_one_bank_are_trc_bound():
    t = _timing()
    # 64 B (2 bursts) every 256 KiB: same channel, same bank, a new row each time
    kv = AccessPattern("kv", "", "records", record_bytes=64, stride_bytes=256 * KiB,
                       total_bytes=128 * KiB)
    cycle = max(88, 38 + 8 + 16) + 38  # ACT -> PRE (tRAS), + tRPpb: 126 = tRC
    stall = 88 + 44 + 792 - cycle  # the precharge-all replaces one tRPpb
    hand = (1 - stall / 8133) * 64 / (4 * cycle)
    assert closed_form_efficiency(kv, t) == pytest.approx(hand, abs=1e-15)
    # 2,048 records = 258,048 cycles: off by at most one stall over that
    assert stream_efficiency(kv, t) == pytest.approx(hand, abs=stall / 258048)
    # written: the row stays open to WL + BL/2 + 1 + tWR after the last WRITE
    kvw = AccessPattern("kvw", "", "records", write=True, record_bytes=64,
                        stride_bytes=256 * KiB, total_bytes=128 * KiB)
    act_pre = 38 + 8 + 18 + 8 + 1 + 38  # 111 > tRAS
    hand_w = (1 - (act_pre + 44 + 792 - (act_pre + 38)) / 8133) * 64 / (4 * (act_pre + 38))
    assert closed_form_efficiency(kvw, t) == pytest.approx(hand_w, abs=1e-15)


def test_page_miss_bound_records_over_all_banks_are_trrd_tfaw_bound():
    t = _timing()
    # 64 B every 16 KiB: channel 0, one page further each time, so banks 0..7 in turn;
    # an ACT every max(tRRD, tFAW / 4, tRC / 8) = max(21, 21, 15.75) cycles, 16 of data
    rec = AccessPattern("r", "", "records", record_bytes=64, stride_bytes=16 * KiB,
                        total_bytes=1 * MiB)
    cycle = max(2 * 8, 21, 84 / 4, 126 / 8)
    stall = 88 + 44 + 792 - cycle
    hand = (1 - stall / 8133) * 64 / (4 * cycle)
    assert closed_form_efficiency(rec, t) == pytest.approx(hand, abs=1e-15)
    assert stream_efficiency(rec, t) == pytest.approx(hand, abs=stall / (16384 * 21))


def test_read_write_alternation_costs_both_turnarounds_per_pair():
    t = _timing()
    # 16 KiB per direction: 2 KiB = 64 bursts = 512 cycles per channel each way
    mixed = AccessPattern("m", "", "mixed", switch_bytes=16 * KiB)
    data = 2 * 512
    turn = (36 - 8) + (48 - 8)
    hand = (1 - 882 / 8133) * data / (data + turn)
    assert closed_form_efficiency(mixed, t) == pytest.approx(hand, abs=1e-15)
    assert stream_efficiency(mixed, t) == pytest.approx(hand, abs=882 / 262144 + 1e-3)


def test_summary_lists_every_pattern_and_says_which_model_the_engine_uses():
    s = protocol_summary(_hw().dram)
    names = [p.name for p in s.patterns]
    assert names == ["weight_stream", "kv_token_read", "kv_token_append", "activation_store",
                     "mixed_rw"]
    js = s.to_json()
    assert js["model"] == "protocol" and "times every DMA chunk" in js["note"]
    off = protocol_summary(_hw(**{"dram.model": "efficiency"}).dram).to_json()
    assert off["model"] == "efficiency" and "dram.efficiency of peak" in off["note"]
    assert js["sustained_efficiency"]["weight_stream"] == pytest.approx(1 - 882 / 8133,
                                                                        abs=882 / 262144)


def test_a_preset_without_timing_is_named_and_bad_timing_is_rejected():
    with pytest.raises(ValueError, match=r"dram\.timing"):
        timing_from_config(load_hardware("tiny").dram)
    with pytest.raises(ConfigError, match="trefi_ns"):
        load_hardware("aries", {"dram.timing.trefi_ns": 300.0})
    with pytest.raises(ConfigError, match="page_bytes"):
        load_hardware("aries", {"dram.timing.page_bytes": 1000})
    with pytest.raises(ConfigError, match="burst_length"):
        load_hardware("aries", {"dram.timing.burst_length": 8})
    with pytest.raises(ValueError, match="nbytes"):
        t = _timing()
        chunk_time_ps(ChannelState.fresh(t), 0, -1, False, 0, t)


# --- the per-channel run step against the per-piece reference -----------------------------

def _run_both(t, accesses, start=None):
    """Each access ``(addr, nbytes, write, t0_ck)`` through :data:`chunk_channels_ck` and
    :data:`chunk_channels_ck_reference` on states of their own (copies of ``start``, fresh by
    default); asserts after every access that the end cycle, the per-channel report and
    every state array agree, and returns how many accesses had a refresh fall inside them
    (after their first column command)."""
    start = start or ChannelState.fresh(t)
    fast, ref = (ChannelState(**{k: v.copy() for k, v in vars(start).items()})
                 for _ in range(2))
    refreshed_inside = 0
    fields = ("open_row", "act_ok", "pre_ok", "cas_ok", "faw", "scalars", "next_ref")
    for k, (addr, nbytes, write, t0) in enumerate(accesses):
        due = ref.next_ref.copy()
        ends = [fn(t.vector, s.open_row, s.act_ok, s.pre_ok, s.cas_ok, s.faw, s.scalars,
                   s.next_ref, addr, nbytes, write, t0, s.per_channel)
                for fn, s in ((chunk_channels_ck, fast), (chunk_channels_ck_reference, ref))]
        assert ends[0] == ends[1], (k, addr, nbytes, write)
        for name in fields:
            assert np.array_equal(getattr(fast, name), getattr(ref, name)), (k, name)
        moved = ref.per_channel[:, 0] > 0
        assert np.array_equal(fast.per_channel[:, 0], ref.per_channel[:, 0]), k
        assert np.array_equal(fast.per_channel[moved], ref.per_channel[moved]), k
        refreshed_inside += int(np.any(moved & (ref.next_ref > due)
                                       & (ref.per_channel[:, 1] < due)))
    return refreshed_inside


def _random_accesses(seed, n, span_bytes, gap_ck):
    rng = np.random.default_rng(seed)
    t0 = 0
    out = []
    for k in range(n):
        t0 += int(rng.integers(0, gap_ck))
        if k % 4 == 0:  # a DMA chunk: up to 64 KiB, often granule-aligned
            nbytes = int(rng.integers(1, 64 * KiB + 1))
        else:  # a record: a few bytes to a few granules
            nbytes = int(rng.integers(1, 1200))
        addr = int(rng.integers(0, span_bytes))
        if rng.random() < 0.5:
            addr -= addr % 256
        out.append((addr, nbytes, bool(rng.random() < 0.4), t0))
    return out


def _random_state(t, rng, base_ck):
    """A channel state no stream need have left: open rows, bank timers, the ACTIVATE ring,
    bus, last column command and its direction and the refresh phase drawn around
    ``base_ck`` (both steps must agree from any state, not only from reachable ones)."""
    c, b = t.channels, t.banks
    around = lambda lo, hi, shape: base_ck + rng.integers(lo, hi, shape)  # noqa: E731
    scalars = np.stack([rng.integers(0, 4, c), around(-150, 60, c), around(-300, 500, c),
                        around(-200, 100, c), rng.integers(-1, 2, c)], axis=1)
    return ChannelState(open_row=rng.integers(-1, 40, (c, b)), act_ok=around(-400, 300, (c, b)),
                        pre_ok=around(-400, 300, (c, b)), cas_ok=around(-400, 300, (c, b)),
                        faw=around(-300, 60, (c, 4)), scalars=scalars.astype(np.int64),
                        next_ref=around(1, t.refi_ck, c), per_channel=np.zeros((c, 3), np.int64))


def _variant(name):
    t = timing_from_config(load_hardware("aries").dram)
    return {"aries": t, "jedec_ideal": _timing(),
            "bank_xor": dataclasses.replace(t, bank_xor=True),
            "short_trefi": dataclasses.replace(t, refi_ck=1500, rfc_ab_ck=200),
            "odd_granule": dataclasses.replace(t, granule_bytes=80, run_bytes=600,
                                               refi_ck=3000)}[name]


_VARIANTS = ["aries", "jedec_ideal", "bank_xor", "short_trefi", "odd_granule"]


@pytest.mark.parametrize("variant", _VARIANTS)
def test_channel_runs_equal_the_per_piece_reference(variant):
    """Random address/size/direction streams, arriving bunched and spread out: the same end
    cycles, per-channel reports and bank state as the per-piece loop, including row-run
    reopens (aries' 704 B runs), XOR-hashed banks, refreshes falling inside a chunk and
    granules that do not hold whole bursts."""
    t = _variant(variant)
    accesses = _random_accesses(7, 1500, 4 * MiB, 4000)
    # and a sequential stream back to back, the decode's weight stream
    accesses += [(8 * MiB + k * 64 * KiB, 64 * KiB, False, accesses[-1][3]) for k in range(64)]
    assert _run_both(t, accesses) > 0  # refreshes did fall inside chunks


@pytest.mark.parametrize("variant", _VARIANTS)
def test_long_streams_from_random_channel_states_equal_the_reference(variant):
    """Chunks of up to 1 MiB (dozens of whole rows per channel, so a row run's granule pieces
    go in one step) and short records, from channel states drawn at random: the same end
    cycles, reports and bank state as the per-piece loop, refreshes falling inside included."""
    refreshed = 0
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        t = _variant(variant)
        start = _random_state(t, rng, 20_000)
        t0, accesses = 20_000 + int(rng.integers(-500, 500)), []
        for k in range(40):
            t0 += int(rng.integers(0, 6000))
            long = k % 3 != 2
            nbytes = int(rng.integers(64 * KiB, MiB + 1) if long else rng.integers(1, 3000))
            addr = int(rng.integers(0, 64 * MiB))
            if rng.random() < 0.7:
                addr -= addr % 256
            accesses.append((addr, nbytes, bool(rng.random() < 0.3), t0))
        refreshed += _run_both(t, accesses, start)
    assert refreshed > 0


@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 20000), st.booleans(),
                          st.integers(0, 3000)), min_size=1, max_size=40),
       st.booleans(), st.sampled_from([0, 256, 704]), st.none() | st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_channel_runs_equal_the_reference_on_any_stream(steps, xor, run, state_seed):
    t = dataclasses.replace(timing_from_config(load_hardware("aries").dram), bank_xor=xor,
                            run_bytes=run or 2048, refi_ck=2500)
    start = (None if state_seed is None
             else _random_state(t, np.random.default_rng(state_seed), 1000))
    t0 = 0 if start is None else 1000
    accesses = []
    for addr, nbytes, write, gap in steps:
        t0 += gap
        accesses.append((addr, nbytes, write, t0))
    _run_both(t, accesses, start)


# --- whole rows in closed form against the per-piece reference ------------------------------

def test_rows_in_closed_form_only_where_the_proof_holds():
    t = _variant("aries")
    assert t.pages_in_closed_form(False) and t.pages_in_closed_form(True)
    assert not _variant("odd_granule").pages_in_closed_form(False)  # granules split bursts
    # tRAS past a run's close, or tFAW past its PRECHARGE: the row steps run by run instead
    long_ras = dataclasses.replace(t, ras_ck=400)
    long_faw = dataclasses.replace(t, faw_ck=400)
    assert not long_ras.pages_in_closed_form(False)
    assert not long_faw.pages_in_closed_form(True)
    # a 2-burst run: READ-to-PRECHARGE (16) + tRCD + one tCCD is under tRAS (88)
    assert not dataclasses.replace(t, run_bytes=64).pages_in_closed_form(False)


@pytest.mark.parametrize("variant", ["aries", "short_trefi", "bank_xor", "long_ras", "long_faw",
                                     "tiny_runs", "one_run_rows"])
def test_sequential_streams_in_closed_form_equal_the_reference(variant):
    """The decode's weight stream (chunks back to back over whole rows), read and write,
    with records in other banks closing rows between them, refreshes falling inside rows
    (short tREFI), partial first and last rows, chunks arriving late (an idle bus) and
    presets where the closed form does not hold (the fallback): the same end cycles, reports
    and bank state as the per-piece loop, from fresh and from drawn states."""
    base = timing_from_config(load_hardware("aries").dram)
    t = {"long_ras": dataclasses.replace(base, ras_ck=400),
         "long_faw": dataclasses.replace(base, faw_ck=400, refi_ck=2000),
         "tiny_runs": dataclasses.replace(base, run_bytes=96, refi_ck=1200, rfc_ab_ck=100),
         "one_run_rows": dataclasses.replace(base, run_bytes=0, refi_ck=3000)}.get(
        variant) or _variant(variant)
    refreshed = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        accesses, t0, addr = [], 0, int(rng.integers(0, 64)) * 256
        for k in range(120):
            t0 += int(rng.integers(0, 3000 if k % 7 == 0 else 200))
            if k % 5 == 4:  # a record elsewhere, of the other direction now and then
                accesses.append((int(rng.integers(0, 1 << 24)), int(rng.integers(1, 900)),
                                 bool(rng.random() < 0.5), t0))
                continue
            nbytes = int(rng.choice([57344, 53504, 28672, 4864, 65536 + 96]))
            accesses.append((addr, nbytes, seed % 2 == 1, t0))
            addr += nbytes
        start = None if seed < 2 else _random_state(t, rng, 1000)
        if start is not None:
            accesses = [(a, n, wr, t0 + 1000) for a, n, wr, t0 in accesses]
        refreshed += _run_both(t, accesses, start)
    assert refreshed > 0
