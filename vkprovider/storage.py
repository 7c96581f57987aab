"""The consumer's virtual StorageClass: claims of it are bound on the provider their first pod goes to.

Owns: `storage_class`, the StorageClass object (provisioner `storage.gpufed.io`, which gpufed's
virtual kubelets play; WaitForFirstConsumer, so a claim waits until the consumer's kube-scheduler has
chosen a node for its first pod; reclaim policy Delete: the provider's claim goes with the consumer's),
and `ensure_storage_class`, which applies it at the controller's start (server-side apply, field
manager gpufed: a class an administrator made under that name with another provisioner is left
alone and reported).

Does not: provision anything (`vkprovider.remote.volumes`, one per provider, in the virtual
kubelets), or bind claims on local nodes: a claim of this class whose first pod is scheduled to a
local node is bound to the consumer's own storage by `vkprovider.localstorage` (a static volume of
the local StorageClass on that node, or a volume its provisioner makes for a shadow claim), which
says so in an Event on the claim (`BoundLocally`, or a Warning when no class or volume fits).
"""

from __future__ import annotations

from typing import Any

import structlog

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, STORAGE_PROVISIONER
from gpufed.kube import rest
from gpufed.kube.client import KubeError


def storage_class(name: str) -> dict[str, Any]:
    """The virtual StorageClass `name`."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {
                "gpufed.io/description": "claims are bound on the gpufed provider their first pod is offloaded to"
            },
        },
        "provisioner": STORAGE_PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": False,
    }


async def ensure_storage_class(api: Any, name: str) -> bool:
    """Make the virtual StorageClass `name` exist; False (logged) when a class of that name belongs to
    another provisioner or the controller may not write it."""
    log = structlog.get_logger().bind(component="storage")
    path = rest.path("storage.k8s.io/v1", "storageclasses", name)
    try:
        have = await rest.get(api, path)
        if have is not None and have.get("provisioner") != STORAGE_PROVISIONER:
            log.warning(
                "storage class taken",
                storage_class=name,
                provisioner=have.get("provisioner"),
                hint="pass another name with --storage-class",
            )
            return False
        if have is None:
            await rest.create(api, rest.path("storage.k8s.io/v1", "storageclasses"), storage_class(name))
            log.info("storage class created", storage_class=name)
    except KubeError as e:
        if e.conflict:
            return True
        log.warning("storage class not ensured", storage_class=name, error=str(e)[:300])
        return False
    return True
