"""tests.unit.vkprovider.remote."""
