"""tests.unit.peering.ops."""
