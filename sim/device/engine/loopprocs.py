"""SimPy's primitives over arrays, for the array event loop (:mod:`sim.device.engine.loop`):
process records, a counting semaphore's waiters (``Container.get`` and serving its queue),
a resource's grant (``Resource.request`` and release), and the loop's initial state.

Each helper does exactly what SimPy (4.1: ``simpy/core.py``, ``events.py``,
``resources/``) does at the point the loop calls it: the same events in the same order,
at the same time and priority, with the next insertion ids. What fixes that order:

- one heap of ``(time, priority, insertion id, event)``; URGENT (0) for a process's
  start, NORMAL (1) for everything else; every scheduling takes the next insertion id;
- an event's callbacks run in the order they were added; a process that yields an event
  already processed continues at once, otherwise it is resumed by the event's callback;
- a process's own event is scheduled (NORMAL, now) when its generator returns;
- ``all_of`` succeeds (scheduled NORMAL, now) when the last of its events is processed;
- ``Container`` (unbounded, amounts of 1): a put raises the level at once and schedules
  its event, whose processing serves waiting gets in FIFO order while the level allows;
  a get is served at once (in FIFO order behind older waiters) or waits;
- ``Resource``: a request is granted at once if a slot is free and it is at the head of
  the queue; a release frees the slot at once and schedules its event, whose processing
  grants the head of the queue (at most one grant per trigger, as SimPy's ``_do_put``
  returns a false value).

The helpers that may schedule events take the heap (with room for what they push) and
return its new size and the next insertion id.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.device.engine import loopdefs as lp


@njit(cache=True, error_model="numpy", inline="always")
def spawn(P: np.ndarray, sc: np.ndarray) -> int:
    """A process record for a new process: the first free one (``sc[SC_FREE]``), else the
    next unused (``sc[SC_NP]``). ``P`` must have a row to spare."""
    c = sc[lp.SC_FREE]
    if c >= 0:
        sc[lp.SC_FREE] = P[c, lp.F_NEXT]
        return c
    c = sc[lp.SC_NP]
    sc[lp.SC_NP] = c + 1
    return c


@njit(cache=True, error_model="numpy", inline="always")
def free_record(P: np.ndarray, sc: np.ndarray, p: int) -> None:
    """Process record ``p`` is free again (its process has ended and been counted)."""
    P[p, lp.F_NEXT] = sc[lp.SC_FREE]
    sc[lp.SC_FREE] = p


# The waiter queues' helpers are called, not inlined, and compiled without reference
# counting (they allocate nothing; the heap has room for a push per waiting process, see
# ``programloop``): inlined, each array they take costs an atomic increment and decrement
# per call, about a fifth of a decode step's loop time before they were called instead.
@njit(cache=True, error_model="numpy", _nrt=False)
def enqueue(P: np.ndarray, head: np.ndarray, tail: np.ndarray, x: int, p: int) -> None:
    """Process ``p`` joins the back of waiter queue ``x`` (of a flag or a resource)."""
    P[p, lp.F_NEXT] = -1
    if tail[x] >= 0:
        P[tail[x], lp.F_NEXT] = p
    else:
        head[x] = p
    tail[x] = p


@njit(cache=True, error_model="numpy", inline="always")
def resume_head(heap: np.ndarray, hs: int, eid: int, now: int, q: int, head: np.ndarray,
                tail: np.ndarray, P: np.ndarray) -> tuple:
    """Take the process at the head of queue ``q`` (linked through ``F_NEXT``) off it and
    schedule its resumption (NORMAL, now) in row ``hs`` of the heap (which must exist);
    returns ``(hs, eid)``."""
    w = head[q]
    head[q] = P[w, lp.F_NEXT]
    if head[q] < 0:
        tail[q] = -1
    hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, w)
    return hs, eid + 1


@njit(cache=True, error_model="numpy", inline="always")
def wait_all(heap: np.ndarray, hs: int, eid: int, now: int, P: np.ndarray, p: int,
             n: int) -> tuple:
    """``all_of`` the ``n`` children of ``p``: armed, and if every one has already ended,
    ``p`` resumes now (NORMAL), as SimPy's condition fires when it is created already
    met; returns ``(hs, eid)``."""
    P[p, lp.F_AO_N] = n
    P[p, lp.F_AO_ON] = 1
    if P[p, lp.F_AO_COUNT] == n:
        P[p, lp.F_AO_TRIG] = 1
        hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_RESUME, p)
    return hs, eid


@njit(cache=True, error_model="numpy", _nrt=False)
def serve_flag(heap: np.ndarray, hs: int, eid: int, now: int, f: int, level: np.ndarray,
               f_head: np.ndarray, f_tail: np.ndarray, P: np.ndarray) -> tuple:
    """``Container`` serving its get queue: while flag ``f`` has a count and a waiter,
    take one and resume the waiter (NORMAL, now); returns ``(hs, eid)``. The heap must
    have a row to spare for each process waiting on ``f``."""
    while f_head[f] >= 0 and level[f] >= 1:
        level[f] -= 1
        hs, eid = resume_head(heap, hs, eid, now, f, f_head, f_tail, P)
    return hs, eid


@njit(cache=True, error_model="numpy", _nrt=False)
def grant(heap: np.ndarray, hs: int, eid: int, now: int, r: int, users: np.ndarray,
          res_cap: np.ndarray, r_head: np.ndarray, r_tail: np.ndarray,
          P: np.ndarray) -> tuple:
    """``Resource`` granting a slot: if resource ``r`` has a waiter and a free slot, the
    head of its queue holds it and resumes (NORMAL, now); returns ``(hs, eid)``. The heap
    must have a row to spare."""
    if r_head[r] >= 0 and users[r] < res_cap[r]:
        users[r] += 1
        hs, eid = resume_head(heap, hs, eid, now, r, r_head, r_tail, P)
    return hs, eid


def new_state(now: int, eid: int, queues: int, flags: int, resources: int,
              instructions: int, pairs: int, *, log_level: int,
              keep_order: bool) -> lp.LoopState:
    """The state :func:`sim.device.engine.loop.run_program` starts a program from: at
    time ``now`` with insertion ids from ``eid``, no process started, every flag empty and
    every resource free.

    The state's scalars (``loopdefs.SC_*``) hold the result,
    whether the run paused, the time and next insertion id, the DRAM bytes read and
    written, how many instructions ended and their ops, and the events left scheduled
    (none after a complete program); its arrays: ``order`` the instructions in the order
    they ended (if the state was made to keep it), ``logs`` rows the recorder's reports in
    order (level 0: none, 1: instruction spans and bytes moved, 2: also chunk spans; the
    first ``nlogs``), ``blocked[q]`` = ``(instruction, flag)`` for each queue waiting on a
    flag it found empty, else ``-1``; ``counts[q]`` = (dispatches done, syncs done, order
    of the first dispatch, order of the first sync, busy ps, order of the first
    instruction ended; -1: none); ``pair_bytes[k]`` the bytes
    of the stats additions of pair ``k`` (made when an instruction's timing begins) and
    ``pair_first[k]`` the order of its first addition (-1: none).
    """
    sc = np.zeros(lp.SC_FIELDS, np.int64)
    sc[lp.SC_NOW] = now
    sc[lp.SC_EID] = eid
    sc[lp.SC_FREE] = -1
    sc[lp.SC_RESULT] = lp.R_DEADLOCK
    counts = np.full((max(queues, 1), 6), -1, np.int64)
    counts[:, :2] = 0
    counts[:, 4] = 0
    return lp.LoopState(
        sc,
        np.zeros((256, 5), np.int64),  # the event heap
        np.zeros((max(64, 2 * queues + 8), lp.P_FIELDS), np.int64),  # the processes
        np.zeros(flags, np.int64),  # flag levels, waiter queues
        np.full(flags, -1, np.int64),
        np.full(flags, -1, np.int64),
        np.zeros(resources, np.int64),  # resource users, waiter queues
        np.full(resources, -1, np.int64),
        np.full(resources, -1, np.int64),
        np.zeros(instructions if keep_order else 0, np.int32),
        np.zeros(pairs, np.int64),
        np.full(pairs, -1, np.int64),
        np.zeros((1024 if log_level else 1, lp.LOG_FIELDS), np.int64),
        np.full((max(queues, 1), 2), -1, np.int64),
        counts,
    )


@njit(cache=True, error_model="numpy", inline="always")
def start_processes(heap: np.ndarray, hs: int, P: np.ndarray, np_used: int, now: int,
                    eid: int, nq: int, q_ptr: np.ndarray) -> tuple:
    """The program's start (``processes.start``): the engine queues' processes, in queue
    order, then the join, each with an URGENT event, in the next records of ``P`` (which
    must have ``nq + 1`` rows to spare); returns ``(heap, hs, eid, np_used)``."""
    for q in range(nq + 1):
        p = np_used + q
        if q < nq:
            P[p, lp.F_TYPE] = lp.P_ENGINE
            P[p, lp.F_STATE] = lp.S_E_LAUNCH
            P[p, lp.F_Q] = q
            P[p, lp.F_POS] = q_ptr[q]
            P[p, lp.F_PARENT] = np_used + nq
        else:
            P[p, lp.F_TYPE] = lp.P_JOIN
            P[p, lp.F_STATE] = lp.S_JOIN_INIT
            P[p, lp.F_PARENT] = -1
        if hs + 2 > heap.shape[0]:
            heap = lp.grow(heap)
        hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, p)
        eid += 1
    return heap, hs, eid, np_used + nq + 1


@njit(cache=True, error_model="numpy", inline="always")
def set_transfer(P: np.ndarray, p: int, ins: np.ndarray, ri: int, base: int) -> None:
    """Process ``p`` is to run transfer ``base`` (``I_DIR1`` or ``I_DIR2``: direction,
    source, destination, bytes) of instruction row ``ri``, on its resource and core."""
    P[p, lp.F_T_RES] = ins[ri, lp.I_RES]
    P[p, lp.F_CORE] = ins[ri, lp.I_CORE]
    P[p, lp.F_T_DIR] = ins[ri, base]
    P[p, lp.F_T_SRC] = ins[ri, base + 1]
    P[p, lp.F_T_DST] = ins[ri, base + 2]
    P[p, lp.F_T_N] = ins[ri, base + 3]
