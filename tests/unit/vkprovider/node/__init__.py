"""tests.unit.vkprovider.node."""
