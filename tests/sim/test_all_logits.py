"""All-position logits (teacher forcing): one prefill call returns every position's logits,
bit for bit those of the calls that end at each position, at the cost of more LM-head work
and more bytes back over the host link."""

from __future__ import annotations

import numpy as np
import pytest

from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.reference import ReferenceModel
from models.source import load_preset
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model, ModelConfig, RuntimeApiError

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")
N = 12


@pytest.fixture(scope="module")
def cm():
    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(TINY_HW),
                         core_mode="single", max_seq=16, cap=64)


@pytest.fixture(scope="module")
def emb(cm):
    toks = np.random.default_rng(1).integers(0, TINY.vocab_size, size=N)
    return ReferenceModel(TINY, cm.weight_source()).embed(toks)


def _model(cm, *, all_logits: bool) -> tuple[Accelerator, Model]:
    acc = Accelerator(hw=TINY_HW)
    model = Model(cm, ModelConfig(all_logits=all_logits))
    model.launch(acc)
    return acc, model


def test_every_row_equals_the_call_ending_there(cm, emb) -> None:
    acc, model = _model(cm, all_logits=True)
    [rows] = model.infer(emb, all_logits=True)
    assert rows.shape == (N, TINY.vocab_size) and rows.dtype == np.float32
    for i in range(N):
        model.reset_cache_memory()
        [last] = model.infer(emb[: i + 1])
        np.testing.assert_array_equal(rows[i], last)
    assert np.ptp(rows, axis=1).min() > 0  # not constant rows


def test_vendor_form_and_the_default_program_are_unchanged(cm, emb) -> None:
    _, wide = _model(cm, all_logits=True)
    [rows] = wide.infer([emb[None, None]], all_logits=True)
    assert rows.shape == (1, 1, N, TINY.vocab_size)
    _, plain = _model(cm, all_logits=False)
    assert plain.wide is None
    [last] = plain.infer(emb)
    np.testing.assert_array_equal(rows[0, 0, -1], last)
    # the default program does not depend on the option
    a = cm.program(tokens=N, cache_size=0)
    b = wide.wide.program(tokens=N, cache_size=0)
    assert a.instructions == b.instructions


def test_the_extra_head_work_and_bytes_are_timed(cm, emb) -> None:
    acc, model = _model(cm, all_logits=True)
    model.infer(emb)
    last = acc.calls[-1]
    model.reset_cache_memory()
    model.infer(emb, all_logits=True)
    every = acc.calls[-1]
    vocab_bytes = 4 * TINY.vocab_size
    d2h = every.stats["traffic"]["pcie_d2h"] - last.stats["traffic"]["pcie_d2h"]
    assert d2h == (N - 1) * vocab_bytes
    assert every.end_ps - every.start_ps > last.end_ps - last.start_ps


def test_bad_requests_are_refused(cm, emb) -> None:
    _, plain = _model(cm, all_logits=False)
    with pytest.raises(RuntimeApiError, match="ModelConfig\\(all_logits=True\\)"):
        plain.infer(emb, all_logits=True)
    with pytest.raises(RuntimeApiError, match="all_logits must be True or False"):
        plain.infer(emb, all_logits=1)
    with pytest.raises(RuntimeApiError, match="ModelConfig.all_logits"):
        ModelConfig(all_logits="yes")
