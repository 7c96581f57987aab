"""What the virtual-kubelet layer adds to `gpufed peer`: waiting until the provider's virtual node is
Ready, so that `peer` returns when pods can be offloaded (not merely when the slice is granted).

It owns no object: the consumer's controller starts the virtual kubelet when the slice is granted and
the virtual kubelet registers the node; this step only watches for the result and explains a delay.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from peering.ops.peer import PeerError, Peers, Reporter

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
