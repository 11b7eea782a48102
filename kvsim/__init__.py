"""kvsim: what every layer shares, below ``isa``, so that the instruction set, the models,
the simulator and the traces use one of each without importing one another:
:mod:`kvsim.errors` (one family of errors) and :mod:`kvsim.files` (output files written
atomically: a compiled model, a cache dump, a run's results)."""
