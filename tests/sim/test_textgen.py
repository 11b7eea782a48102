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
