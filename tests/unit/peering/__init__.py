"""tests.unit.peering."""
