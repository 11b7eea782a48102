"""Evictions: the positions each policy keeps, the device's attention-score readout (its
bytes and what it sums), and host and device edits that leave the same cache."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.bits import build_bit_config
from sim.app.evict import SNAP_WINDOW, TappedRunner, edit_costs, keep_positions
from sim.app.needle import NpuRunner
from sim.runtime.ready import hardware_of, source_of
from sim.runtime.scores import SCORE_BYTES, read_scores

from .echo_runner import EchoRunner

IDS = np.random.default_rng(7).integers(0, 256, size=120).tolist()


def test_positional_policies() -> None:
    assert keep_positions("recent", 10, 3) == [7, 8, 9]
    assert keep_positions("streaming", 10, 6) == [0, 1, 2, 3, 8, 9]
    assert keep_positions("streaming", 10, 2) == [0, 1]
    assert keep_positions("recent", 4, 9) == [0, 1, 2, 3]  # within budget: all kept


def test_score_policies() -> None:
    scores = np.array([9.0, 0, 0, 5, 0, 0, 0, 7, 0, 0])
    # h2o: 2 recent, the 2 heaviest older ones (0, then 7 over 3)
    assert keep_positions("h2o", 10, 4, scores) == [0, 7, 8, 9]
    many = np.zeros(80)
    many[5] = 1.0
    keep = keep_positions("snapkv", 80, SNAP_WINDOW + 7, many)
    # the window, plus position 5 and the neighbours its pooled weight spreads to
    assert keep == [*range(2, 9), *range(80 - SNAP_WINDOW, 80)]
    with pytest.raises(ConfigError, match="one attention score per position"):
        keep_positions("h2o", 10, 4)
    with pytest.raises(ConfigError, match="not one of"):
        keep_positions("lru", 10, 4)


@pytest.fixture(scope="module")
def runner():
    r = TappedRunner(source_of("tiny"), build_bit_config({}), "int8", hardware_of("tiny"),
                     len(IDS), window_from=100)
    r.feed(IDS[:110])
    yield r
    r.close()


def test_score_readout_sums_each_querys_weights(runner) -> None:
    cm = runner.cm
    layers, kvh = cm.model.num_layers, cm.model.num_kv_heads
    group = cm.model.num_heads // cm.model.num_kv_heads
    sums, cost = read_scores(runner.model, runner.taps["all"], 110)
    assert sums.shape == (layers, kvh, 110)
    assert cost.pcie_bytes == layers * kvh * 110 * SCORE_BYTES
    assert cost.time_s > 0
    # every query's probabilities sum to 1 (Q24, rounded per key): 110 queries x group
    assert np.allclose(sums.sum(axis=2), 110 * group, rtol=1e-4)
    window, _ = read_scores(runner.model, runner.taps["window"], 110)
    assert np.allclose(window.sum(axis=2), 10 * group, rtol=1e-4)  # queries 100..109


def test_host_and_device_evictions_agree() -> None:
    costs = edit_costs(source_of("tiny"), build_bit_config({}), "int8", hardware_of("tiny"),
                       IDS, at=100, budgets=[48], policies=["streaming", "h2o"])
    host, dev = costs[("h2o", 48, "host")], costs[("h2o", 48, "device")]
    assert host.new_cache_size == dev.new_cache_size == 48
    assert host.pcie_bytes > dev.pcie_bytes > 0  # the dump and load cross the link
    # the readout's bytes are the device edit's only link traffic
    cm_layers = costs[("streaming", 48, "device")].pcie_bytes
    assert cm_layers == 0


def test_retrieval_forgets_what_the_policy_drops(monkeypatch) -> None:
    """With a stand-in model that repeats the key it still holds: a recent-only budget
    keeps a needle near the end and forgets one at the start; StreamingLLM's sinks do not
    save a needle in the middle."""
    from sim.app import evict
    from sim.runtime.ready import source_of as src_of

    pattern = src_of("smollm2-135m").tokenizer().encode(" The pass key is")
    monkeypatch.setattr(EchoRunner, "pattern", pattern)
    monkeypatch.setattr(evict, "TappedRunner", EchoRunner)
    got = evict.retrieval(src_of("smollm2-135m"), None, "int8", None, context=400,
                          budgets=[64], policies=["recent", "streaming"],
                          depths=[0.0, 1.0], trials=1)
    assert [h for h, _ in got[("recent", 64)]] == [False, True]
    assert [h for h, _ in got[("streaming", 64)]] == [False, True]


def test_divergence_without_an_edit_is_the_unedited_quality() -> None:
    from sim.app.evict import divergence
    from sim.app.quality import evaluate_edit

    bits, hw = build_bit_config({}), hardware_of("tiny")
    got = divergence(source_of("tiny"), bits, "int8", hw, IDS, at=100, budgets=[48],
                     policies=["recent"], positions="cache")
    plain = evaluate_edit("tiny", IDS, bits=bits, edit="drop:0-51", at=100, hw="tiny")
    assert got["none"] == (plain.unedited.kl_mean, plain.unedited.top1_agreement)
    # dropping the 52 oldest positions is the recent-48 policy, and evaluate_edit's next
    # tokens sit at the cache size, as the vendor's runtime places them: the same figures
    assert got[("recent", 48)] == (plain.quality.kl_mean, plain.quality.top1_agreement)
    # at the text's positions every kept key keeps its distance: on this model and text
    # the recent window then forgets less (KL 0.00895 against 0.01099 nats)
    text = divergence(source_of("tiny"), bits, "int8", hw, IDS, at=100, budgets=[48],
                      policies=["recent"], positions="text")
    assert text["none"] == got["none"]
    assert round(text[("recent", 48)][0], 5) == 0.00895
    assert round(got[("recent", 48)][0], 5) == 0.01099


def _cache_rows(runner, size: int) -> dict[tuple[int, str], np.ndarray]:
    """Every cache's decoded rows ``[tokens, heads, width]`` (read by a host edit that
    writes them back unchanged)."""
    seen: dict[tuple[int, str], np.ndarray] = {}

    def keep(views):
        for v in views:
            seen[(v.layer, v.component)] = v.values.copy()
        return [v.values for v in views]

    runner.model.edit_cache_on_host(keep, cache_size=size)
    return seen


def test_position_moves_only_the_rope_rows() -> None:
    """``infer(position=p)`` at cache size 0 writes the key a token gets at position
    ``p``: layer 0's key row of a token depends on its embedding and its RoPE row alone,
    so it equals the row the same token writes at cache position ``p``; its value row and
    the position-0 key differ as they should."""
    src, bits, hw = source_of("tiny"), build_bit_config({}), hardware_of("tiny")
    whole = NpuRunner(src, bits, "int8", hw, 16)
    moved = NpuRunner(src, bits, "int8", hw, 16)
    plain = NpuRunner(src, bits, "int8", hw, 16)
    try:
        whole.feed(IDS[:6])
        ref = _cache_rows(whole, 6)
        moved.model.infer(moved.embed(np.asarray(IDS[5:6])), cache_size=0, position=5)
        got = _cache_rows(moved, 1)
        plain.model.infer(plain.embed(np.asarray(IDS[5:6])), cache_size=0)
        at0 = _cache_rows(plain, 1)
    finally:
        for r in (whole, moved, plain):
            r.close()
    assert np.array_equal(got[(0, "k")][0], ref[(0, "k")][5])
    assert np.array_equal(got[(0, "v")][0], ref[(0, "v")][5])
    assert np.array_equal(at0[(0, "v")][0], got[(0, "v")][0])  # values carry no rotation
    assert not np.array_equal(at0[(0, "k")][0], got[(0, "k")][0])


def test_position_refusals() -> None:
    from sim.runtime.errors import RuntimeApiError

    r = NpuRunner(source_of("tiny"), build_bit_config({}), "int8", hardware_of("tiny"), 16)
    x = r.embed(np.asarray(IDS[:2]))
    try:
        r.feed(IDS[:4])
        with pytest.raises(RuntimeApiError, match="position 3 is below cache_size 4"):
            r.model.infer(x, cache_size=4, position=3)
        cap = r.cm.cap
        with pytest.raises(RuntimeApiError, match=f"position {cap - 1} \\+ 2 tokens exceed"):
            r.model.infer(x, cache_size=4, position=cap - 1)
        with pytest.raises(RuntimeApiError, match="position must be"):
            r.model.infer(x, cache_size=4, position=4.5)
    finally:
        r.close()


def test_evictions_keep_the_texts_positions_or_the_vendors() -> None:
    """After an eviction the next token sits at the text's position (``positions="text"``,
    the default) or at the new cache size (``"cache"``, the vendor's runtime): the first
    equals a host edit followed by ``infer(position=10)``, the second by a plain call."""
    from sim.runtime.cacheops import evict_positions

    src, bits, hw = source_of("tiny"), build_bit_config({}), hardware_of("tiny")
    nxt = np.asarray(IDS[10:11])
    got = {}
    for positions in ("text", "cache"):
        r = TappedRunner(src, bits, "int8", hw, 16, window_from=0, positions=positions)
        try:
            r.feed(IDS[:10])
            res, keep = r.evict("recent", 6, "host")
            assert keep == [4, 5, 6, 7, 8, 9] and r.size == 6
            assert r.pos == (10 if positions == "text" else 6)
            got[positions] = r.feed(nxt, rows=1)
        finally:
            r.close()
    ref = NpuRunner(src, bits, "int8", hw, 16)
    try:
        ref.feed(IDS[:10])
        ref.model.edit_cache_on_host(evict_positions(range(4)), cache_size=10)
        x = ref.embed(nxt)
        [at_text] = ref.model.infer(x, cache_size=6, all_logits=True, position=10)
        [at_cache] = ref.model.infer(x, cache_size=6, all_logits=True)
    finally:
        ref.close()
    assert np.array_equal(got["text"], at_text)
    assert np.array_equal(got["cache"], at_cache)
    assert not np.array_equal(at_text, at_cache)
    with pytest.raises(ConfigError, match="positions: 'both' is not one of text, cache"):
        TappedRunner(src, bits, "int8", hw, 16, window_from=0, positions="both")
