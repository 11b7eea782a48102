"""Text in, text out: a prompt prefilled and continued on the simulated NPU (functional
mode), greedily or by seeded sampling, beside the float reference's continuation of the
same prompt, with the simulated time to first token and time per output token."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import ConfigError
from models.bits import BitConfig
from models.compiler.calibrate_wide import float_weights
from models.quality import DegenerateOutput, collapsed, degenerate_logits
from models.reference import ReferenceModel
from models.source import ModelSource
from sim.app.quality import bits_label, check_context, ready_for_text
from sim.device.hw import HardwareConfig
from sim.runtime import Model, ModelConfig
from sim.runtime.ready import ReadyModel, hardware_of, source_of
from sim.runtime.speculative import DraftSpec, parse_speculate, speculative_decode
from sim.runtime.speculative.setup import make_drafter
from traces.speculation_results import SpeculationFigures


@dataclass(frozen=True)
class Sampler:
    """Greedy (``temperature`` 0) or softmax sampling at ``temperature`` from a generator
    seeded with ``seed`` (the NPU and the reference each get their own, equally seeded)."""

    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise ConfigError(f"temperature: must be a finite number >= 0, got "
                              f"{self.temperature!r}")

    def picker(self) -> Callable[[np.ndarray], int]:
        rng = np.random.default_rng(self.seed)

        def pick(logits: np.ndarray) -> int:
            if self.temperature == 0:
                return int(np.argmax(logits))
            z = np.asarray(logits, np.float64) / self.temperature
            p = np.exp(z - z.max())
            return int(rng.choice(p.size, p=p / p.sum()))

        return pick


@dataclass(frozen=True)
class Generation:
    """A continuation on the NPU beside the reference's."""

    model: str
    real_weights: bool
    bits: str
    kv: str
    kv_read: str
    hw: str
    prompt_tokens: int
    tokens: list[int]  # the NPU's continuation
    text: str
    reference_tokens: list[int]
    reference_text: str
    first_difference: int | None  # index of the first token that differs; None: same
    ttft_s: float  # simulated: the prefill calls
    time_per_token_s: float  # simulated: mean decode call (speculative: per decoded token)
    degenerate: str | None = None
    #: speculative decoding (``speculate``): the drafter, the totals of every round
    #: (drafted, accepted, draft / verify / tail-cut time), the rounds, the measured
    #: acceptance profile; None for plain decoding
    speculation: SpeculationFigures | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(replace(self, speculation=None))
        out["speculation"] = None if self.speculation is None else self.speculation.to_metrics()
        return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a shorter one differs where it ends),
    or None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _stream(tok, on_text: Callable[[str], None] | None):
    """A function taking the tokens so far that passes the new text to ``on_text``."""
    shown = [""]

    def push(ids: list[int]) -> None:
        if on_text is None:
            return
        text = tok.continuation_text(ids)  # up to a stop token, which is not shown
        if text.startswith(shown[0]) and not text.endswith("\ufffd"):
            on_text(text[len(shown[0]):])
            shown[0] = text

    return push


