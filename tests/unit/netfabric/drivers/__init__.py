"""tests.unit.netfabric.drivers."""
