"""`gpufed peer` and `gpufed unpeer` end to end: the handshake and the slice (`peering.ops.peer`),
the network fabric (`netfabric.ops`) and the wait for the provider's virtual node, in that order.

Owns: `PeerSettings` (what `gpufed peer`'s flags ask for), `peer` and `unpeer` (the one call each
verb makes) and `VirtualNodeReady`, the step that makes `peer` return when pods can be offloaded,
not merely when the slice is granted. That step owns no object: the consumer's controller starts
the virtual kubelet when the slice is granted and the virtual kubelet registers the node; the step
only watches for the result and explains a delay.

Does not: check flags (the CLI does) or print (the `Reporter` given does).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.ops import force_unpeer
from netfabric import ops as network_ops
from netfabric.ops import NetworkOptions, NetworkStep
from peering.ops import peer as peering_ops
from peering.ops.peer import ClusterRef, PeerError, PeerRequest, PeerResult, Peers, Reporter, Step

POLL_S = 0.5


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass
class VirtualNodeReady:
    """`gpufed peer` step: every virtual node of the provider exists and is Ready."""

    timeout_s: float
    name: str = "waiting for the virtual node to be Ready"

    async def run(self, peers: Peers, report: Reporter) -> None:
        selector = f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE},{REMOTE_CLUSTER_LABEL}={peers.provider_id}"
        deadline = time.monotonic() + self.timeout_s
        last = "no virtual node registered yet"
        while True:
            try:
                nodes = await rest.list_items(peers.consumer_api, "/api/v1/nodes", params={"labelSelector": selector})
            except KubeError as e:
                nodes, last = [], f"cannot list nodes: {e}"
            if nodes and all(node_ready(n) for n in nodes):
                names = ", ".join(sorted(n["metadata"]["name"] for n in nodes))
                report.done(f"virtual node {names} Ready")
                return
            if nodes:
                waiting = sorted(n["metadata"]["name"] for n in nodes if not node_ready(n))
                last = f"{', '.join(waiting)} not Ready"
            if time.monotonic() > deadline:
                raise PeerError(
                    f"the slice is granted but the virtual node is not Ready after {self.timeout_s:.0f} s ({last}); "
                    "is `gpufed controller` running on the consumer? (`kubectl get nodes -l "
                    f"{selector}` and the controller's log tell why)"
                )
            await asyncio.sleep(POLL_S)


@dataclass(frozen=True)
class PeerSettings:
    """What `gpufed peer` asks for: the slice and both clusters, and the network fabric's options
    (None: control plane only, no tunnel)."""

    request: PeerRequest
    network: NetworkOptions | None


async def peer(settings: PeerSettings, report: Reporter) -> PeerResult:
    """Peer the two clusters: handshake, then the network fabric once the consumer is authenticated
    (unless `settings.network` is None), then the slice, then the wait for a Ready virtual node
    when the slice is accepted."""
    after_auth: list[Step] = [] if settings.network is None else [NetworkStep(settings.network)]
    after_grant: list[Step] = [VirtualNodeReady(settings.request.timeout_s)]
    return await peering_ops.peer(settings.request, report, after_auth=after_auth, after_grant=after_grant)


async def unpeer(
    consumer: ClusterRef, provider: ClusterRef, report: Reporter, timeout_s: float, *, delete_volumes: bool = False
) -> int:
    """Remove the network fabric of the peering, then everything else it created on both clusters;
    the number of peering objects deleted (0: nothing was peered). Refused, before anything is
    removed, while one side does not answer (saying what `--force` on the other would delete), and
    while claims are bound on the provider, unless `delete_volumes`."""
    await force_unpeer.unreachable_hint(consumer, provider)
    await peering_ops.check_claims(consumer, provider, report, delete_volumes=delete_volumes)
    await network_ops.disconnect(consumer, provider, report)
    return await peering_ops.unpeer(consumer, provider, report, timeout_s, delete_volumes=delete_volumes)
