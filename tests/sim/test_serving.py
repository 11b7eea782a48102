"""Serving: the scheduler's exact schedule (vLLM semantics) in recompute and swap modes, no
request lost or duplicated, routers, workloads, KV block geometry."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa import kvformats
from sim.app.serve.run import serving_metrics, step_shape
from sim.serving.blocks import simple_geometry, steady_bytes_per_token
from sim.serving.engine import ServingSim
from sim.serving.scheduler import Request, SchedulerConfig
from sim.serving.workload import LengthDist, WorkloadSpec, make_requests, read_trace

STEP_PS = 1000  # toy step cost: fixed part
TOKEN_PS = 10  # and per token


def toy_cost(seqs) -> int:
    return STEP_PS + TOKEN_PS * sum(s.tokens for s in seqs)


def swap_cost(direction: str, nbytes: int) -> int:
    return 500 + nbytes  # 1 ps per byte after a 500 ps set-up


def _run(reqs, *, blocks=6, block_tokens=4, budget=8, seqs=4, mode="recompute", chips=1,
         router="round_robin", block_bytes=100):
    geo = simple_geometry(block_tokens=block_tokens, num_blocks=blocks, max_tokens=256,
                          block_bytes=block_bytes)
    sim = ServingSim(reqs, chips=chips, geometry=geo, step_cost=toy_cost,
                     swap_cost=swap_cost, router=router,
                     scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                               preemption=mode))
    sim.run()
    return sim


def _log(sim, chip=0):
    return [(s.index, s.items, s.preempted, s.swapped_in, s.start_ps, s.end_ps)
            for s in sim.chips[chip].steps]


def _three():
    return [Request(i, 0, prompt_tokens=6, output_tokens=4) for i in range(3)]


def test_recompute_schedule_is_exact():
    # 6 blocks of 4 tokens, a budget of 8 tokens per step, 3 requests of 6 + 4 tokens
    reqs = _three()
    sim = _run(reqs)
    assert _log(sim) == [
        # step, (rid, tokens) in scheduling order, preempted, swapped in, start, end
        (0, ((0, 6), (1, 2)), (), (), 0, 1080),  # r0 whole prompt, r1 first chunk
        (1, ((0, 1), (1, 4), (2, 3)), (), (), 1080, 2160),
        (2, ((0, 1), (1, 1), (2, 3)), (), (), 2160, 3210),  # 6 blocks in use
        # r0 needs its 3rd block: r2, the most recently admitted, is preempted
        (3, ((0, 1), (1, 1)), (2,), (), 3210, 4230),
        # r0 done: r2 is readmitted and prefills all it knows (6 + 1 tokens) again
        (4, ((1, 1), (2, 7)), (), (), 4230, 5310),
        (5, ((2, 1),), (), (), 5310, 6320),
        (6, ((2, 1),), (), (), 6320, 7330),
    ]
    r0, r1, r2 = reqs
    assert [r.token_ps for r in reqs] == [[1080, 2160, 3210, 4230],
                                          [2160, 3210, 4230, 5310],
                                          [3210, 5310, 6320, 7330]]
    assert (r2.preemptions, r2.recomputed_tokens, r2.prompt_computed, r2.decode_computed) == (
        1, 6, 6, 3)
    assert all(r.generated == r.output_tokens == 4 and r.state == "finished" for r in reqs)
    m = serving_metrics(reqs, [sim.chips[0].steps], sim.chips[0].scheduler.geo)
    assert (m.num_preemptions, m.recomputed_tokens) == (1, 6)
    # work done: every computed token is a prompt token, a decode token or a recomputation
    assert m.computed_tokens == 3 * (6 + 3) + 6 == m.prefill_tokens + m.decode_tokens_computed
    assert m.duration_s == 7330e-12
    assert m.ttft_s_p50 == 2160e-12


def test_swap_schedule_is_exact_and_costs_the_link():
    reqs = _three()
    sim = _run(reqs, mode="swap")
    swap = 500 + 2 * 100  # r2's 2 blocks of 100 bytes, out then back in
    assert _log(sim) == [
        (0, ((0, 6), (1, 2)), (), (), 0, 1080),
        (1, ((0, 1), (1, 4), (2, 3)), (), (), 1080, 2160),
        (2, ((0, 1), (1, 1), (2, 3)), (), (), 2160, 3210),
        (3, ((0, 1), (1, 1)), (2,), (), 3210, 3210 + swap + 1020),  # r2 swapped out
        # r2 comes back with its 6 cached tokens and decodes: nothing is recomputed
        (4, ((1, 1), (2, 1)), (), (2,), 4930, 4930 + swap + 1020),
        (5, ((2, 1),), (), (), 6650, 7660),
        (6, ((2, 1),), (), (), 7660, 8670),
    ]
    r2 = reqs[2]
    assert (r2.preemptions, r2.recomputed_tokens) == (1, 0)
    assert (r2.swapped_out_bytes, r2.swapped_in_bytes) == (200, 200)
    assert [s.swap_ps for s in sim.chips[0].steps] == [0, 0, 0, swap, swap, 0, 0]
    assert all(r.generated == 4 for r in reqs)


def test_a_request_that_cannot_grow_preempts_itself():
    reqs = [Request(0, 0, prompt_tokens=8, output_tokens=3),
            Request(1, 0, prompt_tokens=4, output_tokens=6)]
    sim = _run(reqs, blocks=4, budget=12)
    assert [(s.index, s.items, s.preempted) for s in sim.chips[0].steps] == [
        (0, ((0, 8), (1, 4)), ()),
        (1, ((0, 1),), (1,)),  # r1 needs a block, none is free, and r1 is the newest
        (2, ((0, 1),), ()),  # r1's 5 tokens need 2 blocks; 1 is free
        (3, ((1, 5),), ()),
        (4, ((1, 1),), ()), (5, ((1, 1),), ()), (6, ((1, 1),), ()), (7, ((1, 1),), ()),
    ]
    r1 = reqs[1]
    assert (r1.recomputed_tokens, r1.prompt_computed, r1.decode_computed) == (4, 4, 5)
    assert r1.generated == 6


def test_limits_max_num_seqs_and_whole_prompts_without_chunking():
    reqs = [Request(i, 0, prompt_tokens=5, output_tokens=2) for i in range(3)]
    geo = simple_geometry(block_tokens=4, num_blocks=100, max_tokens=64)
    sim = ServingSim(reqs, chips=1, geometry=geo, step_cost=toy_cost,
                     scheduler=SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=8,
                                               chunked_prefill=False))
    sim.run()
    assert [s.items for s in sim.chips[0].steps] == [
        ((0, 5),),  # r1's 5 tokens do not fit the 3 left of the budget: no chunking
        ((0, 1), (1, 5)),
        ((1, 1), (2, 5)),  # r0 finished: a seat frees up
        ((2, 1),),
    ]


def test_requests_arriving_during_a_step_wait_for_the_next():
    reqs = [Request(0, 0, 4, 3), Request(1, 500, 4, 2)]
    sim = _run(reqs, blocks=20, budget=16)
    assert [(s.start_ps, s.items) for s in sim.chips[0].steps] == [
        (0, ((0, 4),)), (1040, ((0, 1), (1, 4))), (2090, ((0, 1), (1, 1)))]
    assert reqs[1].first_token_ps - reqs[1].arrival_ps == 2090 - 500


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 10_000),
       mode=st.sampled_from(["recompute", "swap"]), chips=st.integers(1, 3),
       router=st.sampled_from(["round_robin", "least_loaded"]),
       blocks=st.integers(12, 40), budget=st.integers(4, 40))
def test_no_request_is_lost_or_duplicated(n, seed, mode, chips, router, blocks, budget):
    spec = WorkloadSpec(requests=n, seed=seed, arrival="poisson", rate_per_s=1e9,
                        prompt_tokens=LengthDist(dist="uniform", min=1, max=20),
                        output_tokens=LengthDist(dist="uniform", min=1, max=15))
    reqs = make_requests(spec)
    sim = _run(reqs, blocks=blocks, budget=budget, mode=mode, chips=chips, router=router)
    seen: dict[int, int] = {}
    for chip in sim.chips:
        for s in chip.steps:
            rids = [rid for rid, _ in s.items]
            assert len(rids) == len(set(rids))  # at most once per step
            for rid, k in s.items:
                seen[rid] = seen.get(rid, 0) + k
        assert chip.scheduler.free == chip.scheduler.geo.num_blocks  # every block back
    for r in reqs:
        assert r.state == "finished" and r.generated == r.output_tokens
        assert len(r.token_ps) == r.output_tokens == len(set(r.token_ps))
        # computed exactly its prompt, its tokens but the last, and what it recomputed
        assert seen[r.rid] == r.prompt_tokens + r.output_tokens - 1 + r.recomputed_tokens
        assert r.chip in range(chips)
        if mode == "swap":
            assert r.recomputed_tokens == 0
            assert r.swapped_out_bytes == r.swapped_in_bytes
    every = [s for c in sim.chips for s in c.steps]
    prompts = {r.rid: r.prompt_tokens for r in reqs}
    for s in every[:: max(1, len(every) // 5)]:  # the step records replay the batch
        shape = step_shape(s, every, prompts)
        assert sorted((q.key - 1, q.tokens) for q in shape) == sorted(s.items)


def test_routers():
    reqs = [Request(i, 0, 4, 2) for i in range(7)]
    sim = _run(reqs, chips=3, blocks=50)
    assert [r.chip for r in reqs] == [0, 1, 2, 0, 1, 2, 0]
    # least loaded: a chip whose requests are done gets the next one
    reqs = [Request(0, 0, 4, 50), Request(1, 0, 4, 2), Request(2, 10_000, 4, 2),
            Request(3, 10_000, 4, 2)]
    sim = _run(reqs, chips=2, blocks=50, router="least_loaded")
    assert [r.chip for r in reqs] == [0, 1, 1, 0]
    assert all(r.generated == r.output_tokens for r in reqs)
    assert len(sim.chips[1].steps) > 0


def test_workloads_are_seeded(tmp_path):
    spec = WorkloadSpec(requests=50, arrival="poisson", rate_per_s=4.0, seed=3,
                        prompt_tokens=LengthDist(dist="lognormal", median=300, sigma=0.5,
                                                 max=2000),
                        output_tokens=LengthDist(dist="normal", mean=100, std=30, max=400))
    a, b = make_requests(spec), make_requests(spec)
    assert [(r.arrival_ps, r.prompt_tokens, r.output_tokens) for r in a] == [
        (r.arrival_ps, r.prompt_tokens, r.output_tokens) for r in b]
    times = [r.arrival_ps for r in a]
    assert times[0] == 0 and times == sorted(times)
    mean_gap = a[-1].arrival_ps / 49 / 1e12
    assert 0.15 < mean_gap < 0.35  # 1 / 4 per second
    c = make_requests(spec.model_copy(update={"seed": 4}))
    assert [r.prompt_tokens for r in c] != [r.prompt_tokens for r in a]
    fixed = make_requests(WorkloadSpec(requests=3, prompt_tokens=7, output_tokens=2))
    assert [(r.arrival_ps, r.prompt_tokens, r.output_tokens) for r in fixed] == [(0, 7, 2)] * 3
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(d) for d in [
        {"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 3},
        {"arrival_s": 0.25, "prompt_tokens": 20, "output_tokens": 4}]) + "\n")
    assert read_trace(trace) == [(0.5, 10, 3), (0.25, 20, 4)]
    reqs = make_requests(WorkloadSpec(requests=10, trace=str(trace)))
    assert [(r.rid, r.arrival_ps, r.prompt_tokens) for r in reqs] == [
        (0, 250_000_000_000, 20), (1, 500_000_000_000, 10)]


def test_block_bytes_follow_the_format():
    # a bf16 block of 16 tokens of Qwen2.5-0.5B: 24 layers x (K, V) x 2 heads x 64 x 2 B
    bf16, int8 = kvformats.parse("bf16"), kvformats.parse("int8")
    assert 48 * 2 * 16 * steady_bytes_per_token(bf16, 64) == 16 * 24 * 2 * 2 * 64 * 2
    assert steady_bytes_per_token(int8, 64) == 64
    c4r4 = kvformats.parse("quantmla-c4r4")
    # 256 B of content codes + 32 B of RoPE codes + 9 groups x (fp16 scale + u8 zero),
    # padded to 16 B (FACTS.md): 320 B per token and layer, 3.6x smaller than bf16
    assert steady_bytes_per_token(c4r4, 576) == 320
    assert steady_bytes_per_token(kvformats.parse("kivi-4.k"), 64) == pytest.approx(
        kvformats.parse("kivi-4.k").block_bytes(64) / 32)


def test_decode_set_advances_members_and_writes_them_back():
    from sim.serving.decodeset import DecodeSet
    blk = [-(-n // 4) for n in range(64)]  # 4 tokens a block
    a = Request(rid=3, arrival_ps=0, prompt_tokens=5, output_tokens=4)
    b = Request(rid=7, arrival_ps=0, prompt_tokens=6, output_tokens=2)
    for r in (a, b):  # each sampled its first token after its prompt
        r.computed = r.high_water = r.prompt_tokens
        r.generated, r.blocks, r.decode_computed = 1, blk[r.prompt_tokens], 0
        r.token_ps.append(100)
    d = DecodeSet(blk)
    d.add([a, b])
    assert d.items == [(3, 1), (7, 1)] and d.positions() == [5, 6]
    assert d.need().tolist() == [blk[6] - blk[5], blk[7] - blk[6]] == [0, 0]
    assert d.advance(200) == [b]  # b samples its second and last token
    assert (b.computed, b.high_water, b.generated, b.decode_computed, b.token_ps) == (
        7, 7, 2, 1, [100, 200])
    assert d.items == [(3, 1)] and len(d) == 1
    assert a.computed == 5  # a member's request is stale until it leaves the set
    d.take(d.need())  # position 6 -> 7 tokens: 2 blocks
    assert d.advance(300) == []
    d.flush()
    assert (a.computed, a.generated, a.blocks, a.decode_computed, a.token_ps) == (
        7, 3, 2, 2, [100, 200, 300])
    assert len(d) == 0
