"""A whole program's event loop in Numba, with SimPy's exact event order.

The SimPy engine (:mod:`sim.device.engine.processes`) runs the device's processes (one
generator per engine queue, per multi-chunk DMA chunk, per attention stream) at Python
speed. This loop runs the *same* processes written out as explicit state machines over
arrays, so one program costs a few machine instructions per event instead of a few Python
calls. The timing itself is the components' rules (``sim/device/components``), which the
state machines call where the processes do: nothing here says how long anything takes.

What is kept exactly is what makes the two timelines identical: every event SimPy
schedules is scheduled here too, at the same time, with the same priority and the next
insertion id, and processed in ``(time, priority, id)`` order; resources (DMA slots),
flags (counting semaphores), DRAM channel calendars, SRAM ports and link directions are
updated at the same points of the same processes. The state machines, one module per
process they mirror, step by step:

- :mod:`~sim.device.engine.mirror_queue`: ``processes.queue`` (dispatch, waits, sync, the
  instruction's work, signals) and the program's join;
- :mod:`~sim.device.engine.mirror_dma`: ``DmaEngine.transfer``, ``DmaEngine._chunk``,
  ``Dram.access``;
- :mod:`~sim.device.engine.mirror_link`: ``HostLink.transfer`` (both kinds);
- SimPy's ``Resource``, ``Container``, ``AllOf`` and process start and end events:
  :mod:`~sim.device.engine.loopprocs` and :func:`_callback` here.

This module is the dispatcher: :func:`run_program` grows the arrays between calls of
:func:`_events`, which takes the next event, runs its callback or resumes its process, and
steps the process through its states (each state's number says which module's step runs
it) until it waits again. ``_events`` is compiled without reference counting (it
allocates nothing), so the steps it takes in (inlined) pay no atomic count for the arrays
they touch.

The loop does not touch memory bytes or the recorder: it returns logs (instruction
starts and ends, DRAM bursts, link chunks, DMA chunks) that the caller replays, in order,
into the stats, the functional semantics and the recorder.
"""

from __future__ import annotations

from numba import njit

from sim.device.engine import loopdefs as lp
from sim.device.engine import loopprocs as kp
from sim.device.engine.loopdefs import DeviceArrays, LoopState, ProgramArrays
from sim.device.engine.loopprocs import new_state
from sim.device.engine.mirror_dma import access_step, chunk_step, transfer_step
from sim.device.engine.mirror_link import link_step
from sim.device.engine.mirror_queue import queue_step

__all__ = ["DeviceArrays", "LoopState", "ProgramArrays", "new_state", "run_program"]


@njit(cache=True, error_model="numpy")
def run_program(state: LoopState, flush_at: int, prog: ProgramArrays, dev: DeviceArrays,
                log_level: int, direct: bool = True) -> tuple:
    """Runs one program from ``state`` (:func:`new_state`: time, insertion ids, the
    processes, flags, resources, results), which it updates, until it is done or, with
    ``flush_at > 0``, until its logs hold at least ``flush_at`` rows between two events:
    the caller replays them and calls again with the state returned (logs start afresh).
    Updates the components' state in ``dev`` in place. ``log_level``: 0 no logs, 1
    instruction spans and bytes moved, 2 also chunk spans. With ``direct`` (the default)
    the next event is taken straight from where it was appended when it is the smallest
    (:func:`loopdefs.hnext`); false sifts and pops every event (the same timeline:
    tests/sim/test_loop_direct.py).

    Returns ``(state, nlogs)``: the state, the first ``nlogs`` rows of its logs the
    recorder's reports in order.
    """
    sc = state.sc
    heap, P, logs = state.heap, state.P, state.logs
    if not sc[lp.SC_STARTED]:
        sc[lp.SC_STARTED] = 1
        heap, sc[lp.SC_HS], sc[lp.SC_EID], sc[lp.SC_NP] = kp.start_processes(
            heap, sc[lp.SC_HS], P, sc[lp.SC_NP], sc[lp.SC_NOW], sc[lp.SC_EID],
            prog.q_ptr.shape[0] - 1, prog.q_ptr)
    sc[lp.SC_PAUSED] = 0
    # the heap's rows before ``ordered`` are in heap order; pushes append after them
    hs = sc[lp.SC_HS]
    lp.hsift(heap, 0, hs)
    ordered = hs
    nl = 0
    pending = -1  # a process stopped between two steps for room in the arrays
    extra = 0  # the heap rows it needs besides a row per process and four
    log_room = 4 + dev.dram.free.shape[0]  # a step logs one row, a DRAM access one a channel
    while True:
        # The heap keeps a row for each process a step or a callback may resume, besides
        # the few rows a step pushes itself (the waiter queues' helpers do not grow it).
        if pending >= 0 or hs + sc[lp.SC_NP] + 4 > heap.shape[0]:
            heap = lp.grow_to(heap, hs + sc[lp.SC_NP] + 4 + extra)
            P = lp.grow_to(P, sc[lp.SC_NP] + 4)
            logs = lp.grow_to(logs, nl + log_room)
            extra = 0
        state = LoopState(sc, heap, P, state.level, state.f_head, state.f_tail, state.users,
                          state.r_head, state.r_tail, state.order, state.pair_bytes,
                          state.pair_first, logs, state.blocked, state.counts)
        hs, ordered, nl, pending, extra, done = _events(
            state, hs, ordered, nl, pending, flush_at, log_room, prog, dev, log_level, direct)
        if done:
            sc[lp.SC_HS] = hs
            return state, nl


