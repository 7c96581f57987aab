"""The provider's capacity estimator: live, aggregated GPU capacity served to consumers over gRPC.

- `server`: `EstimatorServer` (provider side) watches the cluster's nodes and pods into a
  `gpupool.inventory.Inventory` and serves snapshots, placement answers and a snapshot stream over
  mutual TLS to authenticated consumers only;
- `client`: `EstimatorClient` (consumer side) speaks to it with plain `gpupool.capacity` values;
- `wire`: the protobuf <-> dataclass conversions both share;
- `estimator.proto` and its generated `estimator_pb2` (regenerate with
  `python -m gpufed.devtools.protogen`).

Imports `gpupool.capacity`, `gpufed.kube`, `gpufed.apis`, `gpufed.errors` and `peering.handshake`
(the group of the consumer certificates the server trusts); never vkprovider or netfabric.
"""
