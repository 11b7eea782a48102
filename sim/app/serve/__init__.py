"""``kvsim serve``: a serving config, its run and its typed results."""
