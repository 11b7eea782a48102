"""Parameter sweeps and the hardware sensitivity table."""
