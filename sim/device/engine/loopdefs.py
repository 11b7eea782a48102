"""Constants and helpers of the array event loop (:mod:`sim.device.engine.loop`):
priorities, callback kinds, instruction kinds and table columns, process types, fields
and states, log codes, what a step returns, the arrays the loop takes (named tuples), and
the binary heap over ``(time, priority, insertion id)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from sim.device.components import dma
from sim.device.components.dram import SPAN_BYTES, SPAN_CHANNEL, SPAN_START, SPAN_STOP, chunk_spans

URGENT = 0
NORMAL = 1

# --- callback kinds of a scheduled event --------------------------------------------------
CB_RESUME = 0  # resume process ``arg``
CB_END = 1  # process ``arg`` has ended: count it in its parent's all_of
CB_CHECK = 2  # a part (a timeout) of process ``arg``'s all_of is done
CB_GRANT = 3  # a resource ``arg`` was released: grant the head of its queue
CB_SERVE = 4  # flag ``arg`` was given a count: serve its waiters

# --- instruction kinds -----------------------------------------------------------------------
K_COMPUTE = 0  # one timeout of I_DUR (none when 0)
K_DMA = 1  # one DMA transfer, run in the engine's own process
K_LINK = 2  # one host-link transfer (pcie), run in the engine's own process
K_PAR = 3  # timeout of I_DUR in parallel with 1 or 2 stream transfers (own processes)

# --- DMA directions: those of ``sim.device.components.dma`` -------------------------------
D_LOAD, D_STORE, D_COPY, D_READ, D_WRITE = dma.LOAD, dma.STORE, dma.COPY, dma.READ, dma.WRITE

# --- instruction fields (columns of the table of distinct rows) ---------------------------
I_KIND = 0
I_DUR = 1
I_RES = 2
I_CORE = 3
I_NSUB = 4
I_DIR1 = 5
I_SRC1 = 6
I_DST1 = 7
I_N1 = 8
I_DIR2 = 9
I_SRC2 = 10
I_DST2 = 11
I_N2 = 12
I_FLAGS = 13  # FL_* bits
I_OPS = 14  # integer ops, added to the stats when the instruction ends
I_NADD = 15  # stats additions when its timing begins (0-2): (link, kind) pair, bytes
I_PAIR1 = 16
I_BYTES1 = 17
I_PAIR2 = 18
I_BYTES2 = 19
I_FIELDS = 20

# --- instruction flag bits (column I_FLAGS) ---------------------------------------------------
FL_DISPATCH = 1  # pays the dispatch cost (every instruction but a Nop)
FL_CROSS = 2  # waits on a flag another core signals (pays the barrier sync)

# --- process types and fields --------------------------------------------------------------
P_ENGINE = 0
P_JOIN = 1
P_XFER = 2  # a stream transfer of an attention / KV instruction
P_CHUNK = 3  # one chunk of a multi-chunk transfer
P_ACCESS = 4  # a DRAM access of a shared-DRAM host copy's chunk

F_TYPE = 0
F_STATE = 1
F_PARENT = 2
F_NEXT = 3  # next in a waiter queue (flag or resource)
F_Q = 4  # engine: queue
F_POS = 5  # engine: position in its queue
F_WK = 6  # engine: next wait of the current instruction
F_ISTART = 7  # engine: start of the current instruction
F_AO_N = 8  # all_of: parts, parts done, waiting on it, triggered
F_AO_COUNT = 9
F_AO_ON = 10
F_AO_TRIG = 11
F_T_RES = 12  # transfer: resource, direction, src, dst, total bytes, next offset
F_T_DIR = 13
F_T_SRC = 14
F_T_DST = 15
F_T_N = 16
F_T_OFF = 17
F_T_RET = 18  # state to continue at when the transfer is done
F_C_DIR = 19  # chunk: direction, src, dst, bytes, start, SRAM port done, core
F_C_SRC = 20
F_C_DST = 21
F_C_N = 22
F_C_START = 23
F_C_PORT = 24
F_C_RET = 25
F_A_ADDR = 26  # DRAM access: address, bytes, write, state to continue at
F_A_N = 27
F_A_W = 28
F_A_RET = 29
F_L_DIR = 30  # link transfer: direction, bytes, next offset, bytes done in ps, chunk start
F_L_N = 31
F_L_OFF = 32
F_L_DONE = 33
F_L_START = 34
F_L_NN = 35
F_L_RET = 36
F_CORE = 37
F_C_K = 38  # chunk: its next DRAM access (``dma.chunk_access``)
F_L_ADDR = 39  # link transfer: its DRAM address
P_FIELDS = 40

# --- process states, by the process they mirror (the loop dispatches on the tens) --------------
S_E_NEXT = 0
S_E_WAIT = 1
S_E_RESUMED_WAIT = 2
S_E_TIMING = 3
S_E_FINISH = 4
S_E_LAUNCH = 7  # the program's launch, before the first instruction
S_E_DISPATCHED = 8  # the instruction's dispatch is done: count it, then wait for flags
S_E_SYNCED = 9  # the cross-core sync is done: count it, then begin the timing
S_JOIN_INIT = 5
S_T_START = 10
S_T_SETUP_DONE = 11
S_T_SINGLE_GOT = 12
S_T_MULTI_GOT = 13
S_T_DONE = 14
S_T_SINGLE_RET = 15  # a transfer's single chunk (run in its own process) is done
S_C_START = 20
S_C_NEXT = 21  # the chunk's next DRAM access, or its SRAM port when none is left
S_C_PORT_DONE = 23
S_A_START = 30
S_A_AFTER_LAT = 31
S_A_DONE = 32
S_L_START = 40
S_L_CHUNK = 41
S_L_AFTER_WAIT = 42
S_L_AFTER_CHUNK = 43
S_END = 50  # the process returns
S_XFER_RET = 51  # a P_XFER's transfer is done
S_CHUNK_RET = 52  # a P_CHUNK's chunk is done
S_ACCESS_RET = 54  # a P_ACCESS's DRAM access is done

#: The first state of each group: the queue's (and the join's), a DMA transfer's, a chunk's,
#: a DRAM access's, a link transfer's; from S_END on, a process's return.
S_QUEUE, S_TRANSFER, S_CHUNK, S_ACCESS, S_LINK = 0, 10, 20, 30, 40

# --- what a step returns (its process's state is in ``P[p, F_STATE]``) ---------------------------
GO_ON = 0  # the process goes on at its state (after the loop checks its arrays' room)
WAITS = 1  # the process waits for an event it scheduled (or queued for)
ROOM = 2  # the process stops before its state for room in the heap (the step's ``extra`` rows)

# --- log codes ---------------------------------------------------------------------------------
LOG_INS = 0  # queue, instruction, start, end
LOG_DRAM = 1  # channel, start, stop, bytes, write
LOG_LINK = 2  # direction, start, end, bytes
LOG_CHUNK = 3  # resource, direction, start, end, bytes
LOG_FIELDS = 6

# --- results -----------------------------------------------------------------------------------
R_DONE = 0
R_DEADLOCK = 1

# --- the loop's scalars between calls (``programloop.new_state``) ----------------------------
SC_NOW = 0
SC_EID = 1
SC_HS = 2  # events scheduled (the heap's size)
SC_NP = 3  # process records used
SC_FREE = 4  # first free process record (-1: none)
SC_ND = 5  # instructions ended
SC_OPS = 6  # their ops
SC_NPAIRS = 7  # stats pairs seen
SC_DREAD = 8  # DRAM bytes read, written
SC_DWRITE = 9
SC_FDISP = 10  # queues seen first dispatching, syncing, ending an instruction
SC_FSYNC = 11
SC_FDONE = 12
SC_RESULT = 13
SC_STARTED = 14
SC_PAUSED = 15  # the run stopped to hand over its logs
SC_FIELDS = 16



# --- the arrays the loop takes, in named tuples (Numba reads their fields by name) ---------------
class LoopState(NamedTuple):
    """The loop's state between calls (``loopprocs.new_state`` makes it; the loop grows
    ``heap``, ``P`` and ``logs`` and returns it anew)."""

    sc: np.ndarray  # the scalars (``SC_*``)
    heap: np.ndarray  # the event heap: rows (time, priority, insertion id, callback, arg)
    P: np.ndarray  # the process records (``F_*``)
    level: np.ndarray  # per flag: its count, and its queue of waiting processes
    f_head: np.ndarray
    f_tail: np.ndarray
    users: np.ndarray  # per DMA engine: the slots in use, and its queue of waiting processes
    r_head: np.ndarray
    r_tail: np.ndarray
    order: np.ndarray  # the instructions in the order they ended (if kept)
    pair_bytes: np.ndarray  # per stats pair: its bytes, and the order of its first addition
    pair_first: np.ndarray
    logs: np.ndarray  # the recorder's reports in order (``LOG_*``)
    blocked: np.ndarray  # per queue: (instruction, flag) it waits on, else -1
    counts: np.ndarray  # per queue: dispatches, syncs, their first orders, busy ps, ...


class ProgramArrays(NamedTuple):
    """A program's tables (:class:`sim.device.engine.tables.Tables`): the row of each
    instruction, its waits and signals (dense flags), the queues' instructions."""

    ins: np.ndarray
    row_of: np.ndarray
    w_ptr: np.ndarray
    w_flag: np.ndarray
    s_ptr: np.ndarray
    s_flag: np.ndarray
    q_ptr: np.ndarray
    q_items: np.ndarray


