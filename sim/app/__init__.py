"""The application on top of the device, runtime and serving: CLI, runs, sweeps, regress, quality, calibration, results."""
