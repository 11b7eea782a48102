"""Piecewise-linear interpolation of the step-cost grid (:mod:`.costs`): a line through
measured points and a bilinear plane over a grid, both extrapolating linearly past their
ends."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


def _bracket(xs: Sequence[float], x: float) -> tuple[int, float]:
    """Index ``i`` and weight ``w`` with ``x = (1 - w) xs[i] + w xs[i + 1]`` (``w`` outside
    [0, 1] past the ends: linear extrapolation); one point: ``(0, 0.0)``."""
    if len(xs) == 1:
        return 0, 0.0
    i = bisect.bisect_right(xs, x) - 1
    i = min(max(i, 0), len(xs) - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True)
class Line:
    """Piecewise-linear ``f(x)`` through ``(xs[i], ys[i])``."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        i, w = _bracket(self.xs, x)
        if len(self.xs) == 1:
            return self.ys[0]
        return self.ys[i] + w * (self.ys[i + 1] - self.ys[i])


@dataclass(frozen=True)
class Plane:
    """Bilinear ``f(x, y)`` over the grid ``xs x ys`` (``zs[i][j] = f(xs[i], ys[j])``)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    zs: tuple[tuple[float, ...], ...]

    def __call__(self, x: float, y: float) -> float:
        i, u = _bracket(self.xs, x)
        j, v = _bracket(self.ys, y)
        z = self.zs
        if len(self.xs) == 1:
            a = z[0][j] if len(self.ys) == 1 else z[0][j] + v * (z[0][j + 1] - z[0][j])
            return a
        if len(self.ys) == 1:
            return z[i][0] + u * (z[i + 1][0] - z[i][0])
        a = z[i][j] + v * (z[i][j + 1] - z[i][j])
        b = z[i + 1][j] + v * (z[i + 1][j + 1] - z[i + 1][j])
        return a + u * (b - a)
