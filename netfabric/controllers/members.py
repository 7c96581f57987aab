"""Which pods of this cluster belong to one peering: the members the gateway's tunnel filter lets through.

Owns: `Members`, a live set of pod addresses built from watches of this cluster's own objects, never
from anything the peer wrote about itself:

- on the provider (the Server end of the tunnel): the pods of the namespaces the provider's own
  controller labelled as that consumer's (`gpufed.io/consumer-cluster-id=<peer>`: the tenant namespace
  and the twin namespaces) — the twin pods the consumer may reach and that may reach it. The pods'
  own origin label (written by the consumer) only narrows the watch; the namespace label decides.
- on the consumer (the Client end): the pods bound to that provider's virtual nodes (nodes labelled
  `gpufed.io/remote-cluster-id=<peer>`, which this cluster's virtual kubelet registers) — the pods
  it offloaded there, at the addresses the virtual kubelet accepted (inside the provider's remapped
  pod range; `netfabric.plan` drops any other). Each virtual node gets its own pod watch, selected
  by `spec.nodeName` on the API server, started when the node appears and stopped when it goes, so
  the gateway never receives the cluster's other pods.

A pod counts while it has an address, is not host-network and has not finished (Succeeded/Failed).
`on_change` is called after every change of the set and once when the watches have listed
(`synced`: the groups, and the pods of each group known then); the gateway agent debounces it.

Does not: render or apply rules (`netfabric.render`, the gateway agent), map addresses between the
real and remapped ranges (`netfabric.plan`), or write anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from ipaddress import IPv4Address
from typing import Any, Literal

from gpufed.apis.wire import CONSUMER_LABEL, ORIGIN_CLUSTER_LABEL, REMOTE_CLUSTER_LABEL
from gpufed.kube import meta
from gpufed.kube.watch import watch

Role = Literal["Server", "Client"]
_FINISHED = frozenset({"Succeeded", "Failed"})


def pod_address(pod: dict[str, Any]) -> IPv4Address | None:
    """The pod's IPv4 address while it may carry traffic; None when it has none, is host-network or finished."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("hostNetwork") or status.get("phase") in _FINISHED:
        return None
    try:
        return IPv4Address(str(status.get("podIP") or ""))
    except ValueError:
        return None


class Members:
    """The member pod addresses of one peering on this cluster, for the gateway of `peer` in `role`."""

    def __init__(self, api: Any, peer: str, role: Role, on_change: Callable[[], None]) -> None:
        self.api = api
        self.peer = peer
        self.role = role
        self.on_change = on_change
        self.synced = asyncio.Event()
        #: pod key -> (its namespace on the provider / its node on the consumer, its address)
        self._pods: dict[tuple[str, str], tuple[str, IPv4Address]] = {}
        #: the namespaces (provider) or virtual nodes (consumer) whose pods are members
        self._groups: set[str] = set()
        self._listed: set[str] = set()
        self._current: frozenset[IPv4Address] = frozenset()
        #: consumer: the pod watch of each virtual node of the peer, in `_tasks` while `run` runs
        self._node_watches: dict[str, asyncio.Task[None] | None] = {}
        self._tasks: asyncio.TaskGroup | None = None

    def addresses(self) -> frozenset[IPv4Address]:
        """The members now (empty until `synced`: the filter fails closed)."""
        return self._current

    def _recompute(self) -> None:
        if not self.synced.is_set():
            return
        now = frozenset(ip for group, ip in self._pods.values() if group in self._groups)
        if now != self._current:
            self._current = now
            self.on_change()

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        key = (meta.namespace(pod), meta.name(pod))
        ip = pod_address(pod)
        group = meta.namespace(pod) if self.role == "Server" else str((pod.get("spec") or {}).get("nodeName") or "")
        if event == "DELETED" or ip is None or not group:
            self._pods.pop(key, None)
        else:
            self._pods[key] = (group, ip)
        self._recompute()

    def on_group(self, event: str, obj: dict[str, Any]) -> None:
        label = CONSUMER_LABEL if self.role == "Server" else REMOTE_CLUSTER_LABEL
        name = meta.name(obj)
        if event == "DELETED" or meta.labels(obj).get(label) != self.peer:
            self._groups.discard(name)
            if self.role == "Client":
                self._stop_node(name)
        else:
            self._groups.add(name)
            if self.role == "Client":
                self._start_node(name)
        self._recompute()

    def _start_node(self, node: str) -> None:
        if node in self._node_watches:
            return
        if self._tasks is None:  # not running: the node's pods are awaited all the same
            self._node_watches[node] = None
            return
        self._node_watches[node] = self._tasks.create_task(
            watch(
                self.api,
                "/api/v1/pods",
                self.on_pod,
                what=f"member pods of {self.peer} on {node}",
                params={"fieldSelector": f"spec.nodeName={node}"},
                on_synced=lambda: self._listed_one(f"pods {node}"),
            )
        )

    def _stop_node(self, node: str) -> None:
        task = self._node_watches.pop(node, None)
        if task is not None:
            task.cancel()
        self._listed.discard(f"pods {node}")
        for key in [k for k, (group, _) in self._pods.items() if group == node]:
            del self._pods[key]

    def _listed_one(self, what: str) -> None:
        self._listed.add(what)
        if self.synced.is_set() or "groups" not in self._listed:
            return
        waiting = {"pods"} if self.role == "Server" else {f"pods {n}" for n in self._node_watches}
        if waiting <= self._listed:
            self.synced.set()
            now = frozenset(ip for group, ip in self._pods.values() if group in self._groups)
            self._current = now
            self.on_change()

    async def run(self) -> None:
        """Watch forever (raises `KubeError` when a watch cannot go on, e.g. forbidden)."""
        if self.role == "Server":
            groups_path, group_label = "/api/v1/namespaces", CONSUMER_LABEL
        else:
            groups_path, group_label = "/api/v1/nodes", REMOTE_CLUSTER_LABEL
        try:
            async with asyncio.TaskGroup() as tg:
                self._tasks = tg
                tg.create_task(
                    watch(
                        self.api,
                        groups_path,
                        self.on_group,
                        what=f"member groups of {self.peer}",
                        params={"labelSelector": f"{group_label}={self.peer}"},
                        on_synced=lambda: self._listed_one("groups"),
                    )
                )
                if self.role == "Server":
                    tg.create_task(
                        watch(
                            self.api,
                            "/api/v1/pods",
                            self.on_pod,
                            what=f"member pods of {self.peer}",
                            params={"labelSelector": f"{ORIGIN_CLUSTER_LABEL}={self.peer}"},
                            on_synced=lambda: self._listed_one("pods"),
                        )
                    )
        finally:
            self._tasks = None
            self._node_watches.clear()
