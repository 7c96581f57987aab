"""tests.unit.gpupool."""
