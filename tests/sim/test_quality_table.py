"""The quality table orders as physics says, on the embedded real model (SmolLM2-135M,
W8 weights, the w8 numerics, 257 tokens of the project's English text, integer KV reads):
more KV bits, less KL; at 4 and at 2 bits, keys grouped per channel (KIVI) beat keys
grouped per token."""

from __future__ import annotations

import pytest

from models.source import EMBEDDED_MODEL, english_text, resolve_model
from sim.app.quality import quality_table
from tests.groups import REAL_W8

pytestmark = pytest.mark.xdist_group(REAL_W8)


#: The text of tests/sim/test_numerics_real.py and of benchmarks/kv_quality.py: the int8 row
#: is that test's teacher-forced run (kept by sim.app.quality.evaluate when both run in one
#: process) and the rows are the README table's integer rows. KIVI keeps 128 recent
#: tokens in fp16, so the text must be well beyond that for the formats to differ.
TEXT_TOKENS = 257


def test_more_bits_less_damage_and_per_channel_keys_win() -> None:
    src = resolve_model(EMBEDDED_MODEL)
    ids = src.tokenizer().encode(english_text())[:TEXT_TOKENS]
    assert len(ids) == TEXT_TOKENS
    kl = {label: q.kl_mean for label, q in quality_table(src, ids, bits="W8", numerics="w8",
                                                         read_paths=("integer",))}
    print("KL mean (nats), integer reads:", kl)
    assert kl["int8"] < kl["kivi-4"] < kl["kivi-2"]
    assert kl["kivi-4"] < kl["qserve-kv4"]  # 4 bits: per-channel keys beat per-token keys
    assert kl["kivi-2"] < kl["2-bit per-token"]  # and at 2 bits
