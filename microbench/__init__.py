"""microbench: the calibration suite (issue 4)."""
