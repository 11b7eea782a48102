"""The DRAM protocol model: access patterns, the timing step, one file per DRAM standard."""
