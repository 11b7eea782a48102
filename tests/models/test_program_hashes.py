"""The compiler's programs are byte-identical to the committed golden hashes
(``program_hashes.json``; see :mod:`tests.models.program_hashes` to regenerate)."""

from __future__ import annotations

import json

import pytest

from tests.groups import REAL_OTHER
from tests.models.program_hashes import GOLDEN, compute


def _check(which: str, *, first_format_only: bool = False) -> None:
    want = json.loads(GOLDEN.read_text())[which]
    got = compute(slow=which == "slow", first_format_only=first_format_only)
    if first_format_only:
        assert got and set(got) < set(want)
    else:
        assert sorted(got) == sorted(want)
    differ = sorted(k for k in got if got[k] != want[k])
    assert not differ, f"{len(differ)} of {len(got)} programs changed: {differ[:10]}"


def test_programs_of_the_tiny_models_are_unchanged() -> None:
    _check("fast")


@pytest.mark.slow
@pytest.mark.xdist_group(REAL_OTHER)
def test_programs_of_the_real_size_models_are_unchanged() -> None:
    """One KV format per real-size model (one compile each, about a minute); every format
    of them: ``python -m tests.models.program_hashes``."""
    _check("slow", first_format_only=True)
