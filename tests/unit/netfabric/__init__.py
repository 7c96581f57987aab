"""tests.unit.netfabric."""
