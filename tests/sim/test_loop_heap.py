"""The array loop's event heap (sim/device/engine/loopdefs.py): pushes append and one sift
before each pop orders them, which must pop events in exactly the (time, priority,
insertion id) order, and leave the very heap rows, that a push sifting each entry at
once gives (the loop's timeline depends on both only through the pop order; the rows are
checked too, so the equivalence argued in ``hsift`` is what is tested)."""

import heapq

import numpy as np

from sim.device.engine import loopdefs as lp


def _push_now(h, n, row):
    """The reference: push and sift at once."""
    n = lp.hpush(h, n, *row)
    lp.hsift(h, n - 1, n)
    return n


def test_batched_pushes_pop_in_time_priority_id_order_and_leave_the_same_heap():
    rng = np.random.default_rng(5)
    batched = np.zeros((4096, 5), np.int64)
    at_once = np.zeros((4096, 5), np.int64)
    nb = na = 0
    ordered = 0
    ref: list[tuple[int, int, int]] = []
    eid = 0
    popped = []
    for _ in range(600):
        for _ in range(int(rng.integers(0, 6))):  # an event's pushes
            row = (int(rng.integers(0, 50)), int(rng.integers(0, 2)), eid,
                   int(rng.integers(0, 5)), eid * 7)
            eid += 1
            nb = lp.hpush(batched, nb, *row)
            na = _push_now(at_once, na, row)
            heapq.heappush(ref, row[:3])
        lp.hsift(batched, ordered, nb)
        assert np.array_equal(batched[:nb], at_once[:na])
        if nb and rng.random() < 0.8:
            nb = lp.hpop(batched, nb)
            na = lp.hpop(at_once, na)
            ordered = nb
            popped.append(tuple(batched[nb, :3]))
            assert popped[-1] == heapq.heappop(ref)
            assert np.array_equal(batched[: nb + 1], at_once[: na + 1])
    assert len(popped) > 300
