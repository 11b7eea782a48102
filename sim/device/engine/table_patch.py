"""A patched build of the program tables (:mod:`sim.device.engine.tables`) when the kept rows
come first, in Numba passes over the changed positions and the added rows.

A decode step after the last drops the rows the last one added (no position holds them
any more) and adds rows new to the store: the rows the program keeps are then the first
ones of the last table and the added ones, which the store numbered after every kept one,
come after them. :func:`prefix_rows` finds whether that is so and, if it is, the new rows
and the row of every position; :func:`prefix_tables` cuts the last tables' arrays to the
kept rows and appends the added ones; :func:`same_heads` checks that the changed positions
keep their engines, cores, waits and signals. Their numpy reference is the general patch
(``_moved_rows`` and ``_moved_tables`` in :mod:`sim.device.engine.tables`, for kept rows
anywhere), and the tests compare the tables either gives with full builds, array for
array (tests/sim/test_incremental_tables.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.device.engine.loopdefs import FL_CROSS, I_FIELDS, I_FLAGS
from sim.device.engine.row_fill import (
    X_ENG,
    X_NSTREAM,
    X_QCORE,
    X_SB1,
    X_SB2,
    X_SLEN,
    X_SN1,
    X_SN2,
    X_SOFF,
    X_WLEN,
    X_WOFF,
)


@njit(cache=True)
def _first_at_least(sorted_values: np.ndarray, v: int) -> int:
    """``np.searchsorted(sorted_values, v)`` (a binary search numba compiles quickly)."""
    lo, hi = 0, len(sorted_values)
    while lo < hi:
        mid = (lo + hi) >> 1
        if sorted_values[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


#: The kernels are compiled (or loaded from numba's cache) when this module is imported, for
#: these argument types, not at their first call: a decode run would otherwise pay the
#: load in the middle of its first patched steps.
_I1, _I1_32, _I2 = "int64[::1]", "int32[::1]", "int64[:, ::1]"


@njit(f"({_I1}, {_I1}, {_I1_32}, {_I1}, {_I1})", cache=True)
def prefix_rows(changed: np.ndarray, sub: np.ndarray, last_row_of: np.ndarray,
                last_uses: np.ndarray, present: np.ndarray):
    """``(ok, kept, added, row_of, uses, first_at)`` of a program that holds the store rows
    ``sub`` at the positions ``changed`` and elsewhere the rows of the last program (whose
    table rows are the store rows ``present``, ascending; position ``i`` held its table row
    ``last_row_of[i]``, and table row ``r`` was held at ``last_uses[r]`` positions).

    ``ok``: the rows the program still holds are the first ``kept`` table rows and the
    store rows new to it (``added``, ascending) all come after them; then ``row_of`` is
    each position's row among those ``kept + len(added)`` rows, ``uses`` the positions
    holding each, and ``first_at`` the first changed position holding each added row.
    When not ``ok`` the other results are not meaningful."""
    nc, nr = len(changed), len(present)
    left = np.empty(nr, np.int64)
    for r in range(nr):
        left[r] = last_uses[r]
    for j in range(nc):
        left[last_row_of[changed[j]]] -= 1
    keep = np.empty(nr, np.bool_)
    for r in range(nr):
        keep[r] = left[r] > 0
    found = np.empty(nc, np.int64)
    for j in range(nc):
        k = _first_at_least(present, sub[j])
        if k < nr and present[k] == sub[j]:
            found[j] = k
            keep[k] = True
        else:
            found[j] = -1
    kept = 0
    for r in range(nr):
        if keep[r]:
            kept += 1
    # the distinct new rows, ascending (marked over their span: no sort)
    lo, hi = 0, -1
    for j in range(nc):
        if found[j] < 0:
            if hi < lo:
                lo = hi = sub[j]
            lo, hi = min(lo, sub[j]), max(hi, sub[j])
    mark = np.zeros(max(hi - lo + 1, 0), np.bool_)
    for j in range(nc):
        if found[j] < 0:
            mark[sub[j] - lo] = True
    na = 0
    for i in range(len(mark)):
        if mark[i]:
            na += 1
    added = np.empty(na, np.int64)
    t = 0
    for i in range(len(mark)):
        if mark[i]:
            added[t] = lo + i
            t += 1
    row_of = np.empty(len(last_row_of), last_row_of.dtype)
    for i in range(len(last_row_of)):
        row_of[i] = last_row_of[i]
    uses = np.zeros(kept + na, np.int64)
    first_at = np.empty(na, np.int64)
    for a in range(na):
        first_at[a] = -1
    ok = True
    for r in range(kept):
        if not keep[r]:
            ok = False
            break
    if ok and na and kept and added[0] <= present[kept - 1]:
        ok = False
    if not ok:
        return False, kept, added, row_of, uses, first_at
    for r in range(kept):
        uses[r] = left[r]
    for j in range(nc):
        r = found[j]
        if r < 0:
            a = _first_at_least(added, sub[j])
            r = kept + a
            if first_at[a] < 0:
                first_at[a] = changed[j]
        row_of[changed[j]] = r
        uses[r] += 1
    return True, kept, added, row_of, uses, first_at


@njit(cache=True)
def _append_flags(ptr: np.ndarray, flat: np.ndarray, kept: int, new: np.ndarray, off: int,
                  ln: int, held: np.ndarray, flags: np.ndarray):
    """``(ok, ptr, flat)``: the per-row lists ``ptr``/``flat`` (row ``j``'s items
    ``flat[ptr[j]: ptr[j + 1]]``) of the first ``kept`` rows, then the lists of the rows
    ``new`` (``new[:, ln]`` items from ``held[new[:, off]]`` on) as dense ids of ``flags``
    (``ok`` false: an item is not one of them)."""
    na = len(new)
    n = kept + na
    out_ptr = np.empty(n + 1, np.int64)
    for r in range(kept + 1):
        out_ptr[r] = ptr[r]
    for a in range(na):
        out_ptr[kept + a + 1] = out_ptr[kept + a] + new[a, ln]
    out = np.empty(out_ptr[n], flat.dtype)
    end = ptr[kept]
    for i in range(end):
        out[i] = flat[i]
    t = end
    ok = True
    for a in range(na):
        for i in range(new[a, ln]):
            v = held[new[a, off] + i]
            d = _first_at_least(flags, v)
            if d >= len(flags) or flags[d] != v:
                ok = False
                d = 0
            out[t] = d
            t += 1
    return ok, out_ptr, out


@njit(f"({_I2}, {_I2}, int64, {_I2}, {_I1}, {_I1_32}, {_I1}, {_I1}, {_I1}, {_I1}, {_I1}, "
      f"{_I1}, {_I1}, {_I1}, {_I1})", cache=True)
def prefix_tables(table: np.ndarray, last_table: np.ndarray, kept: int, new: np.ndarray,
                  first_at: np.ndarray,
                  last_row_of: np.ndarray, held: np.ndarray, flags: np.ndarray,
                  w_ptr: np.ndarray, w_flag: np.ndarray, s_ptr: np.ndarray,
                  s_flag: np.ndarray, stream_base: np.ndarray, stream_bytes: np.ndarray,
                  nstream: np.ndarray):
    """``(ok, w_ptr, w_flag, s_ptr, s_flag, stream_base, stream_bytes, nstream)``: the
    arrays of the last tables (``last_table``, ``w_ptr`` ... ``stream_bytes``; and
    ``nstream``, the transfers of each row) cut to their first ``kept`` rows and followed
    by the store rows ``new`` (their waits and signals held flat in ``held``, as dense ids
    of the program's ``flags``), as :func:`sim.device.engine.tables.gather` lays them out: the
    wait and signal lists, the first transfer of every row in row order and then the
    second ones; ``table`` (whose first ``kept`` rows the caller copied from
    ``last_table``: a copy numpy makes faster) gets the added rows, each one's cross-core
    bit the last row's at ``first_at`` (its stats pairs left as its store row holds them).
    ``ok`` false: a wait or signal of an added row is not one of ``flags``."""
    na = len(new)
    n = kept + na
    for a in range(na):
        for f in range(I_FIELDS):
            table[kept + a, f] = new[a, f]
        cross = last_table[last_row_of[first_at[a]], I_FLAGS] & FL_CROSS
        table[kept + a, I_FLAGS] |= cross
    ok_w, wp, wf = _append_flags(w_ptr, w_flag, kept, new, X_WOFF, X_WLEN, held, flags)
    ok_s, sp, sf = _append_flags(s_ptr, s_flag, kept, new, X_SOFF, X_SLEN, held, flags)
    firsts = 0
    for r in range(len(nstream)):
        if nstream[r] >= 1:
            firsts += 1
    k1 = k2 = 0
    for r in range(kept):
        if nstream[r] >= 1:
            k1 += 1
        if nstream[r] >= 2:
            k2 += 1
    a1 = a2 = 0
    for a in range(na):
        if new[a, X_NSTREAM] >= 1:
            a1 += 1
        if new[a, X_NSTREAM] >= 2:
            a2 += 1
    base = np.empty(k1 + a1 + k2 + a2, np.int64)
    nbytes = np.empty(k1 + a1 + k2 + a2, np.int64)
    for i in range(k1):
        base[i] = stream_base[i]
        nbytes[i] = stream_bytes[i]
    t = k1
    for a in range(na):
        if new[a, X_NSTREAM] >= 1:
            base[t] = new[a, X_SB1]
            nbytes[t] = new[a, X_SN1]
            t += 1
    for i in range(k2):
        base[t] = stream_base[firsts + i]
        nbytes[t] = stream_bytes[firsts + i]
        t += 1
    for a in range(na):
        if new[a, X_NSTREAM] >= 2:
            base[t] = new[a, X_SB2]
            nbytes[t] = new[a, X_SN2]
            t += 1
    ns = np.empty(n, np.int64)
    for r in range(kept):
        ns[r] = nstream[r]
    for a in range(na):
        ns[kept + a] = new[a, X_NSTREAM]
    return ok_w and ok_s, wp, wf, sp, sf, base, nbytes, ns


@njit(f"({_I2}, {_I1}, {_I1}, {_I1})", cache=True)
def same_heads(rows: np.ndarray, held: np.ndarray, new: np.ndarray, old: np.ndarray) -> bool:
    """Whether the store rows ``new`` have the engines, queue cores, waits and signals
    (held flat in ``held``) of the rows ``old``, pair by pair (``rows``: the store's)."""
    for j in range(len(new)):
        a, b = rows[new[j]], rows[old[j]]
        if a[X_ENG] != b[X_ENG] or a[X_QCORE] != b[X_QCORE]:
            return False
        for off, ln in ((X_WOFF, X_WLEN), (X_SOFF, X_SLEN)):
            if a[ln] != b[ln]:
                return False
            for i in range(a[ln]):
                if held[a[off] + i] != held[b[off] + i]:
                    return False
    return True
