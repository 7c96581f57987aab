"""Writing the status of a gpufed object with server-side apply, for every peering reconciler.

Owns: `write`, which applies a status to the status subresource of a gpufed CR (ForeignCluster,
ResourceSlice, Tenant, TwinNamespace, NamespaceOffloading) under gpufed's one field manager.

Does not: build conditions or tell a real change from a rewrite (`gpufed.kube.conditions` does),
or decide what a status says (the reconcilers do).
"""

from __future__ import annotations

from typing import Any

from gpufed.apis.meta import API_VERSION
from gpufed.kube import rest


async def write(
    api: Any, kind: str, plural: str, name: str, status: dict[str, Any], namespace: str | None = None
) -> None:
    """Apply `status` to the status subresource of a gpufed object."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    await rest.apply(
        api,
        rest.path(API_VERSION, plural, name, namespace=namespace, sub="status"),
        {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "status": status},
    )
