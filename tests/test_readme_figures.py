"""The README's figures are a fresh run's (tests/readme_figures.py): every quoted simulated
figure, filled in from its source, stands in the README word for word; the heavy sources
run with ``KVSIM_README_FIGURES=all``, and every quote's words stand in the README whatever
its figures. Wall-clock figures say the machine and the date they were measured on."""

from __future__ import annotations

import os
import re
import string

import pytest

from tests.groups import QUICKSTART
from tests.readme_figures import (
    ASSERTED,
    MEASURED,
    README,
    ROOT,
    SOURCES,
    Fresh,
    missing,
    normalized,
)

HEAVY = os.environ.get("KVSIM_README_FIGURES") == "all"


def _param(src):
    marks = []
    if src.name == "default run":  # reads the suite's one run of the embedded default
        marks.append(pytest.mark.xdist_group(QUICKSTART))
    if src.heavy and not HEAVY:
        marks.append(pytest.mark.skip(reason=f"minutes of runs ({src.command}); "
                                             f"KVSIM_README_FIGURES=all runs it"))
    return pytest.param(src, id=src.name, marks=marks)


@pytest.mark.parametrize("src", [_param(s) for s in SOURCES.values()])
def test_the_readme_quotes_a_fresh_runs_figures(src, tmp_path, request):
    default_run = (request.getfixturevalue("embedded_default_run")
                   if src.name == "default run" else None)
    values = src.produce(Fresh(tmp_path, default_run))
    assert missing(src, values) == [], f"{src.name}: {values}"


def _pattern(quote: str) -> str:
    """A quote with any figures in its fields, as a regular expression."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(quote):
        parts.append(re.escape(re.sub(r"\s+", " ", literal)))
        if name is not None:
            parts.append(r"\S.*?")
    return "".join(parts)


def test_every_quote_stands_in_the_readme_whatever_its_figures():
    text = normalized(README.read_text(encoding="utf-8"))
    lost = [f"{s.name}: {q}" for s in SOURCES.values() for q in s.quotes
            if not re.search(_pattern(q), text)]
    assert lost == []


def test_figures_a_test_asserts_are_the_ones_it_asserts():
    text = normalized(README.read_text(encoding="utf-8"))
    for test, quote in ASSERTED.items():
        assert normalized(quote) in text, quote
        src = (ROOT / test).read_text(encoding="utf-8")
        for figure in re.findall(r"\d+\.\d+", quote):
            assert figure in src, f"{test} does not assert {figure}"


def test_figures_measured_outside_kvsim_stand_in_the_readme():
    """The figures no kvsim run reproduces (AIPerf, the vendor's harness) are quoted as
    measured: each quote stands in the README, beside the command that measured it."""
    text = normalized(README.read_text(encoding="utf-8"))
    assert [q for q in MEASURED if normalized(q) not in text] == []


#: Words that make a README passage a wall-clock figure ("the wall clock", ``--clock wall``
#: and a table's ``wall`` name the clock, not a figure).
WALL = re.compile(r"\bwall\b(?! clock)(?![`|\]])|processor time|wall time")
#: A date, to the day or the month (the project's rule: the machine and the date, e.g.
#: 2026-12).
DATE = re.compile(r"\b20\d\d-\d\d(?:-\d\d)?\b")


def test_wall_clock_figures_say_the_machine_and_the_date():
    blocks = re.split(r"\n\s*\n|\n(?=\|)|\n(?=- )", README.read_text(encoding="utf-8"))
    undated = [b.strip()[:90] for b in blocks if WALL.search(b)
               and not (DATE.search(b) and "2-core" in b)]
    assert undated == []
