"""tests.unit.vkprovider.kubelet."""
