"""The simulated card: hardware config and presets, components, the DRAM protocol, the
engines and the functional memories."""
