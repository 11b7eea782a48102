"""The simulated card: hardware config and presets, components, DRAM protocol, engines, memory."""
