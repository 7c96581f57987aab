"""The virtual Node: registration, status heartbeats and the node lease.

Owns, for one Node name:
- registration: the Node is created with the provider's labels, the virtual-node taint, capacity,
  addresses and kubelet port; labels and the taint we own are merged into an existing Node without
  touching others' labels or taints; a deleted Node is recreated (a watch on the name sees it);
- status: conditions Ready / MemoryPressure / DiskPressure / PIDPressure / NetworkUnavailable,
  capacity, allocatable, addresses, daemonEndpoints, nodeInfo — sent as a strategic-merge patch
  of nodes/status (conditions merge by type: conditions other components set are kept), at once
  when anything changes and at least every `status_interval_s` (heartbeat); one sync at a time
  (the status loop's and `sync_coalesced`'s), so a status read earlier is never written after one
  read later (the scheduler would otherwise see a stale allocatable, e.g. a grant already lowered);
- the Lease `kube-node-lease/<node>` (owner: the Node), renewed every `lease_renew_s` with
  `lease_duration_s`, which is what the node-lifecycle controller watches for liveness;
- `remove()`: deleting the Node (on unpeer) — never on an ordinary stop, so restarts keep pods bound.

Metrics (label `node`): `gpufed_node_ready` (1/0, as last written to the Node),
`gpufed_node_allocatable{resource}` (what the Node advertises, in base units: cores, bytes, GPUs)
and `gpufed_node_lease_renewals_total{outcome}` (ok / failed).

Does not: know where resources come from (`NodeProvider.node_state`), or touch pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from gpufed.apis.quantity import QuantityError, parse, resource_unit
from gpufed.apis.wire import VIRTUAL_NODE_EXCLUSION_LABELS, VIRTUAL_NODE_TAINT
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.metrics import GaugeMap
from gpufed.kube.times import rfc3339
from gpufed.kube.watch import watch
from vkprovider.node.provider import NodeProvider, NodeState

LEASE_DURATION_S = 40
LEASE_RENEW_S = 10.0
STATUS_INTERVAL_S = 60.0
#: Seconds between reads of the provider's node state (capacity and health).
STATE_POLL_S = 5.0
MIN_POKE_INTERVAL_S = 0.25
PRESSURE_CONDITIONS = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "the provider has sufficient memory"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "the provider has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "the provider has sufficient PIDs"),
    ("NetworkUnavailable", "RouteCreated", "the pod network of the provider is reachable"),
)

NODE_READY = Gauge("gpufed_node_ready", "Whether a virtual node is Ready (1) or not (0), as last written.", ["node"])
NODE_ALLOCATABLE = GaugeMap(
    Gauge(
        "gpufed_node_allocatable",
        "Allocatable resources a virtual node advertises, in base units (label unit: core, byte, integer).",
        ["node", "resource", "unit"],
    ),
    resource_unit,
)
LEASE_RENEWALS = Counter(
    "gpufed_node_lease_renewals_total",
    "Renewals of a virtual node's Lease, by outcome (ok, failed).",
    ["node", "outcome"],
)


@dataclass(frozen=True)
class NodeSettings:
    #: Node name.
    name: str
    #: InternalIP the node publishes (where its kubelet API listens).
    address: str = "127.0.0.1"
    #: Port of its kubelet API (daemonEndpoints.kubeletEndpoint.Port).
    kubelet_port: int = 10250
    #: Lease duration (s) and renewal interval (s); the kubelet's defaults.
    lease_duration_s: int = LEASE_DURATION_S
    lease_renew_s: float = LEASE_RENEW_S
    #: Longest interval (s) between status patches when nothing changes.
    status_interval_s: float = STATUS_INTERVAL_S
    #: Interval (s) between reads of the provider's state.
    state_poll_s: float = STATE_POLL_S
    #: Shortest interval (s) between two reads when woken (`poke`): during a burst every bound pod
    #: pokes, and reading the state is O(pods), so back-to-back reads made a burst O(pods^2) (45 %
    #: of the virtual kubelet's CPU at 2000 pods in `make bench`'s profile). Pokes meanwhile coalesce.
    min_poke_interval_s: float = MIN_POKE_INTERVAL_S
    #: nodeInfo.kubeletVersion (shown by `kubectl get nodes`).
    version: str = "v0.0.0-gpufed"
    #: ownerReferences of the Node (e.g. the ForeignCluster: unpeering garbage-collects it).
    owner_references: tuple[Mapping[str, Any], ...] = ()
    #: Extra labels (on top of the provider's).
    labels: Mapping[str, str] = field(default_factory=dict)


def conditions(state: NodeState, previous: list[Mapping[str, Any]], now: str) -> list[dict[str, Any]]:
    """Our five conditions; lastTransitionTime kept while a condition's status is unchanged."""
    prev = {str(c.get("type")): c for c in previous}
    want: list[tuple[str, str, str, str]] = [
        ("Ready", "True" if state.ready else "False", state.reason, state.message),
        *((t, "False", r, m) for t, r, m in PRESSURE_CONDITIONS),
    ]
    out = []
    for type_, status, reason, message in want:
        old = prev.get(type_) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        out.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": since or now,
            }
        )
    return out


