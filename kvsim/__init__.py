"""kvsim: what every layer shares. Only :mod:`kvsim.errors` lives here, below ``isa``, so that
the instruction set, the models, the simulator and the traces raise one family of errors
without importing one another."""
