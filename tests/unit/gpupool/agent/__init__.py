"""tests.unit.gpupool.agent."""
