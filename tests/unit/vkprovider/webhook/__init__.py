"""tests.unit.vkprovider.webhook."""
