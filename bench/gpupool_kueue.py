"""The gpu-pool benchmark's Kueue mode: the queue the trace goes through, on the consumer's Kueue.

Owns: the objects a Kueue administrator would write for the federated pool, as docs/kueue.md shows
them — one ClusterQueue `bench-gpu` (BestEffortFIFO, every namespace) with one resource group
covering cpu, memory and nvidia.com/gpu over the ResourceFlavors gpufed keeps (one per pool virtual
node, named after it), each flavor's nominal GPU quota = the GPUs of its product at the provider
(32 H100, 8 A100, 4 L4), cpu and memory quotas large enough never to matter, flavors listed largest
first (Kueue tries them in that order); one LocalQueue `bench-gpu` in the bench namespace pointing at
it; and how a trace Job is handed to it (`queued`: the queue-name label, created suspended). `setup`
waits for gpufed's flavors, applies both queues, waits for the ClusterQueue to be Active and reads
back the quotas it holds (gpufed clamps them to the grants); `teardown` deletes both.

Does not: install or configure Kueue (the local environment runs it on the consumer, topology flag
`kueue`), create flavors (gpufed's FlavorKeeper does), or run the trace (bench.gpupool).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bench.bursts import until
from gpufed.kube import rest
from gpufed.kube.client import KubeError

API = "kueue.x-k8s.io/v1beta2"
GROUP, VERSION = API.split("/")
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
#: Name of the ClusterQueue and of the LocalQueue.
QUEUE = "bench-gpu"
GPU = "nvidia.com/gpu"
#: cpu and memory quota per flavor: far beyond what the trace asks (its pods ask 100m / 128Mi).
CPU_QUOTA = "1000"
MEMORY_QUOTA = "4Ti"
MANAGED_BY = "app.kubernetes.io/managed-by=gpufed"
FLAVORS_TIMEOUT_S = 120.0
ACTIVE_TIMEOUT_S = 60.0


def cluster_queue(name: str, quotas: Mapping[str, int]) -> dict[str, Any]:
    """The ClusterQueue: one resource group over the flavors in `quotas` (flavor -> nominal GPUs),
    largest first."""
    flavors = sorted(quotas.items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": CPU_QUOTA},
                                {"name": "memory", "nominalQuota": MEMORY_QUOTA},
                                {"name": GPU, "nominalQuota": str(gpus)},
                            ],
                        }
                        for flavor, gpus in flavors
                    ],
                }
            ],
        },
    }


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def queued(job: Mapping[str, Any], queue: str = QUEUE) -> dict[str, Any]:
    """`job` handed to the LocalQueue `queue`: its label, and suspended until Kueue admits it."""
    meta = dict(job["metadata"])
    meta["labels"] = {**(meta.get("labels") or {}), QUEUE_NAME_LABEL: queue}
    return {**job, "metadata": meta, "spec": {**job["spec"], "suspend": True}}


def gpu_quotas(cq: Mapping[str, Any]) -> dict[str, int]:
    """Flavor -> nominal GPU quota, as a ClusterQueue holds them."""
    out: dict[str, int] = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                if r.get("name") == GPU:
                    out[str(flavor["name"])] = int(str(r.get("nominalQuota", "0")))
    return out


def _active(obj: Mapping[str, Any] | None) -> bool:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conds)


def _path(plural: str, name: str | None = None, namespace: str | None = None) -> str:
    if name is None:
        return rest.path(API, plural, namespace=namespace)
    return rest.path(API, plural, name, namespace=namespace)


async def _apply(api: Any, body: Mapping[str, Any], plural: str, namespace: str | None = None) -> None:
    """Create `body`, or give an existing one (left by a `--keep` run) this spec."""
    name = body["metadata"]["name"]
    if await rest.get(api, _path(plural, name, namespace)) is None:
        await rest.create(api, _path(plural, namespace=namespace), body)
    else:
        await rest.merge_patch(api, _path(plural, name, namespace), {"spec": body["spec"]})


async def setup(api: Any, namespace: str, quotas: Mapping[str, int]) -> dict[str, Any]:
    """Wait for gpufed's flavors of `quotas`, apply the queues, wait for the ClusterQueue to be Active;
    what was asked and what the ClusterQueue holds. Raises RuntimeError when Kueue or a flavor is missing."""
    t0 = time.monotonic()
    seen: set[str] = set()

    async def flavors() -> bool:
        nonlocal seen
        try:
            items = await rest.list_items(api, _path("resourceflavors"), params={"labelSelector": MANAGED_BY})
        except KubeError as e:
            raise RuntimeError(f"Kueue's API is not served on the consumer: {e}") from None
        seen = {str(f["metadata"]["name"]) for f in items}
        return set(quotas) <= seen

    try:
        await until("gpufed's ResourceFlavors", flavors, FLAVORS_TIMEOUT_S, 1.0)
    except RuntimeError as e:
        if "not served" in str(e):
            raise
        raise RuntimeError(
            f"gpufed's ResourceFlavors {sorted(quotas)} did not all appear in {FLAVORS_TIMEOUT_S:.0f}s: "
            f"have {sorted(seen)}"
        ) from None
    flavors_s = time.monotonic() - t0
    await _apply(api, cluster_queue(QUEUE, quotas), "clusterqueues")
    await _apply(api, local_queue(QUEUE, namespace, QUEUE), "localqueues", namespace)

    async def active() -> dict[str, Any] | None:
        cq = await rest.get(api, _path("clusterqueues", QUEUE))
        lq = await rest.get(api, _path("localqueues", QUEUE, namespace))
        return cq if _active(cq) and _active(lq) else None

    try:
        cq: dict[str, Any] = await until("the bench ClusterQueue Active", active, ACTIVE_TIMEOUT_S, 1.0)
    except RuntimeError:
        raise RuntimeError(
            f"the ClusterQueue {QUEUE} or its LocalQueue did not become Active in {ACTIVE_TIMEOUT_S:.0f}s"
        ) from None
    return {
        "cluster_queue": QUEUE,
        "local_queue": f"{namespace}/{QUEUE}",
        "flavor_order": [f for f, _ in sorted(quotas.items(), key=lambda kv: (-kv[1], kv[0]))],
        "gpu_quota_asked": dict(sorted(quotas.items())),
        "gpu_quota_held": dict(sorted(gpu_quotas(cq).items())),
        "flavors_after_s": round(flavors_s, 1),
        "setup_s": round(time.monotonic() - t0, 1),
    }


async def teardown(api: Any, namespace: str) -> None:
    """Delete the LocalQueue and the ClusterQueue (Kueue's finalizer keeps the latter until no
    workload it admitted is left; waits up to 60 s for it)."""
    for path in (_path("localqueues", QUEUE, namespace), _path("clusterqueues", QUEUE)):
        await rest.delete(api, path)

    async def gone() -> bool:
        return await rest.get(api, _path("clusterqueues", QUEUE)) is None

    await until(f"the ClusterQueue {QUEUE} deleted", gone, 60, 1.0)
