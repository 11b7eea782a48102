"""Compute core timing: a matrix unit and a vector unit per core.

One instruction is one tile of work and one event. Durations (in core clock cycles,
converted to picoseconds) are:

- GEMM: ``issue + ceil(macs / macs_per_cycle[w{bits}a8])``, ``macs = m*k*n`` (group-wise
  4-bit weights, ``gemm.g``: ``+ 2*m*n*ceil(k/G) + m*k``, :attr:`GemmGroup.macs`)
- attention: ``issue + ceil(2*q_len*ctx*head_dim*heads / macs_per_cycle[p])`` for the
  QK^T and PV products (``p`` = w16a16 when the cache format is 16-bit, else w8a8) plus
  the integer softmax on the vector lanes, ``ceil(q_len*ctx*heads*SOFTMAX_OPS / lanes)``
- dequantize-on-read attention (attn.dq): ``issue + ceil(2*ctx*kv_heads*head_dim*
  DEQUANT_OPS_PER_VALUE / lanes) + ceil(macs / macs_per_cycle[w16a16]) +
  ceil(scores*FLOAT_SOFTMAX_OPS / lanes) + ceil(2*q_len*heads*head_dim / lanes)``
- vector ops and KV pack/unpack: ``issue + ceil(ops / vector_lanes)``
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from isa.instructions import (
    VEC_OPS_PER_ELEMENT,
    Attn,
    AttnDq,
    Gemm,
    Instruction,
    KvRead,
    KvWrite,
    Nop,
    Vec,
    VecFunc,
)
from sim.device.hw import CoresConfig
from sim.units import cycles_to_ps, ns_to_ps

#: Integer ops per attention score for the I-BERT softmax (max, subtract, shift,
#: polynomial, sum, normalise): same count as VecFunc.SOFTMAX.
SOFTMAX_OPS = VEC_OPS_PER_ELEMENT[VecFunc.SOFTMAX]
#: Vector-unit ops per cached value of the dequantize-on-read pass (attn.dq): unpack the
#: code (shift and mask), ``code * scale + zero`` (one fused multiply-add), times the
#: tensor scale and round to fp16. An assumption of the model, like VEC_OPS_PER_ELEMENT.
DEQUANT_OPS_PER_VALUE = 3
#: Float softmax per score (max, subtract, exp, sum, divide): taken equal to the integer
#: softmax's count, the vector lanes running fp16/fp32 at their int8 rate (an assumption).
FLOAT_SOFTMAX_OPS = SOFTMAX_OPS
#: Ops per element to convert a query to fp16 and an output back to int8 (an assumption).
CONVERT_OPS = 1


@dataclass(frozen=True)
class FixedCosts:
    """The fixed costs of running programs (``hardware.cores``), in ps: a program's launch
    (once, before every engine queue's first instruction), an instruction's dispatch (on
    every engine queue, every instruction but the flag-joining ``Nop``, before it waits
    for its flags) and a cross-core synchronisation (an instruction on a core's engine
    waiting on a flag another core signals, once its flags are in)."""

    launch_ps: int
    dispatch_ps: int
    sync_ps: int

    @classmethod
    def of(cls, cfg: CoresConfig) -> FixedCosts:
        return cls(launch_ps=ns_to_ps(cfg.program_launch_ns),
                   dispatch_ps=cycles_to_ps(cfg.dispatch_cycles, cfg.clock_hz),
                   sync_ps=ns_to_ps(cfg.barrier_sync_ns))


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
        if isinstance(instr, AttnDq):
            return issue + self.attn_dq_cycles(instr)
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

    def attn_dq_cycles(self, a: AttnDq) -> int:
        """The dequantize-on-read attention without its issue latency: the dequant pass
        over ``ctx`` tokens of K and V, the fp16 matmuls at the ``w16a16`` rate, the float
        softmax and the fp16 conversions of queries and outputs, one after the other."""
        lanes = self.cfg.vector_lanes
        values = 2 * a.ctx * a.kv_heads * a.head_dim
        macs = 2 * a.q_len * a.ctx * a.head_dim * a.heads
        scores = a.q_len * a.ctx * a.heads
        convert = 2 * a.q_len * a.heads * a.head_dim
        return (math.ceil(values * DEQUANT_OPS_PER_VALUE / lanes)
                + math.ceil(macs / self.macs_per_cycle("w16a16"))
                + math.ceil(scores * FLOAT_SOFTMAX_OPS / lanes)
                + math.ceil(convert * CONVERT_OPS / lanes))

    def duration_ps(self, instr: Instruction, formats: tuple[str, ...] = ()) -> int:
        return cycles_to_ps(self.cycles(instr, formats), self.cfg.clock_hz)