class NodeController:
    """Keeps one virtual Node registered, its status fresh and its lease renewed."""

    def __init__(self, api: Any, provider: NodeProvider, settings: NodeSettings) -> None:
        self.api = api
        self.provider = provider
        self.settings = settings
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        #: The coalesced sync not yet started (`sync_coalesced`), its lock, and the tasks running them.
        self._pending_sync: asyncio.Future[None] | None = None
        self._coalesce_lock = asyncio.Lock()
        #: Held from reading the provider's state to writing it: syncs never overtake each other.
        self._sync_lock = asyncio.Lock()
        self._coalesced: set[asyncio.Task[None]] = set()
        self._node_uid: str | None = None
        #: The Node as the watch last delivered it, once it has listed (None: there is none).
        self._seen: dict[str, Any] | None = None
        self._node_listed = False
        self._sent: tuple[Any, ...] | None = None
        self._sent_at = 0.0
        #: Loop time the last `sync` started (coalesced syncs are spaced from it).
        self._last_sync_start = float("-inf")
        self._log = structlog.get_logger().bind(node=settings.name)

    @property
    def _path(self) -> str:
        return rest.path("v1", "nodes", self.settings.name)

    # ---- shapes

    def _labels(self, state: NodeState) -> dict[str, str]:
        return {
            **dict(state.labels),
            **dict(self.settings.labels),
            **VIRTUAL_NODE_EXCLUSION_LABELS,
            "kubernetes.io/hostname": self.settings.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }

    def _status(self, state: NodeState, previous: list[Mapping[str, Any]]) -> dict[str, Any]:
        s = self.settings
        return {
            "capacity": dict(state.capacity),
            "allocatable": dict(state.allocatable),
            "conditions": conditions(state, previous, rfc3339()),
            # Only the kubelet API's own address: no Hostname (the node's name resolves nowhere, and
            # an API server preferring Hostname would dial it; upgrade tools would try to reach it).
            "addresses": [{"type": "InternalIP", "address": s.address}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": s.kubelet_port}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": s.version,
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "gpufed://remote",
                "osImage": "gpufed virtual node",
                "kernelVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    def _node(self, state: NodeState) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.settings.name,
            "labels": self._labels(state),
            "annotations": dict(state.annotations),
        }
        if self.settings.owner_references:
            meta["ownerReferences"] = [dict(o) for o in self.settings.owner_references]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": meta,
            "spec": {"taints": [dict(VIRTUAL_NODE_TAINT)]},
            "status": self._status(state, []),
        }

    # ---- loops

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._status_loop())
            tg.create_task(self._lease_loop())
            tg.create_task(
                watch(
                    self.api,
                    "/api/v1/nodes",
                    self._on_node,
                    what=f"node {self.settings.name}",
                    params={"fieldSelector": f"metadata.name={self.settings.name}"},
                    on_synced=self._listed,
                )
            )

    def poke(self) -> None:
        """Read the provider's state again now (e.g. a pod was bound: capacity changed)."""
        self._wake.set()

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        self._seen = None if kind == "DELETED" else obj
        if kind == "DELETED":
            self._log.warning("node deleted by someone else; registering it again")
            self._node_uid = None
            self._sent = None
            self._wake.set()

    def _listed(self) -> None:
        self._node_listed = True

    async def _status_loop(self) -> None:
        while True:
            self._wake.clear()  # before the sync: a deletion seen during it wakes the next round
            started = time.monotonic()
            try:
                await self.sync()
            except KubeError as e:
                self._log.warning("node status not written", error=str(e))
            rest_s = self.settings.min_poke_interval_s - (time.monotonic() - started)
            if rest_s > 0:
                await asyncio.sleep(rest_s)
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
                # arrives as the wake-up completes, and this loop is woken very often.
                async with asyncio.timeout(self.settings.state_poll_s):
                    await self._wake.wait()

    async def sync_coalesced(self) -> None:
        """A `sync` that starts after this call, shared by every caller that arrives before it starts:
        a burst of pods ending costs one status write per `min_poke_interval_s` at most, not one
        node sync per pod. Raises what that sync raised."""
        fut = self._pending_sync
        if fut is None:
            fut = self._pending_sync = asyncio.get_running_loop().create_future()
            # retrieved here too, so that a sync whose every caller was cancelled logs no warning
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            task = asyncio.create_task(self._run_coalesced(fut))
            self._coalesced.add(task)
            task.add_done_callback(self._coalesced.discard)
        await asyncio.shield(fut)

    async def _run_coalesced(self, fut: asyncio.Future[None]) -> None:
        async with self._coalesce_lock:
            # Spaced like the status loop's reads: a burst of pods ending costs one read and at most
            # one status write per `min_poke_interval_s`, and every caller until the sync starts shares it.
            loop = asyncio.get_running_loop()
            wait_s = self._last_sync_start + self.settings.min_poke_interval_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if self._pending_sync is fut:
                self._pending_sync = None  # callers from now on need a later sync
            try:
                await self.sync()
            except Exception as e:  # handed to every waiter
                fut.set_exception(e)
            else:
                fut.set_result(None)

    async def sync(self) -> None:
        """Register the Node if needed, then patch its status when it changed or a heartbeat is due.

        Syncs run one at a time: what is written last was read last."""
        async with self._sync_lock:
            await self._sync()

    async def _sync(self) -> None:
        self._last_sync_start = asyncio.get_running_loop().time()
        state = await self.provider.node_state()
        # The watch on our name keeps the Node at hand; read it only until that watch has listed.
        node = self._seen if self._node_listed else await rest.get(self.api, self._path)
        if node is None:
            node = await self._register(state)
        self._node_uid = node["metadata"]["uid"]
        await self._merge_meta(node, state)
        key = (
            tuple(sorted(state.capacity.items())),
            tuple(sorted(state.allocatable.items())),
            state.ready,
            state.reason,
            state.message,
        )
        loop = asyncio.get_running_loop()
        if key == self._sent and loop.time() - self._sent_at < self.settings.status_interval_s:
            return
        previous = list((node.get("status") or {}).get("conditions") or [])
        await rest.strategic_patch(
            self.api,
            self._path + "/status",
            {"status": self._status(state, previous)},
            what=f"patch status of node {self.settings.name}",
        )
        if key != self._sent:
            self._log.info("node status", ready=state.ready, reason=state.reason, allocatable=dict(state.allocatable))
            self._export(state)
        self._sent, self._sent_at = key, loop.time()
        self.ready.set()

    def _export(self, state: NodeState) -> None:
        name = self.settings.name
        NODE_READY.labels(name).set(1 if state.ready else 0)
        allocatable: dict[str, float] = {}
        for resource, quantity in state.allocatable.items():
            with contextlib.suppress(QuantityError):
                allocatable[resource] = float(parse(quantity))
        NODE_ALLOCATABLE.set(allocatable, name)

    async def _register(self, state: NodeState) -> dict[str, Any]:
        try:
            node = await rest.create(self.api, "/api/v1/nodes", self._node(state))
            self._log.info("node registered")
        except KubeError as e:
            if not e.conflict:
                raise
            found = await rest.get(self.api, self._path)
            if found is None:
                raise
            node = found
        self._sent = None
        self._seen = node
        return node

    async def _merge_meta(self, node: Mapping[str, Any], state: NodeState) -> None:
        """Our labels, annotations and taint onto the Node, leaving everything else as it is."""
        meta = node.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        annotations = dict(meta.get("annotations") or {})
        taints = list((node.get("spec") or {}).get("taints") or [])
        patch: dict[str, Any] = {}
        want_labels = self._labels(state)
        if any(labels.get(k) != v for k, v in want_labels.items()):
            patch.setdefault("metadata", {})["labels"] = want_labels
        if any(annotations.get(k) != v for k, v in state.annotations.items()):
            patch.setdefault("metadata", {})["annotations"] = dict(state.annotations)
        if not any(
            t.get("key") == VIRTUAL_NODE_TAINT["key"] and t.get("effect") == VIRTUAL_NODE_TAINT["effect"]
            for t in taints
        ):
            # The taint list has no merge key usable by a merge patch: send the whole list, guarded.
            patch.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
            patch["spec"] = {"taints": [*taints, dict(VIRTUAL_NODE_TAINT)]}
        if patch:
            await rest.merge_patch(self.api, self._path, patch, what=f"label node {self.settings.name}")

    async def _lease_loop(self) -> None:
        while True:
            try:
                await self.renew_lease()
                delay = self.settings.lease_renew_s
                LEASE_RENEWALS.labels(self.settings.name, "ok").inc()
            except KubeError as e:
                self._log.warning("lease not renewed", error=str(e))
                delay = min(self.settings.lease_renew_s, 2.0)
                LEASE_RENEWALS.labels(self.settings.name, "failed").inc()
            await asyncio.sleep(delay)

    async def renew_lease(self) -> None:
        if self._node_uid is None:
            return  # the lease is owned by the Node: wait for its registration
        name = self.settings.name
        url = rest.path("coordination.k8s.io/v1", "leases", name, namespace="kube-node-lease")
        lease = await rest.get(self.api, url)
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": self.settings.lease_duration_s,
            "renewTime": rfc3339(micro=True),
        }
        if lease is None:
            await rest.create(
                self.api,
                rest.path("coordination.k8s.io/v1", "leases", namespace="kube-node-lease"),
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": name,
                        "namespace": "kube-node-lease",
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uid}],
                    },
                    "spec": spec,
                },
            )
            return
        lease["spec"] = {**(lease.get("spec") or {}), **spec}
        await rest.request(self.api, "PUT", url, body=lease, what=f"renew lease {name}")

    async def remove(self) -> None:
        """Delete the Node (its Lease goes with it by garbage collection)."""
        await rest.delete(self.api, self._path, what=f"delete node {self.settings.name}")
        self._log.info("node removed")
        with contextlib.suppress(KeyError):  # never exported (prometheus-client < 0.21 raises then)
            NODE_READY.remove(self.settings.name)
        NODE_ALLOCATABLE.remove(self.settings.name)
