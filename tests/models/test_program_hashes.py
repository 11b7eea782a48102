"""The compiler's programs are byte-identical to the committed golden hashes
(``program_hashes.json``; see :mod:`tests.models.program_hashes` to regenerate)."""

from __future__ import annotations

import json

import pytest

from tests.models.program_hashes import GOLDEN, SLOW_CASES, STEP_CASES, compute, slow_parts


def _check(which: str, **part) -> dict[str, str]:
    want = json.loads(GOLDEN.read_text())[which]
    got = compute(slow=which == "slow", **part)
    assert got and set(got) <= set(want), sorted(set(got) - set(want))[:10]
    differ = sorted(k for k in got if got[k] != want[k])
    assert not differ, f"{len(differ)} of {len(got)} programs changed: {differ[:10]}"
    return got


def test_programs_of_the_tiny_models_are_unchanged() -> None:
    got = _check("fast")
    assert sorted(got) == sorted(json.loads(GOLDEN.read_text())["fast"])


def _first_format_prefix(model: str, steps: bool) -> str:
    """The golden names of a slow part's first KV format (timing mode: the real-size
    models are compiled for timing only)."""
    if steps:
        [kv] = [case[3] for case in STEP_CASES if case[0] == model and case[4]]
        return f"{model}.{kv}.step."
    [kvs] = [case[5] for case in SLOW_CASES if case[0] == model]
    return f"{model}.{kvs[0]}.timing."


@pytest.mark.slow
@pytest.mark.parametrize(("model", "steps"), slow_parts(),
                         ids=[f"{m}-{'steps' if s else 'calls'}" for m, s in slow_parts()])
def test_programs_of_the_real_size_models_are_unchanged(model: str, steps: bool) -> None:
    """One KV format per real-size model, one compile per test (each a part, so that the
    workers share them); every format of them: ``python -m tests.models.program_hashes``."""
    got = _check("slow", first_format_only=True, model=model, steps=steps)
    prefix = _first_format_prefix(model, steps)
    want = json.loads(GOLDEN.read_text())["slow"]
    assert sorted(got) == sorted(k for k in want if k.startswith(prefix))


def test_the_slow_parts_cover_every_real_size_case() -> None:
    parts = slow_parts()
    assert len(set(parts)) == len(parts)
    assert {m for m, s in parts if not s} == {case[0] for case in SLOW_CASES}
    assert {m for m, s in parts if s} == {case[0] for case in STEP_CASES if case[4]}
    # every golden name of the slow set belongs to a part's model
    want = json.loads(GOLDEN.read_text())["slow"]
    assert all(any(k.startswith(f"{m}.") for m, _ in parts) for k in want)
