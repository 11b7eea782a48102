"""kvsim traces."""
