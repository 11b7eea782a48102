"""Self-speculation's draft: the verifier's model with a block of layers skipped, compiled
as a model of its own (:mod:`models.skip`: its own program and integer parameters,
calibrated on the float model that skips those layers) and launched beside the verifier
(:func:`sim.runtime.draft.launch_draft`) so that it reads the verifier's weight codes and
KV caches where they are: the card holds no second copy of the weights, only the draft's
integer parameters (a few bytes per output row: the DRAM map, :meth:`DraftMap.as_metrics
<sim.runtime.draft.DraftMap.as_metrics>`, shows it).

Sharing the caches is Draft & Verify's scheme (Zhang et al., ACL 2024): the draft's layer
``j`` reads and appends to the verifier's cache of layer ``keep[j]``; the positions before
the draft's were written by the verifier (exact), and the positions the draft appends are
written again by the verification call that follows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from models.compiler import CompiledModel
from models.skip import check_keep, subset_config, subset_spec
from sim.device.hw import HardwareConfig
from sim.runtime import Model
from sim.runtime.draft import DraftModel, launch_draft
from sim.runtime.errors import RuntimeApiError
from sim.runtime.ready import ready_model

#: Region names that carry a layer index: weight codes ``w.layers.<i>.*`` and KV caches
#: ``kv.s<slot>.l<i>.<component>`` (models/compiler/dram.py, blocks/gqa.py).
_LAYER_WEIGHT = re.compile(r"w\.layers\.(\d+)\.(.+)")
_LAYER_CACHE = re.compile(r"kv\.s(\d+)\.l(\d+)\.(.+)")


def compile_self_draft(cm: CompiledModel, keep: Sequence[int],
                       hw: HardwareConfig) -> CompiledModel:
    """The draft of ``cm`` (compiled for ``hw``) that runs only its layers ``keep``: the
    same bits, KV format, hardware, core mode, call and cache sizes, functional if ``cm``
    is (:func:`sim.runtime.ready.ready_model`)."""
    keep = check_keep(cm.model, keep, where="self-speculation")
    return ready_model(
        subset_config(cm.model, keep), hw, bits=cm.bits, kv=cm.kv, core_mode=cm.core_mode,
        max_seq=cm.max_seq, cap=cm.cap, slots=cm.slots,
        tile_bytes=cm.tile_bytes if cm.tile_fixed else None,
        functional=cm.numerics.functional,
        weights=subset_spec(cm.weights, cm.model.num_layers, keep)).compiled


def shared_regions(keep: Sequence[int]) -> Callable[[str], str | None]:
    """The verifier's region each draft region uses: weight codes and caches of layer
    ``j`` are layer ``keep[j]``'s; the other weight codes (embedding, LM head) and the
    RoPE tables, activation and host-I/O buffers are the verifier's of the same name; the
    integer parameters (``p.*``) are the draft's own (None)."""
    keep = tuple(keep)

    def share(name: str) -> str | None:
        if name.startswith("p."):
            return None
        if m := _LAYER_WEIGHT.fullmatch(name):
            return f"w.layers.{keep[int(m.group(1))]}.{m.group(2)}"
        if m := _LAYER_CACHE.fullmatch(name):
            return f"kv.s{m.group(1)}.l{keep[int(m.group(2))]}.{m.group(3)}"
        return name

    return share


def launch_self_draft(model: Model, keep: Sequence[int]) -> DraftModel:
    """Compile the draft of the launched ``model`` that runs its layers ``keep`` and
    launch it beside it (its parameters cross the host link; its weights do not)."""
    cm, acc = model.compiled, model.acc
    if acc is None:
        raise RuntimeApiError("launch_self_draft: the model is not launched (or was disposed)")
    draft = compile_self_draft(cm, keep, acc.hw)
    return launch_draft(model, draft, shared_regions(check_keep(cm.model, keep,
                                                                where="self-speculation")))


__all__ = ["compile_self_draft", "launch_self_draft", "shared_regions"]
