"""Speculative decoding through the host runtime, as host code on the real card would run
it: the prompt's prefill calls, then rounds of

1. **draft**: the drafter proposes up to ``k`` tokens (:mod:`.drafters`; its calls or host
   work are timed as they happen);
2. **verify**: one ``infer`` of the last token and the drafts (``d + 1`` tokens) at the
   cache position after the last accepted token, returning the logits of every position
   (``ModelConfig(all_logits=True)``); :mod:`.verify` accepts the longest prefix decoding
   would have produced and picks the token after it. A round with no drafts is a plain
   decode call (one token, its logits);
3. **tail cut**: the rejected drafts leave the cache (:mod:`.spec`'s ``cut``): with
   ``filter_cache_tail`` over the verified window (``window``) or over the rejected tail
   (``rejected``), or by the host's ``cache_size`` alone (``host``).

In timing-only runs there are no logits: an :class:`.profile.AcceptanceProfile` says how
many tokens each round drafts and accepts (seeded), the drafter spends its time
(``simulate``) and the same calls run on the device.

Every round is a :class:`Round`: tokens drafted and accepted, and the simulated time of
its draft, verification and tail cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvsim.errors import ConfigError
from sim.runtime import Model
from traces.speculation_results import (
    AcceptanceFigures,
    SpecRound,
    SpeculationFigures,
    SpeculationSummary,
)

from .drafters import Drafter, DrafterInfo
from .profile import AcceptanceProfile
from .spec import MAX_K, Cut
from .verify import accept_greedy, accept_sampled, softmax

Embed = Callable[[Sequence[int]], np.ndarray]


#: One draft-verify-cut round (times in simulated seconds): its typed result.
Round = SpecRound


@dataclass
class SpecResult:
    """A speculative generation: the tokens, the prefill and every round."""

    tokens: list[int]
    prompt_tokens: int
    ttft_s: float
    k: int
    cut: str
    drafter: str
    rounds: list[Round] = field(default_factory=list)
    #: (phase, step, tokens, cache tokens after) of every call made, in order (the run's
    #: ``calls`` rows): phases prefill, draft, verify, tail_cut
    labels: list[tuple[str, int, int, int]] = field(default_factory=list)

    def profile(self) -> AcceptanceProfile:
        """The measured acceptance: ``(drafted, accepted)`` of every round."""
        return AcceptanceProfile.measured(((r.drafted, r.accepted) for r in self.rounds),
                                          self.k)

    def summary(self) -> SpeculationSummary:
        """Totals: tokens drafted and accepted, the acceptance rate (over rounds that
        drafted), tokens per verification call, the decode time split into draft, verify
        and tail cut, and decode tokens per second (the tokens after the first, which the
        prefill's logits give, over the rounds' time)."""
        rs = self.rounds
        drafted = sum(r.drafted for r in rs)
        accepted = sum(r.accepted for r in rs)
        draft_s, verify_s, cut_s = (sum(getattr(r, k) for r in rs)
                                    for k in ("draft_s", "verify_s", "cut_s"))
        decode_s = draft_s + verify_s + cut_s
        tokens = len(self.tokens) - 1
        return SpeculationSummary(
            drafter=self.drafter, k=self.k, cut=self.cut, verify_calls=len(rs),
            rounds_with_drafts=sum(1 for r in rs if r.drafted), drafted_tokens=drafted,
            accepted_tokens=accepted, acceptance_rate=accepted / drafted if drafted else 0.0,
            tokens_per_verify_call=sum(r.emitted for r in rs) / len(rs) if rs else 0.0,
            tail_cuts=sum(1 for r in rs if r.cut_s > 0), draft_s=draft_s, verify_s=verify_s,
            cut_s=cut_s, decode_s=decode_s,
            tail_cut_share=cut_s / decode_s if decode_s else 0.0, decode_tokens=tokens,
            decode_tokens_per_s=tokens / decode_s if decode_s else 0.0)

    def figures(self, drafter: DrafterInfo, acceptance: str) -> SpeculationFigures:
        """The ``speculation`` entry of a run's results: what ``drafter`` is (its spec, a
        self-draft's layers, launch and DRAM figures), the totals, the measured acceptance,
        every round, and where acceptance came from (``acceptance``)."""
        return SpeculationFigures(
            spec=drafter.spec, layers=drafter.layers, launch_s=drafter.launch_s,
            dram=drafter.dram, summary=self.summary(),
            profile=AcceptanceFigures.from_metrics(self.profile().to_json(),
                                                   "speculation.profile")
            if self.rounds else None,
            rounds=tuple(self.rounds), acceptance=acceptance)


def _check(drafted: Sequence[int], room: int, vocab: int) -> list[int]:
    """The drafter's tokens, refused if there are too many or one is not a token id."""
    out = [int(t) for t in drafted]
    if len(out) > room:
        raise ConfigError(f"the drafter proposed {len(out)} tokens; at most {room} were asked")
    if any(not 0 <= t < vocab for t in out):
        raise ConfigError(f"the drafter proposed a token outside the vocabulary 0..{vocab - 1}")
    return out


