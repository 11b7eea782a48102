"""The attention-score readout an eviction policy needs (kvsim's own op: the vendor's
runtime has none).

An armed :class:`ScoreTap` makes every attention instruction also add, per KV head and
key, the softmax weight that key gets from the queries at positions ``>= from_pos``
(summed over the query heads of the group): H2O's accumulated attention (``from_pos``
0: every query of the prefill) or SnapKV's observation window (``from_pos``: the first
query of the prompt's last window). The weights are the attention unit's own
probabilities (the integer path's Q24 softmax; the dequantize-on-read path's float
softmax).

Cost, an assumption stated here: accumulating a weight beside the softmax that produces
it takes the attention unit no extra time; the readout itself is timed, the device
writing ``layers x KV heads x tokens`` float32 sums (4 bytes each) to a DRAM scratch
area and a host read of them over the link (:func:`read_scores`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from isa.instructions import HostRead, Program
from models.compiler.blocks.io import LOGITS_REGION
from sim.runtime.cacheops import EditResult
from sim.runtime.deviceops import HOST_IN

if TYPE_CHECKING:
    from sim.runtime.model import Model

#: Bytes per readout value (a float32 sum per layer, KV head and key).
SCORE_BYTES = 4


class ScoreTap:
    """Per-layer, per-KV-head attention weights of every key, accumulated while armed."""

    def __init__(self, model: Model, *, from_pos: int = 0, cache_id: int = 0):
        cm = model.compiled
        if from_pos < 0:
            raise ValueError(f"score tap: from_pos must be >= 0, got {from_pos}")
        self.from_pos = from_pos
        self._where: dict[int, tuple[int, int]] = {}
        heads = 0
        for c in cm.kv_caches():
            if c.slot == cache_id and c.component in ("k", "c"):
                for h in range(c.heads):
                    self._where[c.head_base(h)] = (c.layer, h)
                heads = max(heads, c.heads)
        self.sums = np.zeros((cm.model.num_layers, heads, cm.cap), np.float64)

    def add(self, k_base: int, weights: Callable[[int], np.ndarray]) -> None:
        """``weights(from_pos)``: each key's weight from the queries at ``>= from_pos``
        (the attention instruction of the KV head whose cache starts at ``k_base``)."""
        layer, head = self._where[k_base]
        w = weights(self.from_pos)
        self.sums[layer, head, :w.size] += w

    def copy(self) -> ScoreTap:
        new = object.__new__(ScoreTap)
        new.from_pos, new._where, new.sums = self.from_pos, self._where, self.sums.copy()
        return new


def arm(model: Model, tap: ScoreTap | None) -> None:
    """Arm ``tap`` on the model's device (None: disarm)."""
    model.acc.device.mem.score_tap = tap


def read_scores(model: Model, tap: ScoreTap, cache_size: int) -> tuple[np.ndarray, EditResult]:
    """The readout: the device writes the tap's sums of the first ``cache_size`` keys
    (float32 ``[layers, KV heads, cache_size]``) to a scratch area of DRAM and the host
    reads them over the link. Returns the sums the host received and the call's cost."""
    acc = model.acc
    data = np.ascontiguousarray(tap.sums[:, :, :cache_size], np.float32)
    nbytes = data.nbytes
    scratch = (model.wide or model.compiled).mm[LOGITS_REGION]
    if nbytes > scratch.size:
        raise ValueError(f"score readout: {nbytes} bytes do not fit the {scratch.size}-byte "
                         f"scratch area")
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, "score_readout")
    # the sums enter DRAM (free: the assumption above), then cross the link
    acc.device.mem.dram.write(scratch.base, data.reshape(-1).view(np.uint8))
    acc.run(Program((HostRead(src=scratch.base, dst=HOST_IN, nbytes=nbytes),),
                    name="score readout"), "score_readout")
    rec = acc.end("score_readout", start, before)
    got = acc.device.host_read(HOST_IN, nbytes).view(np.float32).reshape(data.shape).copy()
    t = rec.stats.get("traffic", {})
    return got, EditResult("score_readout", "device", rec.time_s,
                           t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                           t.get("dram_read", 0) + t.get("dram_write", 0),
                           new_cache_size=cache_size)


__all__ = ["SCORE_BYTES", "ScoreTap", "arm", "read_scores"]
