"""kvsim's ``qbruntime``: the public surface of the vendor's Python runtime
(mobilint-qb-runtime 1.5.0, module ``qbruntime``; ``maccel`` is its older name) on kvsim's
simulated card, so host code written for the real card runs unchanged.

``kvsim exec -- python script.py`` runs a program with :data:`SHIM_DIR` first on its
``PYTHONPATH`` (that child only): ``import qbruntime`` and ``import maccel`` then resolve to
the thin modules there, which take every name from :mod:`.api`. Nothing is installed under
those names, so a real runtime installed beside kvsim is never shadowed unless asked.

- :mod:`.model` (``Model``, ``load``), :mod:`.accelerator`, :mod:`.config` (``ModelConfig``),
  :mod:`.enums`, :mod:`.structs`, :mod:`.functions`, :mod:`.future`, :mod:`.npu_data`,
  :mod:`.pinned_memory`, :mod:`.model_variant_handle`: the surface, built on
  :mod:`sim.runtime` (the runtime the rest of kvsim uses);
- :mod:`.io`: the forms of an LLM's inputs and outputs;
- :mod:`.system`: the cards, the host clock and the threading rule; :mod:`.clock`: the
  virtual ``time.perf_counter``; :mod:`.calltrace` and :mod:`.report`: the record of the
  calls a program made;
- :mod:`.errors`: ``QbRuntimeError`` and ``NotSimulatedError``.

What kvsim does not simulate raises :class:`NotSimulatedError` (a ``QbRuntimeError`` and a
:class:`kvsim.errors.KvsimError`): see :data:`.model.NOT_SIMULATED`.
"""

from __future__ import annotations

from pathlib import Path

#: the folder holding the ``qbruntime`` and ``maccel`` shim packages
SHIM_DIR = Path(__file__).resolve().parent / "shim"

__all__ = ["SHIM_DIR"]
