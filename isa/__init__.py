"""kvsim ISA: what the simulated NPU computes (instruction set, encodings, semantics).

Nothing in this package knows about time.
"""
