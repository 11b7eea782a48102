"""kvsim sim."""
