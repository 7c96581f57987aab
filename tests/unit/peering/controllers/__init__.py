"""tests.unit.peering.controllers."""
