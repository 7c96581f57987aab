"""Dynamic Resource Allocation (resource.k8s.io/v1) for the local clusters' kwok GPU nodes.

Owns: what the local environment's DRA driver publishes, as a real GPU driver would. The last
`draNodes` nodes of a GPU pool (`topology.NodePool.dra_nodes`) are DRA-managed: their GPUs are
devices in ResourceSlices of the driver `DRIVER` (published by the `dra-publisher` applet of
gpufed-k8s, deploy/local/cmd/gpufed-k8s/dra.go, from the JSON `publisher_config` builds) instead of
the extended resource `nvidia.com/gpu` in the node's capacity (`topology` leaves it out for those
nodes: advertising both would count every GPU twice). Each cluster with DRA nodes gets the
DeviceClass `DEVICE_CLASS`, selecting the driver's devices and mapped to `nvidia.com/gpu` through
`extendedResourceName` (Kubernetes 1.36's DRAExtendedResource, beta and on by default), so a pod
asking `nvidia.com/gpu` is also placed on a DRA node: the scheduler allocates a claim for it.

Devices of a node with `gpus` GPUs: `gpu-0` .. `gpu-<gpus-1>`, attributes in the driver's domain
(unqualified names): type "gpu", productName, uuid (`GPU-` + a uuid5 of the node name and index:
stable across restarts, unique across nodes), index, migCapable (A100/H100), architecture (from the
product name); capacity `memory` = the pool's `gpuMemoryMiB` in Mi (absent when the pool does not
say).

Pure: builds dicts, does no I/O. Does not: start the publisher or apply the DeviceClass
(`launcher`), or decide which nodes are DRA-managed (`topology`). Kwok nodes cannot exercise the
kubelet's side of DRA (NodePrepareResources): claims are allocated and reserved, never prepared.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from gpufed.localenv.topology import ClusterSpec, NodePool

#: The DRA driver name: the domain of the devices' attributes and capacities.
DRIVER = "gpu.nvidia.com"
#: The DeviceClass selecting every device of `DRIVER` (named after it, as NVIDIA's driver does).
DEVICE_CLASS = DRIVER
#: The extended resource the DeviceClass maps onto the driver's devices.
EXTENDED_RESOURCE = GPU_RESOURCE
#: The device capacity holding each GPU's memory.
MEMORY_CAPACITY = "memory"
#: Namespace of the uuid5 that names each simulated GPU (a fixed random UUID: never change it).
_UUID_NAMESPACE = uuid.UUID("6f1c7a52-3f0e-4d36-9c55-0b7a2d9e8c41")
#: Product-name fragment -> (architecture, MIG capable); the first match wins.
_ARCHITECTURES: tuple[tuple[str, str, bool], ...] = (
    ("H100", "Hopper", True),
    ("A100", "Ampere", True),
    ("L4", "Ada Lovelace", False),
)
UNKNOWN_ARCHITECTURE = "unknown"


def architecture(product: str) -> tuple[str, bool]:
    """(architecture, MIG capable) of a GPU product name such as `NVIDIA-H100-80GB-HBM3`."""
    parts = re.split(r"[-_ ]", product.upper())
    for fragment, arch, mig in _ARCHITECTURES:
        if fragment in parts:
            return arch, mig
    return UNKNOWN_ARCHITECTURE, False


def gpu_uuid(node: str, index: int) -> str:
    """The simulated GPU's UUID, `GPU-<uuid5(node/index)>`: deterministic, unique per node and index."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def devices(node: str, pool: NodePool) -> list[dict[str, Any]]:
    """The devices the driver publishes for `node`, a node of `pool` (in the publisher's config format:
    attributes as resource.k8s.io/v1 DeviceAttributes, capacities as plain quantities)."""
    if pool.gpus == 0 or pool.gpu_product is None:
        return []
    arch, mig = architecture(pool.gpu_product)
    out: list[dict[str, Any]] = []
    for i in range(pool.gpus):
        device: dict[str, Any] = {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": pool.gpu_product},
                "uuid": {"string": gpu_uuid(node, i)},
                "index": {"int": i},
                "migCapable": {"bool": mig},
                "architecture": {"string": arch},
            },
            "capacity": {},
        }
        if pool.gpu_memory_mib:
            device["capacity"][MEMORY_CAPACITY] = f"{pool.gpu_memory_mib}Mi"
        out.append(device)
    return out


def dra_nodes(spec: ClusterSpec) -> list[str]:
    """Names of the cluster's DRA-managed nodes, in topology order."""
    return [n.name for n in spec.nodes() if n.dra]


def publisher_config(spec: ClusterSpec) -> dict[str, Any]:
    """The dra-publisher's --config (JSON): the driver and every DRA node's devices."""
    return {
        "driver": DRIVER,
        "nodes": [{"name": n.name, "devices": devices(n.name, n.pool)} for n in spec.nodes() if n.dra],
    }


def device_class() -> dict[str, Any]:
    """The DeviceClass `DEVICE_CLASS`: every device of `DRIVER`, also requestable as `nvidia.com/gpu`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS, "labels": {"app.kubernetes.io/managed-by": "gpufed-local"}},
        "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
            "extendedResourceName": EXTENDED_RESOURCE,
        },
    }


def slices_published(slices: list[dict[str, Any]], spec: ClusterSpec) -> bool:
    """Whether `slices` (ResourceSlices as read from the API) hold every device of every DRA node."""
    want = {n.name: n.pool.gpus for n in spec.nodes() if n.dra}
    have: dict[str, int] = {}
    for s in slices:
        sp = s.get("spec") or {}
        if sp.get("driver") == DRIVER and sp.get("nodeName") in want:
            have[sp["nodeName"]] = have.get(sp["nodeName"], 0) + len(sp.get("devices") or [])
    return all(have.get(node, 0) >= count for node, count in want.items())
