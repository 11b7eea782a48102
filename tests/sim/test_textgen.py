"""The pieces of ``kvsim generate``: where two continuations first differ, and greedy or
seeded sampling."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from sim.app.textgen import Sampler, first_difference


@pytest.mark.parametrize(("a", "b", "at"), [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2),
    ([], [], None), ([4], [], 0),
])
def test_first_difference(a, b, at) -> None:
    assert first_difference(a, b) == at


def test_greedy_takes_the_argmax_and_sampling_is_seeded() -> None:
    logits = np.array([0.0, 3.0, 1.0, 2.9])
    assert Sampler().picker()(logits) == 1
    draws = [Sampler(temperature=1.0, seed=7).picker() for _ in range(2)]
    a = [draws[0](logits) for _ in range(50)]
    b = [draws[1](logits) for _ in range(50)]
    assert a == b and len(set(a)) > 1  # same seed, same draws; not stuck on the argmax
    cold = Sampler(temperature=1e-3, seed=1).picker()
    assert {cold(logits) for _ in range(20)} == {1}


@pytest.mark.parametrize("t", [-0.5, float("nan"), float("inf")])
def test_bad_temperatures_are_refused(t) -> None:
    with pytest.raises(ConfigError, match="temperature: must be a finite number >= 0"):
        Sampler(temperature=t)


class _Scripted:
    """A sampler that picks the given tokens in turn (the logits are ignored)."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def picker(self):
        it = iter(self.tokens)
        return lambda logits: next(it)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny GGUF whose vocabulary ends in two control tokens: ``<|endoftext|>`` (its
    end-of-sequence id) and ``<|im_end|>`` (a chat turn's end, as in SmolLM2)."""
    from models.source import resolve_model
    from models.weights import SyntheticWeights
    from tests.models.model_files import TINY_LLAMA, byte_tokens, write_gguf

    tokens = byte_tokens()[:254] + ["<|endoftext|>", "<|im_end|>"]
    path = write_gguf(tmp_path_factory.mktemp("chat") / "chat.gguf", TINY_LLAMA,
                      SyntheticWeights(TINY_LLAMA, seed=0), tokens=tokens,
                      token_types=[1] * 254 + [3, 3],
                      edit=lambda g: g.add_eos_token_id(254))
    return resolve_model(path)


def test_a_continuation_stops_at_the_end_of_a_chat_turn_and_its_text_leaves_it_out(chat_model):
    from sim.app.textgen import reference_continuation

    tok = chat_model.tokenizer()
    assert tok.eos_id == 254 and tok.stop_ids == frozenset({254, 255})
    ids = tok.encode("Hi")
    out = reference_continuation(chat_model, ids, 8, _Scripted([ord("O"), ord("k"), 255, 65]),
                                 tok.stop_ids)
    assert out == [ord("O"), ord("k"), 255]  # stopped at <|im_end|>, not only at the EOS
    assert tok.continuation_text(out) == "Ok"  # no literal <|im_end|>
    assert tok.continuation_text([ord("O"), 254, ord("k")]) == "O"  # the text ends at a stop
    assert tok.decode(out) == "Ok<|im_end|>"  # the tokens themselves are kept whole


def test_the_reference_runs_before_the_compile_and_the_generation_is_the_same(chat_model,
                                                                              monkeypatch):
    """The float reference's continuation comes first (its K/V cache is gone before the
    compiled model and its caches exist: an 8K generate's peak memory), then the NPU's;
    run again, every figure is the same."""
    from models.bits import BitConfig
    from sim.app import textgen

    def run():
        return textgen.generate(chat_model, "Hi there", max_new_tokens=3, bits=BitConfig(),
                                hw="tiny", allow_degenerate=True).as_dict()

    first = run()
    order: list[str] = []
    for name in ("reference_continuation", "ready_for_text"):
        real = getattr(textgen, name)

        def spy(*a, _real=real, _name=name, **k):
            order.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(textgen, name, spy)
    assert run() == first
    assert order == ["reference_continuation", "ready_for_text"]
