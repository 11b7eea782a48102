"""kvsim models."""
