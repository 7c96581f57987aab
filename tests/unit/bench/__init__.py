"""tests.unit.bench."""
