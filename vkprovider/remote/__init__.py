"""The provider for peered clusters: offloaded pods run as twins in twin namespaces of a provider."""
