"""Speculative decoding on the simulated card (tiny model, tiny device): greedy output is
plain greedy decoding's for every drafter and every way of cutting the rejected tail; a
round's time is its calls' (drafts, one verification, the tail cut); the self-draft reads
the verifier's weights where they are; the rejection rule keeps the target distribution;
the spec strings and profiles refuse bad input by name."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model, ModelConfig, RuntimeApiError
from sim.runtime.cacheops import rearrange_program
from sim.runtime.draft import launch_draft
from sim.runtime.speculative import AcceptanceProfile, parse_speculate
from sim.runtime.speculative.decode import plain_decode, speculative_decode
from sim.runtime.speculative.drafters import CallableDrafter, ModelDrafter, PromptLookup, lookup
from sim.runtime.speculative.selfdraft import compile_self_draft, launch_self_draft, shared_regions
from sim.runtime.speculative.verify import accept_greedy, accept_sampled, softmax
from sim.units import ns_to_ps

HW = load_hardware("tiny")
TINY = load_preset("tiny")
PROMPT = [5, 17, 3, 99, 42, 7, 61, 8, 23, 11, 70, 2, 9, 33, 5, 17, 3, 99]
NEW = 24


@pytest.fixture(scope="module")
def cm():
    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(HW),
                         core_mode="single", max_seq=16, cap=96)


@pytest.fixture(scope="module")
def embed(cm):
    table = cm.weight_source().tensor("embed")
    return lambda ts: table[list(ts)].astype(np.float32)


def _launch(cm, functional: bool = True) -> Model:
    m = Model(cm, ModelConfig(all_logits=True))
    m.launch(Accelerator(hw=HW, functional=functional))
    return m


@pytest.fixture(scope="module")
def plain(cm, embed):
    return plain_decode(_launch(cm), PROMPT, max_new_tokens=NEW, embed=embed)


def _oracle(truth: list[int], good: int):
    """A drafter that proposes the true continuation with its ``good + 1``-th token wrong."""
    def fn(context, k):
        n = len(context) - len(PROMPT)
        out = (truth + [0] * 40)[n:n + k]
        if good < len(out):
            out[good] = (out[good] + 1) % TINY.vocab_size
        return out
    return fn


def _drafter(name: str, m: Model, cm, embed, truth: list[int]):
    if name == "lookup":
        return PromptLookup(m.acc)
    if name == "oracle":
        return CallableDrafter(_oracle(truth, 2), acc=m.acc)
    if name == "self":
        return ModelDrafter(launch_self_draft(m, [0]), embed, shares_cache=True)
    # the model itself as a second model with caches of its own: every draft is right
    return ModelDrafter(launch_draft(m, cm, lambda n: None if n.startswith("kv.") else n),
                        embed, shares_cache=False)


@pytest.mark.parametrize("name, cut, rate", [("lookup", "window", None),
                                             ("oracle", "rejected", 0.5),
                                             ("self", "host", None),
                                             ("second", "window", 1.0)])
def test_greedy_speculation_is_plain_greedy_for_every_drafter(cm, embed, plain, name, cut,
                                                                rate):
    m = _launch(cm)
    res = speculative_decode(m, PROMPT, drafter=_drafter(name, m, cm, embed, plain[0]), k=4,
                             max_new_tokens=NEW, embed=embed, cut=cut)
    assert res.tokens == plain[0]
    if rate is not None:
        assert res.summary().acceptance_rate == pytest.approx(rate, abs=0.1)


def test_a_round_costs_its_calls_and_the_cut_its_program(cm, embed, plain):
    m = _launch(cm)
    acc = m.acc
    res = speculative_decode(m, PROMPT, drafter=CallableDrafter(_oracle(plain[0], 2),
                                                                acc=acc),
                             k=4, max_new_tokens=NEW, embed=embed, cut="window")
    # the oracle's third draft is always wrong: two accepted, then the right token
    assert [(r.drafted, r.accepted, r.emitted) for r in res.rounds[:3]] == [(4, 2, 3)] * 3
    calls = [c for c in acc.calls if c.op != "launch"]
    assert len(calls) == len(res.labels)
    by_phase: dict[str, int] = {}
    for c, (phase, *_rest) in zip(calls, res.labels, strict=True):
        by_phase[phase] = by_phase.get(phase, 0) + c.end_ps - c.start_ps
    rounds_ps = {k: round(sum(getattr(r, k) for r in res.rounds) * 1e12)
                 for k in ("draft_s", "verify_s", "cut_s")}
    assert (by_phase["draft"], by_phase["verify"], by_phase["tail_cut"]) == (
        rounds_ps["draft_s"], rounds_ps["verify_s"], rounds_ps["cut_s"])
    # each window cut: the runtime call, then the program that rewrites the 3 kept tokens
    r0 = res.rounds[0]
    cut = next(c for c in acc.calls if c.op == "filter_cache_tail")
    from sim.serving.grid import timing_device

    prog = rearrange_program(cm, slot=0, keep=list(range(r0.cache_size, r0.cache_size + 3)),
                             dst=r0.cache_size)
    run = timing_device(cm, HW).run(prog, validate=False)
    assert cut.end_ps - cut.start_ps == ns_to_ps(HW.host.call_overhead_ns) + run.duration_ps


def test_the_rejected_cut_is_the_call_alone_and_the_host_cut_free(cm, embed, plain):
    got = {}
    for cut in ("rejected", "host"):
        m = _launch(cm)
        speculative_decode(m, PROMPT, drafter=CallableDrafter(_oracle(plain[0], 1),
                                                              acc=m.acc),
                           k=4, max_new_tokens=NEW, embed=embed, cut=cut)
        got[cut] = [c.end_ps - c.start_ps for c in m.acc.calls if c.op == "filter_cache_tail"]
    assert got["host"] == [] and got["rejected"]
    assert set(got["rejected"]) == {ns_to_ps(HW.host.call_overhead_ns)}


def test_the_self_draft_reads_the_models_weights_in_place(cm):
    m = _launch(cm)
    before = {r.name: r for r in m.acc.device.layout.regions}
    dm = launch_self_draft(m, [1])
    d = dm.map.as_metrics()
    assert d.draft_copied_weight_bytes == 0 and d.draft_own_bytes > 0
    # shared: layer 1's weight codes and caches, the head and the RoPE tables
    assert dm.map.shared["w.layers.0.q_proj"] == "w.layers.1.q_proj"
    assert dm.map.shared["kv.s0.l0.k"] == "kv.s0.l1.k"
    assert dm.compiled.mm["w.layers.0.q_proj"].base == before["w.layers.1.q_proj"].base
    want = sum(r.size for n, r in before.items() if r.kind == "weights" and (
        n.startswith("w.layers.1.") or n in ("w.embed", "rope.cos", "rope.sin")))
    assert d.draft_shared_weight_bytes == want
    # the draft's own regions (its integer parameters) lie past every region of the model
    top = max(r.end for r in before.values())
    assert all(r.name.startswith("draft.p.") and r.base >= top for r in dm.map.own)
    assert d.draft_own_bytes == sum(r.size for r in dm.map.own)


def test_a_draft_whose_weights_differ_is_refused(cm):
    m = _launch(cm)
    region = m.acc.device.layout.regions[0]
    m.acc.device.mem.dram.write(region.base, np.full(16, 7, np.uint8))  # a changed byte
    with pytest.raises(RuntimeApiError, match="cannot be shared"):
        launch_draft(m, compile_self_draft(cm, [0], HW), shared_regions([0]))


def test_timing_only_rounds_follow_the_profile(cm, embed):
    prof = AcceptanceProfile(k=3, counts=((3, 1, 1),))
    m = _launch(cm, functional=False)
    res = speculative_decode(m, PROMPT, drafter=PromptLookup(m.acc), k=3, max_new_tokens=NEW,
                             embed=lambda ts: np.zeros((len(ts), TINY.hidden_size),
                                                       np.float32), profile=prof)
    # 2 tokens a round until fewer than 3 are left to draft
    assert [(r.drafted, r.accepted) for r in res.rounds] == [(3, 1)] * 10 + [(2, 1), (0, 0)]
    assert len(res.tokens) == NEW and sum(r.emitted for r in res.rounds) == NEW - 1


def test_lookup_takes_the_latest_earlier_match():
    assert lookup([1, 2, 3, 9, 1, 2, 4, 8, 1, 2], 3, 2) == [4, 8, 1]
    assert lookup([5, 6, 7], 2, 3) == []  # no earlier occurrence of 7
    assert lookup([1, 2, 1], 4, 3) == [2, 1]  # the continuation runs to the end


def test_greedy_accepts_the_longest_prefix_argmax_agrees_with():
    rows = np.eye(5)[[1, 2, 3, 4]]  # argmax 1, 2, 3, 4 after each position
    assert accept_greedy(rows, [1, 2, 0]) == (2, 3)
    assert accept_greedy(rows, [1, 2, 3]) == (3, 4)
    assert accept_greedy(rows, [0, 2, 3]) == (0, 1)


def test_the_rejection_rule_keeps_the_target_distribution():
    rng = np.random.default_rng(7)
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2))
    q = np.array([[0.1, 0.2, 0.3, 0.4]])
    first = np.zeros(4)
    n = 20000
    for _ in range(n):
        x = int(rng.choice(4, p=q[0]))
        a, nxt = accept_sampled(logits, [x], q, 1.0, rng)
        first[x if a else nxt] += 1
    assert np.abs(first / n - softmax(logits[0], 1.0)).max() < 0.01


def test_profiles_and_their_expectations():
    r = AcceptanceProfile(k=4, rate=0.5)
    assert r.tokens_per_call() == pytest.approx((1 - 0.5 ** 5) / 0.5)
    c = AcceptanceProfile.measured([(4, 4), (4, 0), (0, 0), (4, 4)], 4)
    assert c.counts == ((0, 0, 1), (4, 0, 1), (4, 4, 2))
    assert c.acceptance_rate() == pytest.approx(8 / 12)
    assert c.draw(np.random.default_rng(0), 2)[0] <= 2
    with pytest.raises(ConfigError, match="0 <= accepted <= drafted"):
        AcceptanceProfile(k=2, counts=((2, 3, 1),))
    with pytest.raises(ConfigError, match="must lie in 0..1"):
        AcceptanceProfile(k=2, rate=1.5)


@pytest.mark.parametrize("text, needle", [
    ("promt-lookup:k=4", "unknown drafter 'promt-lookup' (did you mean 'prompt-lookup'?)"),
    ("prompt-lookup:k=32", "k=32 must be 1..31 (the verified window of k + 1 tokens"),
    ("prompt-lookup:n=2", "unknown key 'n' (did you mean 'ngram'?)"),
    ("self:k=2", "self needs exactly one of layers=N"),
    ("self:skip=9-3", "skip must be a block of layers A-B"),
    ("prompt-lookup:k=4,cut=never", "cut='never'; valid: window, rejected, host"),
    ("prompt-lookup:k=x", "k must be an integer, got 'x'"),
])
def test_spec_strings_refuse_bad_input_by_name(text, needle):
    with pytest.raises(ConfigError) as err:
        parse_speculate(text)
    assert needle in str(err.value) and str(err.value).startswith(f"--speculate {text!r}")


def test_spec_strings_and_the_layers_a_self_draft_keeps():
    assert parse_speculate("prompt-lookup:k=8,ngram=2").text() == "prompt-lookup:k=8,ngram=2"
    s = parse_speculate("self:layers=26,k=2,cut=host")
    assert (s.k, s.layers, s.cut) == (2, 26, "host")
    assert s.keep(30) == tuple(i for i in range(30) if not 14 <= i <= 17)
    assert parse_speculate("self:skip=14-17").keep(30) == s.keep(30)
    assert parse_speculate("self:layers=22").keep(30) == tuple(
        i for i in range(30) if not 12 <= i <= 19)
    assert parse_speculate("self:layers=2").keep(3) == (0, 2)  # the last layer is kept
    with pytest.raises(ConfigError, match="layers=26 must be 1..15"):
        s.keep(16)


def test_sampled_speculation_is_seeded(cm, embed):
    def once():
        m = _launch(cm)
        return speculative_decode(m, PROMPT, drafter=PromptLookup(m.acc), k=2, max_new_tokens=8,
                                  embed=embed, temperature=0.8, seed=3).tokens

    a = once()
    assert a == once() and len(a) == 8
