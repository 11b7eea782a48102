"""The ``kvsim`` command line."""
