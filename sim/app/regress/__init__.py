"""Latency regression checks (``kvsim regress``)."""