class DmaArrays(NamedTuple):
    """The DMA engines by ``I_RES`` (``processes.resources``): slots, set-up ps, chunk."""

    cap: np.ndarray
    setup_ps: np.ndarray
    chunk_bytes: np.ndarray


class DramArrays(NamedTuple):
    """The DRAM's state and parameters, as its rule ``chunk_spans`` takes them."""

    free: np.ndarray  # when each channel falls free, ps
    latency_ps: int
    granule: int
    channel_bytes_per_s: float
    protocol: bool
    tck_ps: float
    params: np.ndarray
    open_row: np.ndarray
    act_ok: np.ndarray
    pre_ok: np.ndarray
    cas_ok: np.ndarray
    faw: np.ndarray
    scalars: np.ndarray
    next_ref: np.ndarray
    per_channel: np.ndarray
    spans: np.ndarray  # scratch: the last chunk's spans


class SramArrays(NamedTuple):
    port_free: np.ndarray  # (cores, ports): when each port falls free, ps
    port_bytes_per_s: float


class LinkArrays(NamedTuple):
    free: np.ndarray  # when each direction falls free, ps
    bytes_per_s: np.ndarray
    latency_ps: int
    chunk_bytes: int
    kind: int  # ``link.PCIE`` or ``link.SHARED_DRAM``


