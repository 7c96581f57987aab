"""`ClaimOffloader`: the ResourceClaims of offloaded pods, at the provider and back.

Owns, for one provider:
- before a twin pod is created: reading each consumer claim the pod uses (the `ClaimCache`, else
  the API) and the published slice of its virtual node, and forging the twin claims
  (`forge.dra_claims.twin_claim`); a claim that cannot be offloaded refuses the pod with
  `ClaimNotOffloadable` and the sentence why (the pod controller shows it as an Event and
  `ProviderFailed`); a template's claim not made yet is retried;
- after the twin pod exists: creating each twin claim owned by the twin pod (adopting a claim of
  the same consumer claim that another twin pod already uses by adding itself as an owner), so the
  provider's garbage collector deletes it with the last twin pod that uses it — deleting the pod
  releases the devices on both sides (the consumer's resource-claim controller frees its own);
- once the provider allocated: the consumer claim gets annotation `gpufed.io/provider-allocation`
  ("<provider>: <driver>/<pool>/<device>, ...") and an Event `ProviderAllocated` (once per twin).

Does not: publish devices (`remote.devices`), or decide anything about the pod itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from gpufed.apis.wire import DRA_API_PATH, PROVIDER_ALLOCATION_ANNOTATION
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from vkprovider.forge import dra_claims
from vkprovider.forge.devices import device_class_of
from vkprovider.forge.meta import Target, owned_by
from vkprovider.node.provider import ProviderError
from vkprovider.remote.devices import ClaimCache
from vkprovider.remote.events_relay import EventRelay

NOT_OFFLOADABLE = "ClaimNotOffloadable"
#: A claim made from the pod's template is not there yet (the resource-claim controller makes it).
CLAIM_PENDING = "ClaimPending"

#: (pod claim entry, twin claim manifest)
Plan = list[tuple[str, dict[str, Any]]]


def _claims_path(namespace: str, name: str = "") -> str:
    return f"{DRA_API_PATH}/namespaces/{rest.segment(namespace)}/resourceclaims" + (
        f"/{rest.segment(name)}" if name else ""
    )


class ClaimOffloader:
    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        claims: ClaimCache | None,
        provider: str,
        consumer: str,
        events: EventRelay,
    ) -> None:
        self.local = local_api
        self.remote = remote_api
        self.claims = claims
        self.provider = provider
        self.consumer = consumer
        self.events = events
        #: twin pod uids whose allocation was reported.
        self._reported: set[str] = set()
        self._log = structlog.get_logger().bind(remote_cluster=provider)

    async def _consumer_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        cached = self.claims.claims.get((namespace, name)) if self.claims is not None else None
        if cached is not None and (cached.get("status") or {}).get("allocation"):
            return cached
        return await rest.get(self.local, _claims_path(namespace, name), what=f"resourceclaim {namespace}/{name}")

    async def plan(self, pod: Mapping[str, Any], target: Target) -> Plan:
        """The twin claims of `pod` (empty without claims); ProviderError when one cannot be offloaded."""
        entries = dra_claims.pod_claims(pod)
        if not entries:
            return []
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        published = await rest.get(self.local, f"{DRA_API_PATH}/resourceslices/{rest.segment(target.node)}")
        plan: Plan = []
        for entry, claim_name in entries:
            if claim_name is None:
                raise ProviderError(
                    f"pod {namespace}/{name}: the claim of resourceClaims entry {entry} is not made yet",
                    reason=CLAIM_PENDING,
                )
            claim = await self._consumer_claim(namespace, claim_name)
            if claim is None:
                raise ProviderError(f"resourceclaim {namespace}/{claim_name} not found", reason=CLAIM_PENDING)
            try:
                twin = dra_claims.twin_claim(claim, target, lambda device: device_class_of(published, device))
            except dra_claims.ClaimRefusedError as e:
                raise ProviderError(
                    f"{e} (pod {namespace}/{name}, provider {self.provider})", reason=NOT_OFFLOADABLE, retry=False
                ) from e
            plan.append((entry, twin))
        return plan

    async def ensure(self, twin_pod: Mapping[str, Any], plan: Plan) -> None:
        """Create (or adopt) each twin claim of `plan`, owned by `twin_pod`."""
        for _entry, twin in plan:
            ns, name = twin["metadata"]["namespace"], twin["metadata"]["name"]
            owners = dra_claims.with_owner(twin, twin_pod)
            body = {**twin, "metadata": {**twin["metadata"], "ownerReferences": owners}}
            try:
                await rest.create(self.remote, _claims_path(ns), body, what=f"create twin claim {ns}/{name}")
                continue
            except KubeError as e:
                if not e.conflict:
                    raise
            existing = await rest.get(self.remote, _claims_path(ns, name), what=f"twin claim {ns}/{name}")
            if existing is None:
                raise ProviderError(f"twin claim {ns}/{name} was being replaced; retrying", reason="TwinConflict")
            uid = twin["metadata"]["labels"].get("gpufed.io/origin-uid")
            if not owned_by(existing, self.consumer, uid):
                raise ProviderError(
                    f"resourceclaim {ns}/{name} on {self.provider} is not the twin of this consumer claim; "
                    "the pod cannot use it",
                    reason="NameCollision",
                    retry=True,
                )
            refs = dra_claims.with_owner(existing, twin_pod)
            if refs is not None:
                await rest.merge_patch(
                    self.remote,
                    _claims_path(ns, name),
                    {"metadata": {"ownerReferences": refs, "resourceVersion": existing["metadata"]["resourceVersion"]}},
                    what=f"own twin claim {ns}/{name}",
                )

    def forget(self, twin_uid: str) -> None:
        """The twin pod is gone: nothing more to report for it."""
        self._reported.discard(twin_uid)

    async def report(self, local_ns: str, twin_pod: Mapping[str, Any]) -> None:
        """Show the provider's allocation on the consumer's claims (of `local_ns`) once the twin is
        scheduled; a twin claim has the name of the consumer claim it stands for."""
        meta = twin_pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid in self._reported or not (twin_pod.get("spec") or {}).get("nodeName"):
            return
        twin_ns = str(meta.get("namespace") or "")
        names = [
            str(e.get("resourceClaimName"))
            for e in (twin_pod.get("spec") or {}).get("resourceClaims") or []
            if e.get("resourceClaimName")
        ]
        for claim_name in names:
            twin = await rest.get(self.remote, _claims_path(twin_ns, claim_name), what="twin claim")
            shown = dra_claims.provider_allocation([twin] if twin is not None else [])
            if shown is None:
                return  # not allocated yet: the next event of the twin pod asks again
            local = await rest.get(self.local, _claims_path(local_ns, claim_name), what="resourceclaim")
            if local is None:
                continue
            line = f"{self.provider}: {shown}"
            if (local["metadata"].get("annotations") or {}).get(PROVIDER_ALLOCATION_ANNOTATION) == line:
                continue
            await rest.merge_patch(
                self.local,
                _claims_path(local_ns, claim_name),
                {"metadata": {"annotations": {PROVIDER_ALLOCATION_ANNOTATION: line}}},
                what=f"annotate resourceclaim {local_ns}/{claim_name}",
            )
            self.events.offer(
                {**local, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"},
                type_="Normal",
                reason="ProviderAllocated",
                message=f"provider {self.provider} allocated {shown}",
            )
        self._reported.add(uid)


__all__ = ["CLAIM_PENDING", "NOT_OFFLOADABLE", "ClaimOffloader"]
