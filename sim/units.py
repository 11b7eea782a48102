"""The one unit module of kvsim.

Simulated time is an integer number of picoseconds (``env.now``). Every clock domain
converts its cycles to picoseconds here; conversion to microseconds or seconds happens
only at the edges (traces, reports, metrics).

Byte multiples: ``KiB``/``MiB``/``GiB`` are binary (2**10...), ``KB``/``MB``/``GB`` are
decimal (10**3...). Bandwidths are always in bytes per second.
"""

from __future__ import annotations

import math

PS_PER_S = 10**12
PS_PER_NS = 10**3
PS_PER_US = 10**6

KiB = 2**10
MiB = 2**20
GiB = 2**30
KB = 10**3
MB = 10**6
GB = 10**9
T = 10**12


def ns_to_ps(ns: float) -> int:
    """Nanoseconds to integer picoseconds (rounded to nearest)."""
    return int(round(ns * PS_PER_NS))


def s_to_ps(seconds: float) -> int:
    return int(round(seconds * PS_PER_S))


def ps_to_s(ps: int) -> float:
    return ps / PS_PER_S


def ps_to_us(ps: int) -> float:
    return ps / PS_PER_US


def cycles_to_ps(cycles: int, clock_hz: float) -> int:
    """Duration of ``cycles`` clock cycles, rounded up to a whole picosecond."""
    if cycles <= 0:
        return 0
    return math.ceil(cycles * PS_PER_S / clock_hz)


def transfer_ps(nbytes: int, bytes_per_s: float) -> int:
    """Time to move ``nbytes`` at ``bytes_per_s``, rounded up to a whole picosecond."""
    if nbytes <= 0:
        return 0
    return math.ceil(nbytes * PS_PER_S / bytes_per_s)