class Costs(NamedTuple):
    """The fixed costs (``FixedCosts``), ps."""

    launch_ps: int
    dispatch_ps: int
    sync_ps: int


class DeviceArrays(NamedTuple):
    """The components' state and parameters the loop reads and updates."""

    dma: DmaArrays
    dram: DramArrays
    sram: SramArrays
    link: LinkArrays
    costs: Costs


# Every helper is compiled with ``error_model="numpy"``: their divisors are validated
# positive sizes and rates (``transfer_ps`` still fails loudly on a zero rate: the infinite
# time overflows), and without the division checks' raise paths Numba can drop the
# reference counting of the arrays passed in. The heap's pop, its comparisons, the small
# helpers and the DRAM step are inlined into the loop: a call to a jitted function that is
# not inlined costs an atomic increment and decrement of every array passed to it (the
# callee counts its arguments), which on the ~150,000 pushes and ~11,000 DRAM chunks of a
# decode step was a third of the loop's time. The one called function on the hot path,
# ``sim.device.dram.timing``'s chunk step, is compiled without reference counting (``_nrt=False``:
# it allocates nothing), which costs as little as inlining it and compiles 10 s faster. The
# push, called at ~25 sites, only appends (five stores); one sift before the pop orders
# what was appended.
@njit(cache=True, error_model="numpy")
def grow(a: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0] * 2, a.shape[1]), a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True, error_model="numpy")
def grow_to(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` doubled until it has at least ``rows`` rows."""
    while a.shape[0] < rows:
        a = grow(a)
    return a


@njit(cache=True, error_model="numpy", inline="always")
def _less(h: np.ndarray, i: int, j: int) -> bool:
    if h[i, 0] != h[j, 0]:
        return h[i, 0] < h[j, 0]
    if h[i, 1] != h[j, 1]:
        return h[i, 1] < h[j, 1]
    return h[i, 2] < h[j, 2]


@njit(cache=True, error_model="numpy", inline="always")
def _swap(h: np.ndarray, i: int, j: int) -> None:
    for k in range(5):
        t = h[i, k]
        h[i, k] = h[j, k]
        h[j, k] = t


@njit(cache=True, error_model="numpy", inline="always")
def hpush(h: np.ndarray, n: int, t: int, prio: int, eid: int, kind: int, arg: int) -> int:
    """Appends an entry as row ``n`` (which must exist) and returns the new size; the heap
    order of the rows from the first unordered one on is restored by :func:`hsift` before
    the next pop (the loop pushes while it handles an event and pops only between events)."""
    h[n, 0] = t
    h[n, 1] = prio
    h[n, 2] = eid
    h[n, 3] = kind
    h[n, 4] = arg
    return n + 1


@njit(cache=True, error_model="numpy", inline="always")
def push(h: np.ndarray, n: int, eid: int, t: int, prio: int, kind: int, arg: int) -> tuple:
    """:func:`hpush` with the next insertion id: returns ``(heap size, next id)``."""
    h[n, 0] = t
    h[n, 1] = prio
    h[n, 2] = eid
    h[n, 3] = kind
    h[n, 4] = arg
    return n + 1, eid + 1


@njit(cache=True, error_model="numpy", inline="always")
def hsift(h: np.ndarray, lo: int, n: int) -> None:
    """Sifts rows ``lo .. n - 1`` up, in order: the heap pushing them one at a time leaves.
    Row ``i`` moves only along its ancestors, rows before ``i``, so the rows appended after
    it take no part in its sift: appending several and then sifting them in order gives the
    very heap that pushing each in turn gives."""
    for k in range(lo, n):
        i = k
        while i > 0:
            parent = (i - 1) >> 1
            if _less(h, i, parent):
                _swap(h, i, parent)
                i = parent
            else:
                break


@njit(cache=True, error_model="numpy", inline="always")
def hpop(h: np.ndarray, n: int) -> int:
    """Moves the smallest entry to row ``n - 1``; returns the new size."""
    n -= 1
    _swap(h, 0, n)
    i = 0
    while True:
        lo = 2 * i + 1
        if lo >= n:
            break
        c = lo
        if lo + 1 < n and _less(h, lo + 1, lo):
            c = lo + 1
        if _less(h, c, i):
            _swap(h, i, c)
            i = c
        else:
            break
    return n


@njit(cache=True, error_model="numpy", inline="always")
def hnext(h: np.ndarray, ordered: int, n: int, direct: bool) -> tuple:
    """Moves the smallest entry to row ``n - 1``, rows ``0 .. ordered - 1`` being in heap
    order and the later ones appended since (unordered); returns ``(n - 1, the rows still
    in heap order)``.

    An event is often the smallest there is as it is pushed: a process schedules its own
    resumption at ``now`` or the next thing to happen, a release grants at ``now``. When
    the smallest of the appended rows is smaller than the heap's top (or the heap part is
    empty), it is taken straight from where it was appended, and the rest stay appended:
    no sift up, no sift down. The keys ``(time, priority, insertion id)`` are all distinct,
    so the events come out in the order that sifting everything and popping gives (the
    rows' places in the array differ, which nothing reads). With ``direct`` false it
    always sifts the appended rows and pops."""
    if direct and ordered < n:
        m = ordered
        for j in range(ordered + 1, n):
            if _less(h, j, m):
                m = j
        if ordered == 0 or _less(h, m, 0):
            if m != n - 1:
                # the swap written out: an inlined helper's array argument is a new
                # reference, counted (an atomic pair) on this path taken per event
                for k in range(5):
                    t = h[m, k]
                    h[m, k] = h[n - 1, k]
                    h[n - 1, k] = t
            return n - 1, ordered
    hsift(h, ordered, n)
    n = hpop(h, n)
    return n, n


@njit(cache=True, error_model="numpy", inline="always")
def log_row(logs: np.ndarray, nl: int, code: int, a: int, b: int, c: int, d: int,
            e: int) -> int:
    """Row ``nl`` of the logs (which must have room): ``code`` and its five fields (see
    ``LOG_*``; unused ones 0); returns the rows used."""
    logs[nl, 0] = code
    logs[nl, 1] = a
    logs[nl, 2] = b
    logs[nl, 3] = c
    logs[nl, 4] = d
    logs[nl, 5] = e
    return nl + 1


# Called, not inlined, and without reference counting (it allocates nothing): inlined, its
# sixteen array arguments cost an atomic increment and decrement each per DRAM access (the
# loop's caller of a helper with branches binds its arguments to counted variables).
@njit(cache=True, error_model="numpy", _nrt=False)
def dram_access(now, addr, nbytes, write, protocol, granule, ch_bps, tck_ps, params, open_row,
                act_ok, pre_ok, cas_ok, faw, scalars, next_ref, per_ch, dram_free, spans, logs,
                nl, log_level):
    """``Dram.access`` after the latency: the chunk timed by the DRAM's rule
    (:func:`sim.device.components.dram.chunk_spans`, which updates the channels' state),
    a log row per channel it touches; returns ``(when the last channel is done, logs
    used)``. ``logs`` must have room for a row per channel."""
    n, end = chunk_spans(now, addr, nbytes, write, protocol, granule, ch_bps, tck_ps, params,
                         open_row, act_ok, pre_ok, cas_ok, faw, scalars, next_ref, per_ch,
                         dram_free, spans)
    if log_level >= 1:
        for k in range(n):
            nl = log_row(logs, nl, LOG_DRAM, spans[k, SPAN_CHANNEL], spans[k, SPAN_START],
                         spans[k, SPAN_STOP], spans[k, SPAN_BYTES], write)
    return end, nl
