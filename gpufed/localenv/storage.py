"""Storage of the local clusters: a StorageClass of static local volumes, and the volumes.

Owns: what each cluster gets for claims — the StorageClass `local-disk` (the cluster's default class,
provisioner `kubernetes.io/no-provisioner`, WaitForFirstConsumer, offering ReadWriteOnce through
`gpufed.io/access-modes`) and `VOLUMES_PER_NODE` PersistentVolumes of `VOLUME_SIZE` per node that
runs the cluster's pods (its GPU nodes when it has any: a provider's; else all its nodes: the
consumer's, where claims of gpufed's virtual class whose first pod stays local are bound), each a
`local` volume at `/mnt/disks/vol-<i>` pinned to its node by node affinity (`manifests`).

Why static volumes: kwok's nodes have no disks and run no kubelet that could mount anything, so a
dynamic provisioner would have nothing to provision on. With static local volumes the real parts
still do the real work: kube-scheduler's volume binding picks a volume on the node it places a
claim's first pod on (WaitForFirstConsumer), and kube-controller-manager's PersistentVolume
controller binds the claim to it. Nothing is ever mounted.

Reclaim policy Retain: when a claim goes, its volume becomes Released and keeps its (notional) data
until an administrator clears it; nothing on a provider deletes a tenant's data behind its back, and
a `local` volume has no deleter anyway (Delete would leave it Failed). A released volume is not
reused.

Pure: builds dicts, does no I/O (`launcher` applies them with `install.apply`).
"""

from __future__ import annotations

from typing import Any

from gpufed.apis.wire import (
    DEFAULT_STORAGE_CLASS_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    STATIC_PROVISIONER,
    STORAGE_CLASS_ACCESS_MODES_ANNOTATION,
)
from gpufed.localenv.topology import ClusterSpec

#: Each cluster's default StorageClass (a provider's grant offers it unless the Tenant says otherwise).
STORAGE_CLASS = "local-disk"
#: Static volumes per node that holds volumes, and the size of each.
VOLUMES_PER_NODE = 4
VOLUME_SIZE = "50Gi"
#: Where a volume would live on its node (nothing is there: kwok nodes mount nothing).
VOLUME_PATH = "/mnt/disks/vol-{index}"
ACCESS_MODES = ("ReadWriteOnce",)
_LABELS = {MANAGED_BY_LABEL: MANAGED_BY, "gpufed.io/local-storage": "true"}


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "labels": dict(_LABELS),
            "annotations": {
                DEFAULT_STORAGE_CLASS_ANNOTATION: "true",
                STORAGE_CLASS_ACCESS_MODES_ANNOTATION: ",".join(ACCESS_MODES),
            },
        },
        "provisioner": STATIC_PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }


def volume(node: str, index: int) -> dict[str, Any]:
    """The `index`-th static local volume of `node`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{node}-vol-{index}", "labels": {**_LABELS, "gpufed.io/local-node": node}},
        "spec": {
            "capacity": {"storage": VOLUME_SIZE},
            "accessModes": list(ACCESS_MODES),
            "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "local": {"path": VOLUME_PATH.format(index=index)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
                    ]
                }
            },
        },
    }


def manifests(spec: ClusterSpec) -> list[dict[str, Any]]:
    """The StorageClass and the volumes of a cluster: on its GPU nodes, or on every node of a cluster without."""
    nodes = [n.name for n in spec.nodes() if n.pool.gpus > 0] or [n.name for n in spec.nodes()]
    return [storage_class(), *(volume(n, i) for n in nodes for i in range(VOLUMES_PER_NODE))]
