"""Ties the cluster-wide objects the controller creates at run time to the installation, so that
removing the installation removes them too.

Owns: `ReleaseOwner`, which gives each of `OWNED` — the MutatingWebhookConfiguration
`gpufed-offloading` and the ValidatingAdmissionPolicies `gpufed-offload-policy`,
`gpufed-consumer-objects`, `gpufed-consumer-claims`, `gpufed-consumer-device-claims` with their
bindings — an ownerReference to the ClusterRole `gpufed-controller` (`ANCHOR`: the controller's own
permissions, installed with it by the Helm chart or `gpufed local up`). When that ClusterRole is
deleted (`helm uninstall`), the API server's garbage collector deletes them, whether or not the
controller still runs. Only objects labelled `app.kubernetes.io/managed-by=gpufed` are changed, and
only their ownerReferences (a merge patch as field manager `gpufed`, guarded by the resourceVersion
read); a missing object or ClusterRole is looked at again on the next pass.

Invariants: the reference carries no `blockOwnerDeletion`, so setting it needs nothing on the
ClusterRole beyond `get`; the objects' owners re-apply them with server-side apply, which keeps a
reference it never set (the patch is recorded as an Update, apart from their Apply).

Does not: create, update or delete any of these objects (`vkprovider.webhook.server` and
`peering.controllers.tenant_namespaces` do), nor hold a delete right: the garbage collector deletes
them with its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from peering.podsecurity import CLAIMS_POLICY_NAME, DEVICE_CLAIMS_POLICY_NAME, OBJECTS_POLICY_NAME, POLICY_NAME
from vkprovider.webhook.server import WEBHOOK_CONFIGURATION

_ADMISSION = "admissionregistration.k8s.io/v1"

#: The owner: (apiVersion, plural, name) of the ClusterRole the controller is installed with.
ANCHOR = ("rbac.authorization.k8s.io/v1", "clusterroles", "gpufed-controller")

#: What the controller creates cluster-wide: (apiVersion, plural, name).
OWNED: tuple[tuple[str, str, str], ...] = (
    (_ADMISSION, "mutatingwebhookconfigurations", WEBHOOK_CONFIGURATION),
    *(
        (_ADMISSION, plural, name)
        for name in (POLICY_NAME, OBJECTS_POLICY_NAME, CLAIMS_POLICY_NAME, DEVICE_CLAIMS_POLICY_NAME)
        for plural in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
    ),
)

#: Seconds between passes: short after the start (the webhook registers then), at most the last.
PASS_DELAYS_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


def owned_refs(obj: Mapping[str, Any], anchor: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The ownerReferences `obj` should have to be owned by `anchor`, or None when it has them
    already. A reference to an earlier object of the anchor's kind and name (another UID) is
    replaced; other owners are kept."""
    want = rest.owner_ref(anchor)
    refs = [dict(r) for r in (obj.get("metadata") or {}).get("ownerReferences") or []]
    if any(r.get("uid") == want["uid"] for r in refs):
        return None
    kept = [r for r in refs if not (r.get("kind") == want["kind"] and r.get("name") == want["name"])]
    return [*kept, want]


class ReleaseOwner:
    """Keeps `owned` owned by `anchor` (see the module docstring); `run()` until cancelled."""

    def __init__(
        self,
        api: Any,
        log: Any | None = None,
        *,
        anchor: tuple[str, str, str] = ANCHOR,
        owned: tuple[tuple[str, str, str], ...] = OWNED,
    ) -> None:
        self.api = api
        self.anchor = anchor
        self.owned = owned
        self._log = log if log is not None else structlog.get_logger()
        #: Objects whose patch was refused, so the refusal is logged once.
        self._refused: set[str] = set()

    async def sync(self) -> int:
        """One pass; the number of objects given the reference."""
        anchor = await rest.get(self.api, rest.path(*self.anchor))
        if anchor is None:
            return 0
        changed = 0
        for api_version, plural, name in self.owned:
            url = rest.path(api_version, plural, name)
            obj = await rest.get(self.api, url)
            if obj is None or (obj["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
                continue
            refs = owned_refs(obj, anchor)
            if refs is None:
                continue
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"], "ownerReferences": refs}}
            try:
                await rest.request(
                    self.api,
                    "PATCH",
                    url,
                    body=patch,
                    params={"fieldManager": rest.FIELD_MANAGER},
                    content_type="application/merge-patch+json",
                    what=f"own {plural}/{name}",
                )
            except KubeError as e:
                if e.status == 409:
                    continue  # changed since it was read: the next pass reads it again
                if e.status in (403, 422) and url not in self._refused:
                    self._refused.add(url)
                    self._log.warning(
                        "cannot tie object to the installation; delete it after uninstalling",
                        kind=plural,
                        name=name,
                        error=str(e),
                    )
                    continue
                if e.status in (403, 422):
                    continue
                raise
            changed += 1
            self._log.info("object tied to the installation", kind=plural, name=name, owner=self.anchor[2])
        return changed

    async def run(self) -> None:
        passes = 0
        while True:
            try:
                await self.sync()
            except KubeError as e:
                self._log.warning("cannot tie objects to the installation; retrying", error=str(e))
            await asyncio.sleep(PASS_DELAYS_S[min(passes, len(PASS_DELAYS_S) - 1)])
            passes += 1
