"""tests.unit.vkprovider.spdy."""
