"""tests.unit.deploy."""
