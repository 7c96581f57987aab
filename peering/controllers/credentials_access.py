"""Consumer side: the virtual kubelets may read their peerings' credentials Secrets, and no other Secret of `gpufed`.

Owns, per ForeignCluster with role Provider (key = the provider's ClusterID), in namespace `gpufed`:
- a Role `gpufed-virtual-kubelet-<provider>` granting `get` on exactly Secret
  `gpufed-remote-<provider>` (`resourceNames`). `get` is all a virtual kubelet does with it
  (gpufed.app.virtual_kubelet reads its credentials with one GET, polled until they exist); a
  list or watch could not be narrowed to one name, so none is granted;
- a RoleBinding of the same name binding that Role to the virtual kubelets' identities (user
  `gpufed:virtual-kubelet`, ServiceAccount `gpufed/gpufed-virtual-kubelet`).

Both are labelled with the provider, owned by the ForeignCluster (garbage-collected with it) and
deleted here when it goes or stops naming role Provider. The consumer role grants them on every
reconcile of a Provider ForeignCluster, before its credentials exist and before it reports the
peering Peered, which is what starts the peering's virtual kubelet (gpufed.app.supervisor in the
local environment, gpufed.app.workloads in a cluster): its virtual kubelet finds the Secret readable
(or, while the handshake is pending, missing) from its first try.

The static Role of the virtual kubelets in `gpufed` (deploy/rbac/virtual-kubelet.yaml) grants no
Secrets, so the cluster's identity key, the WireGuard keys, the pending CSR keys and the serving
certificates' keys stay out of their reach. All virtual kubelets share one identity, so each of them
can read every peering's credentials Secret, not only its own.

RBAC: the controller creates these Roles because it holds `get` on Secrets in `gpufed` itself
(the API server's escalation check lets a subject grant what it holds), and binds them for the
same reason; it needs neither `escalate` nor `bind`.

Watched (Roles and RoleBindings in `gpufed` labelled with a provider): a current object is not
written again, and one that is deleted or changed by someone else reconciles its provider at once.

Does not: decide when a peering is peered, or read or write the Secret (peering.controllers.consumer).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Any

from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROVIDER_LABEL,
    SYSTEM_NAMESPACE,
    VIRTUAL_KUBELET_SERVICE_ACCOUNT,
    VIRTUAL_KUBELET_USER,
    ClusterID,
    credentials_reader,
    remote_kubeconfig_secret,
)
from gpufed.kube import meta, rest
from gpufed.kube.watch import watch

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_API = f"{RBAC_GROUP}/v1"
#: The kinds written here, in the order they are granted (revoked in reverse).
PLURALS = ("roles", "rolebindings")
#: The virtual kubelets' identities on the consumer (deploy/rbac/virtual-kubelet.yaml binds the same two).
SUBJECTS: list[dict[str, str]] = [
    {"kind": "User", "apiGroup": RBAC_GROUP, "name": VIRTUAL_KUBELET_USER},
    {"kind": "ServiceAccount", "name": VIRTUAL_KUBELET_SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE},
]


def wanted(plural: str, provider: ClusterID) -> dict[str, Any]:
    """The Role or RoleBinding of `provider`, without its owner (the ForeignCluster)."""
    name = credentials_reader(provider)
    body: dict[str, Any] = {
        "apiVersion": RBAC_API,
        "kind": "Role" if plural == "roles" else "RoleBinding",
        "metadata": {
            "name": name,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, PROVIDER_LABEL: provider},
        },
    }
    if plural == "roles":
        body["rules"] = [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get"],
                "resourceNames": [remote_kubeconfig_secret(provider)],
            }
        ]
    else:
        body["roleRef"] = {"apiGroup": RBAC_GROUP, "kind": "Role", "name": name}
        body["subjects"] = SUBJECTS
    return body


def _path(plural: str, name: str = "") -> str:
    return rest.path(RBAC_API, plural, name, namespace=SYSTEM_NAMESPACE)


def _grants(obj: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether `obj` (as read) grants exactly what `want` does, whoever owns it."""
    return all(obj.get(k) == want.get(k) for k in ("rules", "roleRef", "subjects"))


def _owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return [r.get("uid") for r in meta.metadata(obj).get("ownerReferences") or []] == [owner_uid]


class CredentialsAccess:
    """The per-peering Roles and RoleBindings of the consumer; `on_change(provider)` is called when
    one of them is deleted or rewritten by someone else (the caller reconciles that provider)."""

    def __init__(self, api: Any, on_change: Callable[[str], None]) -> None:
        self.api = api
        self._on_change = on_change
        #: (plural, name) -> the object, from the watches (and written through by `grant`).
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}
        #: Plurals whose watch has listed: only then does a missing cache entry mean a missing object.
        self._synced: set[str] = set()

    def synced(self) -> bool:
        return self._synced == set(PLURALS)

    def _on_event(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        name = meta.name(obj)
        if not name:
            return
        if kind == "DELETED":
            self._cache.pop((plural, name), None)
        else:
            self._cache[(plural, name)] = obj
        provider = meta.labels(obj).get(PROVIDER_LABEL)
        if not provider or name != credentials_reader(ClusterID(provider)):
            return
        if kind == "DELETED" or not _grants(obj, wanted(plural, ClusterID(provider))):
            self._on_change(str(provider))

    async def run(self) -> None:
        """Keep the cache of both kinds (part of the consumer role's `run`)."""
        async with asyncio.TaskGroup() as tg:
            for plural in PLURALS:
                tg.create_task(
                    watch(
                        self.api,
                        _path(plural),
                        functools.partial(self._on_event, plural),
                        what=f"credentials {plural}",
                        params={"labelSelector": PROVIDER_LABEL},
                        on_synced=functools.partial(self._synced.add, plural),
                    )
                )

    async def grant(self, fc: Mapping[str, Any], provider: ClusterID) -> None:
        """The Role, then the RoleBinding, of `provider`, owned by its ForeignCluster `fc`; nothing is
        written when the watches show both current."""
        owner = rest.owner_ref(fc)
        for plural in PLURALS:
            want = wanted(plural, provider)
            key = (plural, credentials_reader(provider))
            cached = self._cache.get(key) if plural in self._synced else None
            if cached is not None and _grants(cached, want) and _owned_by(cached, owner["uid"]):
                continue
            want["metadata"]["ownerReferences"] = [owner]
            self._cache[key] = await rest.apply(
                self.api, _path(plural, key[1]), want, what=f"{want['kind']} {SYSTEM_NAMESPACE}/{key[1]}"
            )

    async def revoke(self, provider: str) -> None:
        """Delete the RoleBinding, then the Role, of `provider` (nothing when the watches know them gone)."""
        name = credentials_reader(ClusterID(provider))
        for plural in reversed(PLURALS):
            key = (plural, name)
            if plural in self._synced and key not in self._cache:
                continue
            await rest.delete(self.api, _path(plural, name), what=f"delete {plural} {SYSTEM_NAMESPACE}/{name}")
            self._cache.pop(key, None)