def speculative_decode(model: Model, prompt: Sequence[int], *, drafter: Drafter, k: int,
                       max_new_tokens: int, embed: Embed, eos_id: int | None = None,
                       temperature: float = 0.0, seed: int = 0, cut: Cut = "window",
                       profile: AcceptanceProfile | None = None,
                       on_tokens: Callable[[list[int]], None] | None = None,
                       check_logits: Callable[[np.ndarray, str], None] | None = None,
                       start_cache: int = 0) -> SpecResult:
    """Prefill ``prompt`` on the launched ``model`` (``ModelConfig(all_logits=True)``) and
    generate up to ``max_new_tokens`` tokens speculatively (module docstring).
    ``embed(tokens)``: the host's float32 embeddings. Functional runs decode greedily
    (``temperature`` 0) or by the rejection rule (seeded by ``seed``); timing-only runs
    need ``profile``. ``on_tokens`` hears the output as it grows; ``check_logits(logits,
    where)`` may refuse degenerate logits. ``start_cache``: tokens already in the cache
    before the prompt (a context: the prompt's first token goes at that position)."""
    acc = model.acc
    if acc is None:
        raise ConfigError("speculative decoding: the model is not launched")
    cm = model.compiled
    if not 1 <= k <= MAX_K:
        raise ConfigError(f"speculative decoding: k={k} must be 1..{MAX_K}")
    if model.wide is None:
        raise ConfigError("speculative decoding verifies drafts with the logits of every "
                          "position: launch the model with ModelConfig(all_logits=True)")
    if k + 1 > cm.max_seq:
        raise ConfigError(f"speculative decoding: a verification call of k + 1 = {k + 1} "
                          f"tokens exceeds the compiled max_sequence_length {cm.max_seq}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
    functional = acc.functional
    if not functional and profile is None:
        raise ConfigError("speculative decoding without logits (timing-only) needs an "
                          "acceptance profile: a rate or measured counts")
    if start_cache + len(prompt) + max_new_tokens - 1 > cm.cap:
        raise ConfigError(f"{start_cache} cached tokens, the prompt ({len(prompt)} tokens) "
                          f"and {max_new_tokens} new tokens exceed the cache length {cm.cap}")
    vocab = cm.model.vocab_size
    res = SpecResult([], len(prompt), 0.0, k, cut, drafter.name)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5BEC]))
    draw_rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD8A3]))

    def calls_since(before: int, phase: str, step: int, tokens: int, cache: int) -> float:
        recs = acc.calls_since(before)
        res.labels.extend((phase, step, tokens if r.op == "infer" else int(r.op == "draft"),
                           cache) for r in recs)
        return sum(r.time_s for r in recs)

    cache, logits = start_cache, None
    t0 = acc.device.env.now
    for i, a in enumerate(range(0, len(prompt), cm.max_seq)):
        chunk = list(prompt[a:a + cm.max_seq])
        before = acc.num_calls
        [logits] = model.infer(embed(chunk), cache_size=cache)
        cache += len(chunk)
        calls_since(before, "prefill", i, len(chunk), cache)
    res.ttft_s = (acc.device.env.now - t0) / 1e12
    if functional:
        if check_logits is not None:
            check_logits(logits, "the prompt")
        first = (int(np.argmax(logits)) if temperature <= 0 else
                 int(rng.choice(vocab, p=softmax(logits, temperature))))
    else:
        first = 0
    out = res.tokens
    out.append(first)
    if on_tokens is not None:
        on_tokens(out)
    step = 0
    while len(out) < max_new_tokens and (eos_id is None or out[-1] != eos_id or
                                         not functional):
        room = min(k, max_new_tokens - len(out) - 1, cm.cap - cache - 1)
        context = [*prompt, *out]
        before = acc.num_calls
        forced = 0
        if functional:
            draft = drafter.propose(context, room, cache_size=cache)
            drafts, q = _check(draft.tokens, room, vocab), draft.q
        else:
            d, forced = profile.draw(draw_rng, room)  # type: ignore[union-attr]
            drafter.simulate(len(context), d, cache_size=cache)
            drafts, q = [0] * d, None
        draft_s = calls_since(before, "draft", step, 0, cache)
        d = len(drafts)
        before = acc.num_calls
        x = embed([out[-1], *drafts])
        if d:
            [rows] = model.infer(x, cache_size=cache, all_logits=True)
        else:
            [last] = model.infer(x, cache_size=cache)
            rows = None if last is None else last[None]
        verify_s = calls_since(before, "verify", step, d + 1, cache + d + 1)
        if functional:
            if check_logits is not None:
                check_logits(rows[-1], f"verification call {step}")
            a, nxt = (accept_greedy(rows, drafts) if temperature <= 0
                      else accept_sampled(rows, drafts, q, temperature, rng))
        else:
            a, nxt = forced, 0
        before = acc.num_calls
        if a < d and cut == "window":
            model.filter_cache_tail(cache + d + 1, d + 1, [i <= a for i in range(d + 1)])
        elif a < d and cut == "rejected":
            model.filter_cache_tail(cache + d + 1, d - a, [False] * (d - a))
        cache += a + 1
        cut_s = calls_since(before, "tail_cut", step, 0, cache)
        new = [*drafts[:a], nxt]
        emitted = 0
        for t in new:
            out.append(t)
            emitted += 1
            if len(out) == max_new_tokens or (functional and t == eos_id):
                break
        if on_tokens is not None:
            on_tokens(out)
        res.rounds.append(Round(step, cache - a - 1, d, a, emitted, draft_s, verify_s, cut_s))
        step += 1
    return res


def plain_decode(model: Model, prompt: Sequence[int], *, max_new_tokens: int, embed: Embed,
                 eos_id: int | None = None) -> tuple[list[int], float, list[float]]:
    """Greedy decoding one token per call on the launched ``model``, for comparison: the
    tokens, the prefill's simulated seconds and every decode call's."""
    acc = model.acc
    cm = model.compiled
    t0 = acc.device.env.now
    cache, logits = 0, None
    for a in range(0, len(prompt), cm.max_seq):
        chunk = list(prompt[a:a + cm.max_seq])
        [logits] = model.infer(embed(chunk), cache_size=cache)
        cache += len(chunk)
    ttft = (acc.device.env.now - t0) / 1e12
    out = [int(np.argmax(logits)) if logits is not None else 0]
    times = []
    while len(out) < max_new_tokens and (logits is None or eos_id is None or out[-1] != eos_id):
        [logits] = model.infer(embed([out[-1]]), cache_size=cache)
        times.append(acc.calls[-1].time_s)
        cache += 1
        out.append(int(np.argmax(logits)) if logits is not None else 0)
    return out, ttft, times


__all__ = ["Round", "SpecResult", "plain_decode", "speculative_decode"]