@njit(cache=True, error_model="numpy", _nrt=False)
def _events(ls, hs, ordered, nl, pending, flush_at, log_room, prog, dev, log_level, direct):
    """Processes events until the program is done, its logs are due (``flush_at``) or its
    arrays need room: returns ``(hs, ordered, nl, pending, extra, done)``, ``pending`` the
    process stopped for room (-1: none) and ``extra`` the heap rows it needs."""
    sc, heap, P = ls.sc, ls.heap, ls.P
    now, eid = sc[lp.SC_NOW], sc[lp.SC_EID]
    extra = 0
    done = False
    while True:
        if pending >= 0:
            # run the stopped process on from the step it stopped at (its state is in P;
            # the same event goes on)
            p = pending
            pending = -1
        else:
            if hs + sc[lp.SC_NP] + 4 > heap.shape[0]:
                break  # to grow
            if hs == 0:
                done = True
                break
            if flush_at > 0 and nl >= flush_at:
                sc[lp.SC_PAUSED] = 1
                done = True
                break
            hs, ordered = lp.hnext(heap, ordered, hs, direct)
            now = heap[hs, 0]
            kind = heap[hs, 3]
            p = heap[hs, 4]
            if kind != lp.CB_RESUME:
                hs, eid, joined = _callback(kind, p, now, hs, eid, ls, dev.dma.cap)
                if joined:
                    sc[lp.SC_RESULT] = lp.R_DONE
                    done = True
                    break
                continue
        # run process p until it waits again or returns
        while True:
            if (hs + sc[lp.SC_NP] + 4 > heap.shape[0] or sc[lp.SC_NP] + 4 > P.shape[0]
                    or nl + log_room > ls.logs.shape[0]):
                pending = p  # stop for room before this step
                break
            st = P[p, lp.F_STATE]
            if st < lp.S_TRANSFER:
                hs, eid, nl, what, extra = queue_step(p, now, hs, eid, nl, ls, prog, dev,
                                                      log_level)
            elif st < lp.S_CHUNK:
                hs, eid, nl, what, extra = transfer_step(p, now, hs, eid, nl, ls, dev.dma)
            elif st < lp.S_ACCESS:
                hs, eid, nl, what, extra = chunk_step(p, now, hs, eid, nl, ls, dev.sram,
                                                      log_level)
            elif st < lp.S_LINK:
                hs, eid, nl, what, extra = access_step(p, now, hs, eid, nl, ls, dev.dram,
                                                       log_level)
            elif st < lp.S_END:
                hs, eid, nl, what, extra = link_step(p, now, hs, eid, nl, ls, dev.link,
                                                     log_level)
            else:
                # S_END or a return: the process's own event (its parent's all_of counts
                # it when processed)
                hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_END, p)
                P[p, lp.F_STATE] = -1
                what = lp.WAITS
            if what == lp.WAITS:
                break
            if what == lp.ROOM:
                pending = p
                break
        if pending >= 0:
            break  # to grow
    sc[lp.SC_NOW] = now
    sc[lp.SC_EID] = eid
    return hs, ordered, nl, pending, extra, done


@njit(cache=True, error_model="numpy", inline="always")
def _callback(kind, arg, now, hs, eid, ls, res_cap):
    """The callback of an event that resumes no process by itself: a released DMA slot
    granted to the head of its queue, a flag's count served to its waiters, or a part of
    an all_of done (a process ended, or the all_of's timeout): the all_of triggers when
    its last part is. Returns ``(hs, eid, whether the program's join ended)``."""
    P, heap = ls.P, ls.heap
    if kind == lp.CB_GRANT:
        hs, eid = kp.grant(heap, hs, eid, now, arg, ls.users, res_cap, ls.r_head, ls.r_tail, P)
        return hs, eid, False
    if kind == lp.CB_SERVE:
        hs, eid = kp.serve_flag(heap, hs, eid, now, arg, ls.level, ls.f_head, ls.f_tail, P)
        return hs, eid, False
    parent = arg  # CB_CHECK: a timeout of the all_of of process ``arg``
    if kind == lp.CB_END:
        if P[arg, lp.F_TYPE] == lp.P_JOIN:
            return hs, eid, True
        parent = P[arg, lp.F_PARENT]
        kp.free_record(P, ls.sc, arg)
    P[parent, lp.F_AO_COUNT] += 1
    if (P[parent, lp.F_AO_ON] == 1 and P[parent, lp.F_AO_TRIG] == 0
            and P[parent, lp.F_AO_COUNT] == P[parent, lp.F_AO_N]):
        P[parent, lp.F_AO_TRIG] = 1
        hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_RESUME, parent)
    return hs, eid, False