def generate(source: str | Path | ModelSource, prompt: str, *, max_new_tokens: int,
             bits: BitConfig, kv: str = "int8", hw: str | HardwareConfig = "aries",
             chat: bool = False, sampler: Sampler | None = None, seed: int = 0,
             allow_degenerate: bool = False,
             on_text: Callable[[str], None] | None = None,
             speculate: DraftSpec | str | None = None) -> Generation:
    """Prefill ``prompt`` (with the model's chat template if ``chat``) and continue it by up
    to ``max_new_tokens`` tokens on the NPU (stopping at the end-of-sequence token or the
    end of the chat turn), passing the text to ``on_text`` as it is produced; the float
    reference continues the same prompt (before the NPU runs, so the memory of the two
    never adds up). Degenerate logits, or a continuation that
    collapses to one repeated token while the reference's does not, raise
    :class:`DegenerateOutput` unless ``allow_degenerate``.

    ``speculate`` (a :class:`sim.runtime.speculative.DraftSpec` or its string,
    ``prompt-lookup:k=4``, ``self:layers=N,k=K``) decodes speculatively: drafts verified in
    one call that returns every position's logits, the rejected tail cut with
    ``filter_cache_tail`` (:func:`sim.runtime.speculative.speculative_decode`); greedy output is
    the same as without."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(speculate, str):
        speculate = parse_speculate(speculate)
    src = source_of(source)
    tok = src.tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    ids = tok.encode(text)
    if not ids:
        raise ConfigError("prompt: no tokens")
    # the last new token is not fed back: the cache holds the prompt and max_new_tokens - 1
    check_context(src, len(ids) + max_new_tokens - 1,
                  f"--prompt: {len(ids):,} tokens + --max-new-tokens {max_new_tokens} - 1 = "
                  f"{len(ids) + max_new_tokens - 1:,}")
    sampler = sampler or Sampler()
    hwc = hardware_of(hw)
    # the float reference first: its float64 K/V cache (0.75 GB at 8,192 tokens) is gone
    # before the compile, so it never sits beside the compiled model, the device weights
    # and the calibration that ready_for_text keeps for the next call (~0.8 GB for
    # SmolLM2-135M); the two runs share nothing but the float weights
    ref_out = reference_continuation(src, ids, max_new_tokens, sampler, tok.stop_ids,
                                     seed=seed)
    ready = ready_for_text(src, bits, kv=kv, hw=hwc, tokens=len(ids) + max_new_tokens,
                           seed=seed)
    # speculation verifies drafts with the logits of every position of a call
    model = ready.launch(ModelConfig(all_logits=speculate is not None))
    acc, cm = model.acc, ready.compiled
    degenerate: list[str] = []

    def check(logits: np.ndarray, where: str) -> None:
        if (why := degenerate_logits(logits)) is not None:
            if not allow_degenerate:
                model.dispose()
                raise DegenerateOutput(f"NPU logits of {where}: {why} (the integer pipeline's "
                                       f"output cannot be right; --allow-degenerate goes on)")
            degenerate.append(f"{where}: {why}")

    spec: SpeculationFigures | None = None
    if speculate is not None:
        out, ttft_s, tpot, spec = _speculate(model, ready, speculate, ids, max_new_tokens,
                                             sampler, tok, check, _stream(tok, on_text))
        decode_s = [tpot] if out[1:] else []
    else:
        start = acc.device.env.now
        cache, logits = 0, None
        for t0 in range(0, len(ids), cm.max_seq):
            chunk = np.asarray(ids[t0 : t0 + cm.max_seq])
            [logits] = model.infer(ready.embed(chunk), cache_size=cache)
            cache += chunk.size
        ttft_s = (acc.device.env.now - start) / 1e12
        check(logits, "the prompt")
        pick, out, push = sampler.picker(), [], _stream(tok, on_text)
        decode_s: list[float] = []
        while True:
            t = pick(logits)
            out.append(t)
            push(out)
            if t in tok.stop_ids or len(out) == max_new_tokens:  # EOS or the end of a turn
                break
            [logits] = model.infer(ready.embed([t]), cache_size=cache)
            decode_s.append(acc.calls[-1].time_s)
            cache += 1
            check(logits, f"output token {len(out)}")
    model.dispose()
    if (why := collapsed(out, ref_out)) is not None:
        if not allow_degenerate:
            raise DegenerateOutput(f"NPU text: {why} (--allow-degenerate goes on)")
        degenerate.append(why)
    return Generation(model=src.name, real_weights=src.real, bits=bits_label(bits), kv=kv,
                      kv_read=bits.kv_read, hw=hwc.name, prompt_tokens=len(ids), tokens=out,
                      text=tok.continuation_text(out), reference_tokens=ref_out,
                      reference_text=tok.continuation_text(ref_out),
                      first_difference=first_difference(out, ref_out), ttft_s=ttft_s,
                      time_per_token_s=float(np.mean(decode_s)) if decode_s else 0.0,
                      degenerate="; ".join(degenerate) or None, speculation=spec)


def _speculate(model: Model, ready: ReadyModel, spec: DraftSpec, ids: list[int],
               max_new_tokens: int, sampler: Sampler, tok, check, push
               ) -> tuple[list[int], float, float, SpeculationFigures]:
    """Speculative decoding: the tokens, TTFT, time per decoded token and the figures."""

    def embed(tokens) -> np.ndarray:
        return ready.embed(list(tokens))

    drafter, info = make_drafter(spec, model, embed, temperature=sampler.temperature,
                                 seed=sampler.seed)
    res = speculative_decode(model, ids, drafter=drafter, k=spec.k,
                             max_new_tokens=max_new_tokens, embed=embed, eos_id=tok.eos_id,
                             temperature=sampler.temperature, seed=sampler.seed,
                             cut=spec.cut, on_tokens=push, check_logits=check)
    summ = res.summary()
    tpot = summ.decode_s / summ.decode_tokens if summ.decode_tokens else 0.0
    return res.tokens, res.ttft_s, tpot, res.figures(info, "measured: the NPU's own logits")


def reference_continuation(src: ModelSource, ids: Sequence[int], max_new_tokens: int,
                           sampler: Sampler, stop_ids: Collection[int] | int | None, *,
                           seed: int = 0) -> list[int]:
    """The float reference's continuation of ``ids`` (same sampling rule and seed), up to
    and with the first of ``stop_ids`` (EOS and the end-of-turn tokens:
    :attr:`models.tokenizer.Tokenizer.stop_ids`; one id or None are taken too)."""
    stops = {stop_ids} if isinstance(stop_ids, int) else set(stop_ids or ())
    # the float weights the compiled model was made from: one copy for both (540 MB of
    # float32 for SmolLM2-135M), the same values as the source's own
    ref = ReferenceModel(src.config, float_weights(src.config, src.weight_spec(seed)))
    ref.reset()
    logits = ref.forward_embeddings(ref.embed(ids), last_only=True)[-1]
    pick, out = sampler.picker(), []
    while True:
        t = pick(logits)
        out.append(t)
        if t in stops or len(out) == max_new_tokens:
            return out
        logits = ref.decode(t)


__all__ = ["Generation", "Sampler", "first_difference", "generate", "reference_continuation"]
