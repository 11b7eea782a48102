"""Helpers for users' own test suites.

:func:`assert_no_regression` puts ``kvsim regress`` into a pytest (or any) test::

    # tests/test_latency.py of your project
    from sim.testing import assert_no_regression

    def test_latency_has_not_regressed():
        assert_no_regression("configs/regress/baseline.json")

    def test_decode_may_move_half_a_percent():
        assert_no_regression("configs/regress/baseline.json",
                             tolerances={"decode.*": 0.005})

Make the baseline once with ``kvsim regress --create BASELINE CONFIG...``; record a change
on purpose with ``kvsim regress BASELINE --update`` (or run the tests with
``KVSIM_UPDATE_BASELINE=1``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

from rich.console import Console

from sim.app.regress.regress import RegressError, Report, check, print_report, update

#: Set to 1 to rewrite baselines instead of failing (a change recorded on purpose).
UPDATE_ENV = "KVSIM_UPDATE_BASELINE"


def assert_no_regression(baseline_path: str | os.PathLike, *, sets: Sequence[str] = (),
                         scales: Sequence[str] = (),
                         tolerances: Mapping[str, float] | None = None,
                         update_baseline: bool | None = None) -> Report:
    """Run every config of the baseline and raise ``AssertionError`` (with the table of
    old vs new figures, naming each one that moved) when a figure moved beyond its
    tolerance; return the report otherwise.

    ``sets`` (``"key=value"``) and ``scales`` (``"key=factor"``) change every config, as
    ``--set``/``--scale`` do; ``tolerances`` (figure name or pattern -> relative change)
    override the baseline's. ``update_baseline`` (default: the environment variable
    ``KVSIM_UPDATE_BASELINE=1``) rewrites the baseline with the new figures instead.
    Bad input (a broken baseline, a bad config) raises the documented
    :class:`~kvsim.errors.KvsimError` subclasses.
    """
    __tracebackhide__ = True  # pytest: show the caller's line, not this helper's
    if update_baseline is None:
        update_baseline = os.environ.get(UPDATE_ENV, "") == "1"
    if update_baseline:
        if sets or scales:
            raise RegressError("update_baseline records the configs as they are; "
                               "drop sets and scales")
        return update(baseline_path)
    report = check(baseline_path, sets=sets, scales=scales, tolerances=tolerances)
    if not report.ok:
        out = io.StringIO()
        print_report(report, Console(file=out, width=160, color_system=None),
                     moved_only=True)
        raise AssertionError(f"latency regression against {report.baseline}:\n"
                             f"{out.getvalue()}")
    return report


__all__ = ["UPDATE_ENV", "assert_no_regression"]
