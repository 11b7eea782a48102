"""The application on top of the device, the runtime and serving: the CLI, runs, sweeps,
regress, quality, calibration and results."""
