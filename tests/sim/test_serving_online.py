"""Online serving (requests submitted as they arrive, chips stepped by the caller): the same
schedule as the offline discrete-event engine for the same arrivals; arrivals during a step
join at the next boundary; early leavers free their blocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.blocks import simple_geometry
from sim.serving.engine import ServingSim
from sim.serving.online import OnlineServing, replay
from sim.serving.scheduler import Request, SchedulerConfig

STEP_PS = 1000  # toy costs in whole nanoseconds: every step boundary is an arrival time
TOKEN_PS = 1000  # plus a multiple of 1,000 ps


def toy_cost(seqs) -> int:
    return STEP_PS + TOKEN_PS * sum(s.tokens for s in seqs)


def swap_cost(direction: str, nbytes: int) -> int:
    return 1000 * (1 + nbytes)


def _kw(*, blocks=6, mode="recompute", chips=1, router="round_robin", budget=8, seqs=4):
    return dict(chips=chips, router=router, step_cost=toy_cost, swap_cost=swap_cost,
                geometry=simple_geometry(block_tokens=4, num_blocks=blocks, max_tokens=256,
                                         block_bytes=100),
                scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                          preemption=mode))


def _requests(rows):
    return [Request(i, a, prompt_tokens=p, output_tokens=o) for i, (a, p, o) in enumerate(rows)]


def _steps(chips):
    return [[(s.index, s.start_ps, s.end_ps, s.items, s.preempted, s.swapped_in, s.used_blocks)
             for s in c.steps] for c in chips]


@settings(max_examples=60)
@given(rows=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 14), st.integers(1, 6)),
                     min_size=1, max_size=24),
       mode=st.sampled_from(["recompute", "swap"]), chips=st.integers(1, 3),
       router=st.sampled_from(["round_robin", "least_loaded"]), blocks=st.integers(5, 12),
       budget=st.integers(2, 16))
def test_online_gives_the_offline_schedule(rows, mode, chips, router, blocks, budget):
    # arrival of request j at 1,000 * k + j ps: no arrival falls on a step boundary (each
    # is an earlier arrival plus whole nanoseconds), where the offline engine's order of
    # simultaneous events would decide
    rows = sorted(rows, key=lambda r: r[0])
    rows = [(1000 * k + j, p, o) for j, (k, p, o) in enumerate(rows)]
    kw = _kw(blocks=blocks, mode=mode, chips=chips, router=router, budget=budget)
    offline = _requests(rows)
    sim = ServingSim(offline, **kw)
    sim.run()
    online_reqs = _requests(rows)
    online = OnlineServing(**kw)
    replay(online_reqs, online)
    assert _steps(online.chips) == _steps(sim.chips)
    for a, b in zip(offline, online_reqs, strict=True):
        assert (b.chip, b.token_ps, b.finish_ps, b.preemptions, b.recomputed_tokens) == (
            a.chip, a.token_ps, a.finish_ps, a.preemptions, a.recomputed_tokens)
        assert b.state == "finished"


def test_an_arrival_during_a_step_joins_at_the_next_boundary():
    online = OnlineServing(**_kw(budget=16))
    chip = online.chips[0]
    a = Request(0, 500, prompt_tokens=4, output_tokens=3)
    online.submit(a, chip)
    s0 = online.step(chip)  # the idle chip's clock moves to the arrival
    assert (s0.start_ps, s0.end_ps, s0.record.items) == (500, 500 + 5000, ((0, 4),))
    assert s0.sampled == [a] and chip.clock_ps == 500  # in flight until reached
    b = Request(1, 2000, prompt_tokens=4, output_tokens=1)  # arrives during step 0
    online.submit(b, chip)
    with pytest.raises(RuntimeError, match="not reached"):
        online.step(chip)
    online.reach(chip)
    s1 = online.step(chip)
    assert (s1.start_ps, s1.record.items) == (5500, ((0, 1), (1, 4)))
    assert s1.sampled == [a, b] and s1.finished == [b]
    assert b.token_ps == [5500 + 6000] and b.first_token_ps - b.arrival_ps == 9500
    with pytest.raises(ValueError, match="before chip 0's clock"):
        online.submit(Request(2, 100, prompt_tokens=1, output_tokens=1), chip)


def test_abort_frees_blocks_and_the_others_go_on():
    # 3 requests of 6 + 4 tokens on 6 blocks of 4 tokens: r1 stops after its first token
    # (a stop sequence), so nobody is preempted; r2, not yet admitted, is cancelled
    online = OnlineServing(**_kw(budget=8))
    chip = online.chips[0]
    r = [Request(i, 0, prompt_tokens=6, output_tokens=4) for i in range(3)]
    for q in r[:2]:
        online.submit(q, chip)
    online.submit(r[2], chip)
    s0 = online.step(chip)
    assert s0.record.items == ((0, 6), (1, 2)) and s0.sampled == [r[0]]
    online.reach(chip)
    s1 = online.step(chip)
    assert s1.record.items == ((0, 1), (1, 4), (2, 3)) and s1.sampled == [r[0], r[1]]
    online.abort(r[1], s1.end_ps)  # its first token ended it
    assert (r[1].state, r[1].output_tokens, r[1].blocks, r[1].finish_ps) == (
        "finished", 1, 0, s1.end_ps)
    online.reach(chip)
    online.abort(r[2], chip.clock_ps)  # its client went away while it prefilled
    assert chip.scheduler.used_blocks == r[0].blocks == 2
    while (s := online.step(chip)) is not None:
        assert s.record.preempted == ()
        online.reach(chip)
    assert r[0].generated == 4 and chip.scheduler.free == 6 and chip.scheduler.unfinished == 0
    late = Request(3, chip.clock_ps, prompt_tokens=2, output_tokens=2)
    online.submit(late, chip)
    online.abort(late, chip.clock_ps)  # cancelled in the inbox: it never ran
    assert online.step(chip) is None and late.state == "finished" and late.token_ps == []


def test_submit_refuses_what_the_pool_cannot_hold():
    online = OnlineServing(**_kw(blocks=3))
    assert online.fits(8, 5) and not online.fits(8, 6)
    with pytest.raises(ValueError, match="more KV blocks than the chip has"):
        online.submit(Request(0, 0, prompt_tokens=8, output_tokens=6), online.route())
    assert online.requests == []
