"""The consumer's claims whose data lives on providers, as unpeering and unoffloading see them.

Owns: `claims_of` and `bound_claims` (the consumer's claims bound to gpufed's virtual volumes, optionally of one
provider or one namespace; read from the virtual PersistentVolumes, which name the provider in their
label `gpufed.io/remote-cluster-id` and their claim in `claimRef`), `describe` (them, for a refusal)
and `delete_claims`. Unpeering deletes the twin namespaces, and unoffloading a namespace deletes its
twin namespaces: the provider's claims and their data go with them, so both refuse while such claims
exist unless the operator passes `--delete-volumes`, which deletes the consumer's claims first (their
virtual kubelet then deletes the provider's copies, as for any deleted claim).

Does not: decide anything about volumes of the consumer's own storage (they are not the peering's),
or wait for pods: Kubernetes keeps a claim in use (`kubernetes.io/pvc-protection`) until its pods
are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, REMOTE_PHASE_ANNOTATION
from gpufed.kube import rest

#: Volumes in these phases are being reclaimed already: their claim is gone.
_RECLAIMING = frozenset({"Released", "Failed"})


@dataclass(frozen=True)
class BoundClaim:
    namespace: str
    name: str
    provider: str
    size: str
    #: The phase of the provider's claim, as its virtual kubelet last mirrored it ("" : not yet).
    remote_phase: str = ""
    #: The virtual volume's own phase on the consumer.
    phase: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} on {self.provider} ({self.size})"


def claims_of(volumes: list[dict[str, Any]], namespace: str | None = None) -> list[BoundClaim]:
    """The claims gpufed's virtual volumes are bound to (in `namespace`; None: any), sorted (pure)."""
    found = []
    for pv in volumes:
        meta = pv.get("metadata") or {}
        spec = pv.get("spec") or {}
        ref = spec.get("claimRef") or {}
        provider = str((meta.get("labels") or {}).get(REMOTE_CLUSTER_LABEL) or "")
        if not provider or not ref.get("name") or (pv.get("status") or {}).get("phase") in _RECLAIMING:
            continue
        if namespace is not None and ref.get("namespace") != namespace:
            continue
        found.append(
            BoundClaim(
                str(ref.get("namespace") or ""),
                str(ref["name"]),
                provider,
                str((spec.get("capacity") or {}).get("storage") or "?"),
                str((meta.get("annotations") or {}).get(REMOTE_PHASE_ANNOTATION) or ""),
                str((pv.get("status") or {}).get("phase") or ""),
            )
        )
    return sorted(found, key=lambda c: (c.namespace, c.name))


async def read_volumes(api: Any, provider: str | None = None) -> list[dict[str, Any]]:
    """gpufed's virtual volumes (of `provider`; None: of every provider)."""
    selector = f"{REMOTE_CLUSTER_LABEL}={provider}" if provider else REMOTE_CLUSTER_LABEL
    return await rest.list_items(api, "/api/v1/persistentvolumes", params={"labelSelector": selector})


async def bound_claims(api: Any, *, provider: str | None = None, namespace: str | None = None) -> list[BoundClaim]:
    """The consumer's claims bound on `provider` (None: any), in `namespace` (None: any), sorted."""
    return claims_of(await read_volumes(api, provider), namespace)


def describe(claims: list[BoundClaim], shown: int = 10) -> str:
    text = ", ".join(str(c) for c in claims[:shown])
    return text + (f", and {len(claims) - shown} more" if len(claims) > shown else "")


async def delete_claims(api: Any, claims: list[BoundClaim]) -> list[str]:
    """Delete the consumer's claims (their data on the providers goes with them); the ones deleted now."""
    deleted = []
    for c in claims:
        if await rest.delete(api, rest.path("v1", "persistentvolumeclaims", c.name, namespace=c.namespace)):
            deleted.append(f"{c.namespace}/{c.name}")
    return deleted
