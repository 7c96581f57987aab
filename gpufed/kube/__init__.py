"""The Kubernetes kernel every gpufed component shares, domain-free: clients from kubeconfigs
(`client`, with the one kubeconfig check), raw-JSON REST (`rest`), resilient watches (`watch`),
work queues (`queue`), leader election (`leader`), Events (`events`), Prometheus metrics
(`metrics`), API budgets (`budget`), serving certificates (`servingtls`), upgraded connections
(`upgrade`), manifests (`manifests`), typed accessors for metadata, conditions and RFC 3339 times
(`meta`, `conditions`, `times`), and the lazy loading of the client library (`library`).

Imports only `gpufed.errors` from the rest of the project (import-linter holds it to that), and
client-library exceptions do not leak past it: callers see `client.KubeError`.
"""
