"""The provider's capacity estimator: live, aggregated GPU capacity served to consumers over gRPC.

- `server`: `EstimatorServer` (provider side) watches the cluster's nodes and pods into a
  `peering.capacity.Inventory` and serves snapshots, placement answers and a snapshot stream over
  mutual TLS to authenticated consumers only;
- `client`: `EstimatorClient` (consumer side) speaks to it with plain `peering.capacity` values;
- `wire`: the protobuf <-> dataclass conversions both share;
- `estimator.proto` and its generated `estimator_pb2` (regenerate with
  `python -m peering.estimator.codegen`).

Imports `peering.capacity`, `peering.kube`, `peering.ids`/`models`/`handshake`; never vkprovider
or netfabric.
"""
