"""Serving under memory pressure: continuous batching (vLLM semantics) over the simulated
device, with a paged KV cache whose block size the KV format sets, preemption by
recomputation or swapping, and several chips behind a router. See ``kvsim serve``."""
