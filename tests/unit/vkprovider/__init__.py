"""tests.unit.vkprovider."""
