"""Compute core timing: a matrix unit and a vector unit per core.

One instruction is one tile of work and one event. Durations (in core clock cycles,
converted to picoseconds) are:

- GEMM: ``issue + ceil(macs / macs_per_cycle[w{bits}a8])``, ``macs = m*k*n`` (group-wise
  4-bit weights, ``gemm.g``: ``+ 2*m*n*ceil(k/G) + m*k``, :attr:`GemmGroup.macs`)
- attention: ``issue + ceil(2*q_len*ctx*head_dim*heads / macs_per_cycle[p])`` for the
  QK^T and PV products (``p`` = w16a16 when the cache format is 16-bit, else w8a8) plus
  the integer softmax on the vector lanes, ``ceil(q_len*ctx*heads*SOFTMAX_OPS / lanes)``
- vector ops and KV pack/unpack: ``issue + ceil(ops / vector_lanes)``
"""

from __future__ import annotations

import math

from isa.instructions import (
    VEC_OPS_PER_ELEMENT,
    Attn,
    Gemm,
    Instruction,
    KvRead,
    KvWrite,
    Nop,
    Vec,
    VecFunc,
)
from sim.hw import CoresConfig
from sim.units import cycles_to_ps

#: Integer ops per attention score for the I-BERT softmax (max, subtract, shift,
#: polynomial, sum, normalise): same count as VecFunc.SOFTMAX.
SOFTMAX_OPS = VEC_OPS_PER_ELEMENT[VecFunc.SOFTMAX]


def is_16bit_format(name: str) -> bool:
    return name.split(":")[0] in ("bf16", "fp16")


class ComputeCore:
    def __init__(self, cfg: CoresConfig, core: int):
        self.cfg = cfg
        self.core = core

    def macs_per_cycle(self, precision: str) -> int:
        table = self.cfg.macs_per_cycle
        return table.get(precision, table["w8a8"])

    def cycles(self, instr: Instruction, formats: tuple[str, ...] = ()) -> int:
        issue = self.cfg.issue_latency_cycles
        lanes = self.cfg.vector_lanes
        if isinstance(instr, Nop):
            return 0
        if isinstance(instr, Gemm):  # GemmGroup: its extra group MACs are in .macs
            return issue + math.ceil(instr.macs / self.macs_per_cycle(instr.precision))
        if isinstance(instr, Attn):
            wide = any(
                i < len(formats) and is_16bit_format(formats[i])
                for i in (instr.k_fmt, instr.v_fmt)
            )
            rate = self.macs_per_cycle("w16a16" if wide else "w8a8")
            macs = 2 * instr.q_len * instr.ctx * instr.head_dim * instr.heads
            scores = instr.q_len * instr.ctx * instr.heads
            return issue + math.ceil(macs / rate) + math.ceil(scores * SOFTMAX_OPS / lanes)
        if isinstance(instr, (Vec, KvWrite, KvRead)):
            return issue + math.ceil(instr.ops() / lanes)
        raise TypeError(f"{type(instr).__name__} does not run on a compute core")

    def duration_ps(self, instr: Instruction, formats: tuple[str, ...] = ()) -> int:
        return cycles_to_ps(self.cycles(instr, formats), self.cfg.clock_hz)
