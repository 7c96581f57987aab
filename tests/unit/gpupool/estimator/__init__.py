"""tests.unit.gpupool.estimator."""
