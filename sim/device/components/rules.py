"""How the components' timing rules are written: plain functions over integers and state
arrays, compiled by Numba, that every engine calls.

A component (``dma.py``, ``dram.py``, ``link.py``, ``sram.py``, ``core.py``) states each
of its timing rules once, as a :func:`rule`: how long its work takes, when it starts
(which channel, port, direction or slot it waits for) and what state it leaves. Its SimPy
process (the readable model) calls the rule where it decides, and so does the array loop
(:mod:`sim.device.engine.loop`), which compiles the same function into its own code. So a
rule changed in its one place moves every engine alike, and the engines differ only in
how they schedule the events the rules ask for (``tests/sim/test_engines.py`` holds them
to one timeline, and its ``test_changing_one_timing_parameter_moves_every_engine_identically``
changes one rule's parameter and watches both move by the same picoseconds).

Rules are compiled with ``inline="always"`` (the loop takes their body in place: no call,
no reference counting of the arrays they take) and ``error_model="numpy"`` (their
divisors are validated positive sizes and rates; without the division checks' raise
paths Numba can drop the reference counting around them). Called from Python they run as
ordinary compiled functions (a few microseconds a call: the SimPy engine's price).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: The decorator of a timing rule (see the module's docstring).
rule = njit(cache=True, error_model="numpy", inline="always")


@rule
def transfer_ps(nbytes: int, bytes_per_s: float) -> int:
    """Time to move ``nbytes`` at ``bytes_per_s``, rounded up to a whole picosecond:
    ``ceil(nbytes * 1e12 / bytes_per_s)``, what :func:`sim.units.transfer_ps` computes for a
    float ``bytes_per_s``. With ``nbytes < 2**53`` float(nbytes) is exact and the product
    is the correctly rounded exact product, which is what Python divides too (a test checks
    it)."""
    if nbytes <= 0:
        return 0
    ps = np.ceil(np.float64(nbytes) * 1e12 / bytes_per_s)
    if ps >= 9.2e18:  # past int64 picoseconds (about 106 days)
        raise OverflowError("a transfer time does not fit in int64 picoseconds")
    return int(ps)
