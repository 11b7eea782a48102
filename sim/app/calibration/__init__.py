"""Calibration of the ``aries`` preset against the two published MLA100 points: the fit
(:mod:`~sim.app.calibration.fit`) and the predictions on the fitted preset for every model
config (:mod:`~sim.app.calibration.predict`); ``python -m sim.app.calibration fit |
predict`` runs them."""

from sim.app.calibration.fit import (
    MODEL_CONFIGS,
    POINTS,
    RUN_FIELD,
    SRAM_FIELD,
    VALIDATION_CONFIG,
    Published,
    fit,
    run_lengths,
)

__all__ = ["MODEL_CONFIGS", "POINTS", "RUN_FIELD", "SRAM_FIELD", "VALIDATION_CONFIG",
           "Published", "fit", "run_lengths"]
