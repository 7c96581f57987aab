"""`gpufed doctor`: check a cluster's peerings end to end and say what is wrong and how to fix it.

Each check yields a `Check` (OK / WARN / FAIL, a one-line finding and, unless OK, a concrete fix:
a command or what to change). The package is split along that path:

- `checks`: the values (`Check`, `Report`, the statuses); pure.
- `verdicts`: the pure functions that judge what was read (`judge_*`, the time passed in).
- `settings`: what to check and the thresholds (`DoctorSettings`).
- `probes`: the reading, one coroutine per check (the cluster, the peers' credentials and APIs,
  certificates, the webhook, the capacity estimators, the tunnel).
- `report`: `doctor` and `diagnose`, every check side by side under its own timeout, in order.

What is checked, run against the cluster of `--kubeconfig`/`--context`:
- this cluster: gpufed installed (CRDs, ClusterRoles), its identity (ConfigMap gpufed/gpufed-identity),
  the controller running (leader Lease gpufed/gpufed-controller when there is one, else its
  webhook answering), the offloading webhook (configuration, caBundle, /healthz over TLS verified
  with that caBundle, or the endpoints of a Service), the capacity estimator it serves (TLS);
- per provider it consumes from (ForeignCluster with role Provider): authentication, the client
  certificate of the stored credentials (expiry), the provider's API with those credentials
  (GET /version round trip), the grant (ResourceSlice decision), the virtual nodes (Ready, lease),
  the tunnel (Connection handshake age, MTU) and the provider's capacity estimator (GetCapacity);
- per consumer it provides for (role Consumer): the Tenant's handshake, the certificate issued to
  the consumer, the grants of its slices, the tunnel.

Invariants: read-only (nothing is written anywhere); keys and tokens are never read into a finding
(only certificates' public fields are shown); a check that fails to read what it needs is a FAIL
naming the error, never an exception out of `diagnose`.

The package exports nothing itself: the CLI imports `report` (and `checks` for rendering), so
importing the pure modules loads no client library.
"""
