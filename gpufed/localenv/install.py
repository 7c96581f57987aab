"""What the launcher writes into each local cluster's API, and how it reads the nodes back.

Owns: the fake kwok nodes of a cluster (labels, the annotations that hand them to kwok and point
metrics-server at their resource-metrics path, pod CIDR, GPU capacity), whether they are Ready,
server-side apply of the launcher's own objects (metrics-server's RBAC, Service and APIService;
Kueue's namespace, CRDs, RBAC and webhook configurations; JobSet's CRD, RBAC and webhook
configurations; the providers' StorageClass and static
volumes), gpufed's CRDs and RBAC from deploy/
(applied, then waited for until Established) and the cluster's NetworkConfig.

Every call takes an API client for one cluster, as its admin. Does not: start or wait for processes
(`launcher`), or decide which objects metrics-server needs (`metricsserver`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpufed.apis.meta import API_VERSION
from gpufed.apis.network import NETWORK_CONFIG, NetworkConfigSpec
from gpufed.apis.wire import SYSTEM_NAMESPACE
from gpufed.kube import manifests, rest
from gpufed.kube.client import KubeError, client, translating
from gpufed.localenv import kwokcfg
from gpufed.localenv.topology import ClusterSpec


def node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


#: kind -> (plural, namespaced) of what the launcher applies beyond `manifests.KINDS`.
_EXTRA_KINDS = {
    "Service": ("services", True),
    "APIService": ("apiservices", False),
    "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
    "StorageClass": ("storageclasses", False),
    "DeviceClass": ("deviceclasses", False),
    "PersistentVolume": ("persistentvolumes", False),
}


async def _apply_one(api: Any, obj: dict[str, Any]) -> None:
    plural, namespaced = _EXTRA_KINDS.get(obj["kind"]) or manifests.KINDS[obj["kind"]]
    meta = obj["metadata"]
    url = rest.path(obj["apiVersion"], plural, meta["name"], namespace=meta.get("namespace") if namespaced else None)
    await rest.apply(api, url, obj, what=f"apply {obj['kind']} {meta['name']}")


async def apply(api: Any, docs: list[dict[str, Any]]) -> None:
    """Server-side apply, in order, of the objects the launcher itself installs (RBAC, Service,
    APIService, webhook configurations, StorageClass, PersistentVolumes, DeviceClass)."""
    for obj in docs:
        await _apply_one(api, obj)


async def apply_kueue(
    api: Any, namespace: dict[str, Any], crds: list[dict[str, Any]], rbac: list[dict[str, Any]]
) -> None:
    """Kueue's namespace, CRDs and RBAC, then wait until every CRD is Established.

    Server-side apply throughout: upstream's CRDs are too large for client-side apply's
    last-applied annotation. The CRDs go in concurrently (each is one write the apiserver validates
    on its own), the Roles once their namespace exists."""
    await _apply_one(api, namespace)
    await asyncio.gather(*(_apply_one(api, d) for d in crds))
    await apply(api, rbac)
    await manifests.wait_established(api, [d["metadata"]["name"] for d in crds])


async def apply_crds_and_rbac(api: Any, crds: list[dict[str, Any]], rbac: list[dict[str, Any]]) -> None:
    """CRDs (server-side, concurrently) and cluster-scoped RBAC, then wait until every CRD is Established."""
    await asyncio.gather(*(_apply_one(api, d) for d in crds))
    await apply(api, rbac)
    await manifests.wait_established(api, [d["metadata"]["name"] for d in crds])


async def ensure_nodes(spec: ClusterSpec, api: Any) -> None:
    """Create the cluster's missing kwok nodes; give existing ones the resource-metrics path they lack."""
    v1 = client.CoreV1Api(api)
    async with translating(f"list nodes of {spec.name}"):
        existing = {n.metadata.name: n for n in (await v1.list_node()).items}
    for node in spec.nodes():
        metrics_path = kwokcfg.node_metrics_path(node.name)
        if node.name in existing:
            # Nodes of an environment started before metrics-server was part of it lack the path.
            annotations = existing[node.name].metadata.annotations or {}
            if annotations.get(kwokcfg.RESOURCE_METRICS_PATH_ANNOTATION) != metrics_path:
                await rest.merge_patch(
                    api,
                    rest.path("v1", "nodes", node.name),
                    {"metadata": {"annotations": {kwokcfg.RESOURCE_METRICS_PATH_ANNOTATION: metrics_path}}},
                    what=f"annotate node {node.name}",
                )
            continue
        labels = {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            **node.pool.node_labels(),
        }
        capacity = node.pool.capacity()
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": labels,
                "annotations": {
                    kwokcfg.KWOK_NODE_ANNOTATION: "fake",
                    # One kwok serves every node on one port; metrics-server asks for this node's path.
                    kwokcfg.RESOURCE_METRICS_PATH_ANNOTATION: metrics_path,
                },
            },
            "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]},
            # Nodes may carry status on create; kwok keeps capacity/allocatable from here.
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        try:
            async with translating(f"create node {node.name}"):
                await v1.create_node(body=body)
        except KubeError as e:
            if not e.conflict:
                raise


async def nodes_ready(spec: ClusterSpec, api: Any) -> bool:
    """Whether every node of the topology is Ready."""
    async with translating(f"list nodes of {spec.name}"):
        nodes = (await client.CoreV1Api(api).list_node()).items
    return {n.name for n in spec.nodes()} <= {n.metadata.name for n in nodes if node_ready(n)}


async def load_gpufed(manifests_dir: Path) -> list[dict[str, Any]]:
    """gpufed's CRDs and RBAC from deploy/ (OSError or ValueError when they cannot be read)."""
    files = sorted((manifests_dir / "crds").glob("*.yaml")) + sorted((manifests_dir / "rbac").glob("*.yaml"))
    return await asyncio.to_thread(manifests.load, files)


async def apply_gpufed(api: Any, docs: list[dict[str, Any]]) -> None:
    """Apply gpufed's CRDs and RBAC and wait until every CRD is Established."""
    await manifests.apply_all(api, docs)
    await manifests.wait_established(
        api, [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
    )


async def apply_network_config(api: Any, spec: ClusterSpec, gateway_endpoint: str) -> None:
    """The cluster's NetworkConfig: its pod CIDR, its service CIDR reserved, its gateway's endpoint."""
    await rest.apply(
        api,
        rest.path(API_VERSION, "networkconfigs", NETWORK_CONFIG, namespace=SYSTEM_NAMESPACE),
        {
            "apiVersion": API_VERSION,
            "kind": "NetworkConfig",
            "metadata": {"name": NETWORK_CONFIG, "namespace": SYSTEM_NAMESPACE},
            "spec": NetworkConfigSpec(
                pod_cidr=spec.pod_cidr,
                reserved_cidrs=[spec.service_cidr],
                gateway_endpoint=gateway_endpoint,
            ).model_dump(by_alias=True),
        },
    )
