"""tests.unit.vkprovider.forge."""
