"""Compile the Numba kernels of the heavy tests once, before the xdist workers start.

Every kernel is ``@njit(cache=True)``: the first process that calls it with a new signature
compiles it and stores the machine code in ``__pycache__``; later processes load it. On a
fresh checkout (as in CI) nothing is stored yet, and under ``pytest -n 2`` both workers
begin with the real-model groups (:mod:`tests.groups`), which call the same kernels (the
array event loop on ``aries``, the wide integer kernels, the KV codecs) at about the same
time: each worker compiles them, the same work twice. The controller runs this module
first (``tests/conftest.py``), as :data:`PARTS` processes side by side, each compiling its
share through runs of the tiny synthetic model: a kernel's signature depends on the dtypes
and ranks of its arrays, not their sizes, so the tiny model on ``aries`` compiles what
SmolLM2-135M on ``aries`` calls (checked with ``NUMBA_DEBUG_CACHE=1``: after the first part,
a teacher-forced SmolLM2 run loaded all 14 of its kernels and compiled none).

With a warm cache a part takes a few seconds (the runs are small). Nothing here asserts
anything: the tests check these paths; a part that fails is reported and the tests then
compile what they need themselves.

    python -m tests.jit_warmup K    # run part K
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: The teacher-forced text of the warm-up runs: 40 byte-level ids of the tiny model (the
#: tiny model's vocabulary is 256). Long enough for several token tiles per call.
TEXT_TOKENS = 40


def _text() -> list[int]:
    return np.random.default_rng(0).integers(0, 256, size=TEXT_TOKENS).tolist()


def _evaluate(*, weights: str, numerics: str, kv: str, hw: str,
              kv_read: str = "integer") -> None:
    from models.bits import NUMERICS_PRESETS, WEIGHT_BITS_PRESETS, BitConfig
    from sim.app.quality import evaluate

    bits = BitConfig(weights=WEIGHT_BITS_PRESETS[weights], numerics=NUMERICS_PRESETS[numerics],
                     kv_read=kv_read)
    evaluate("tiny", _text(), bits=bits, kv=kv, hw=hw)


def _part_w8() -> None:
    """What the ``real-w8`` group calls: W8 with the ``w8`` numerics on ``aries`` (the
    array event loop with the DRAM protocol, the wide kernels), the int8 cache read as
    integers and dequantized, and the quality table's 4- and 2-bit formats."""
    for kv, read in (("int8", "integer"), ("int8", "dequant"), ("kivi-4", "integer"),
                     ("kivi-2", "integer"), ("qserve-kv4", "integer")):
        _evaluate(weights="W8", numerics="w8", kv=kv, hw="aries", kv_read=read)


def _part_other() -> None:
    """What the ``real-other`` group and the tiny-model tests call: W4V8 with the
    ``w4g32`` numerics (group-wise 4-bit GEMMs) and W8 with one static int8 scale, on the
    tiny hardware (the event loop's other signature)."""
    _evaluate(weights="W4V8", numerics="w4g32", kv="int8", hw="tiny")
    _evaluate(weights="W8", numerics="static-int8", kv="int8", hw="tiny")
    _evaluate(weights="W8", numerics="static-int8", kv="kivi-2", hw="tiny")


#: The parts, one process each.
PARTS: tuple[Callable[[], None], ...] = (_part_w8, _part_other)


def run_parts(root: Path) -> list[str]:
    """Run every part in its own process (side by side) from ``root``; the problems of the
    parts that failed (empty: all ran)."""
    procs = [subprocess.Popen([sys.executable, "-m", "tests.jit_warmup", str(k)], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for k in range(len(PARTS))]
    problems = []
    for k, p in enumerate(procs):
        _, err = p.communicate()
        if p.returncode != 0:
            tail = " | ".join(err.strip().splitlines()[-3:])
            problems.append(f"part {k} ({PARTS[k].__name__}) exited {p.returncode}: {tail}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit() or int(args[0]) >= len(PARTS):
        print(f"usage: python -m tests.jit_warmup K (K in 0..{len(PARTS) - 1})",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    PARTS[int(args[0])]()
    print(f"part {args[0]}: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
