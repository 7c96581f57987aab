"""tests.unit.netfabric.controllers."""
