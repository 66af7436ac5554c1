"""predictor: cost functions, calibration and forecasts (issue 5)."""
