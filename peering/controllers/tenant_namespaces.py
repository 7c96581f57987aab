"""A tenant's namespaces on the provider: its tenant namespace, its twin namespaces, their RBAC and policy.

Owns, for one Tenant (one consumer), level-triggered and idempotent:
- the cluster's one offload pod-security ValidatingAdmissionPolicy and its binding
  (`gpufed-offload-policy`), applied once per process before any consumer namespace is touched;
- the tenant namespace (`gpufed-tenant-<consumer-id>`) with the consumer's control and workload
  role bindings;
- twin namespaces the consumer asks for with TwinNamespace objects in its tenant namespace: created
  here (the consumer has no namespace rights) under `spec.twinName` or `<namespace>-<consumer-id>`,
  labelled, bound, given a LimitRange (containers without requests get a default so the grant's
  quota can admit them); removed when the request goes; a name that exists and is not this
  consumer's twin of the same namespace is refused (phase Refused + Warning Event);
- the tenant's offload pod-security policy projected onto the labels and annotation of each of its
  namespaces (its own API server then refuses the pods the policy does not allow, whoever creates
  them), and published in each Ready TwinNamespace's `status.podSecurity` (the consumer's early check).

Never touches namespaces it does not own: one it adopts must carry this consumer's label.

Does not: decide the handshake (`peering.controllers.tenant_handshake`) or the grant and its quotas
(`peering.controllers.tenant_grants`); the policy's rules are `peering.podsecurity`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.offloading import OffloadPodSecurity, TwinNamespaceSpec
from gpufed.apis.peering import TenantSpec
from gpufed.apis.wire import (
    CONSUMER_CONTROL_ROLE,
    CONSUMER_LABEL,
    CONSUMER_WORKLOADS_ROLE,
    GRANT_QUOTA,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ORIGIN_CLUSTER_ANNOTATION,
    TENANT_LABEL,
    TWIN_OF_LABEL,
    ClusterID,
    tenant_namespace,
    twin_namespace,
)
from gpufed.kube import conditions as cond
from gpufed.kube import events, meta, rest
from peering import handshake, podsecurity
from peering.controllers import status as st_

#: Requests given to containers that set none, so the grant's quota can admit them.
DEFAULT_CONTAINER_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
_ADMISSION_GROUP = "admissionregistration.k8s.io/v1"
_RBAC_GROUP = "rbac.authorization.k8s.io"


def pod_security(tenant: Mapping[str, Any]) -> OffloadPodSecurity:
    """The tenant's offload policy; the strictest one when its spec cannot be read (reconcile refuses
    such a tenant anyway)."""
    try:
        return TenantSpec.model_validate(tenant.get("spec") or {}).policy.pod_security
    except ValidationError:
        return OffloadPodSecurity()


def published(policy: OffloadPodSecurity) -> dict[str, Any]:
    """The policy as TwinNamespace status carries it (an empty list is left out: applied status
    fields must not be empty, see `rest.apply`)."""
    return {k: v for k, v in policy.model_dump(by_alias=True, mode="json").items() if v != []}


class TenantNamespaces:
    """Applies the namespaces, role bindings and admission policy of the provider's tenants."""

    def __init__(self, api: Any, log: Any | None = None) -> None:
        self.api = api
        #: Whether this process has applied the offload admission policy and its binding.
        self._admission_applied = False
        self._log = log if log is not None else structlog.get_logger()

    async def ensure_admission_policy(self) -> None:
        """The offload pod-security policy and its binding (cluster-wide, the same for every tenant)."""
        if self._admission_applied:
            return
        name = podsecurity.POLICY_NAME
        await rest.apply(
            self.api, rest.path(_ADMISSION_GROUP, "validatingadmissionpolicies", name), podsecurity.admission_policy()
        )
        await rest.apply(
            self.api,
            rest.path(_ADMISSION_GROUP, "validatingadmissionpolicybindings", name),
            podsecurity.admission_binding(),
        )
        self._admission_applied = True
        self._log.info("offload pod-security policy applied", policy=name)

    async def ensure_tenant_namespace(self, tenant: dict[str, Any], consumer: ClusterID) -> None:
        """The tenant namespace, with the consumer's control and workload roles bound there."""
        ns = tenant_namespace(consumer)
        await self._apply_namespace(tenant, ns, {CONSUMER_LABEL: consumer, TENANT_LABEL: "true"})
        await self._bind(ns, CONSUMER_CONTROL_ROLE, consumer)
        await self._bind(ns, CONSUMER_WORKLOADS_ROLE, consumer)

    async def twins(self, tenant: dict[str, Any], consumer: ClusterID, log: Any) -> list[str]:
        """Create the twin namespaces asked for, remove those no longer asked for; the ready ones."""
        tns = tenant_namespace(consumer)
        requests = await rest.list_items(self.api, rest.path(API_VERSION, "twinnamespaces", namespace=tns))
        wanted: dict[str, dict[str, Any]] = {}
        ready: list[str] = []
        for req in requests:
            old = dict(req.get("status") or {})
            st: dict[str, Any] = dict(old)
            conds = list(st.get("conditions") or [])
            try:
                spec = TwinNamespaceSpec.model_validate(req.get("spec") or {})
                twin = spec.twin_name or twin_namespace(spec.namespace, consumer)
            except (ValidationError, ValueError) as e:
                st.update(
                    phase="Refused",
                    conditions=cond.mark(conds, "Ready", False, "InvalidRequest", str(e)[:500]),
                )
                await self._twin_status(req, old, st)
                continue
            existing = await rest.get(self.api, rest.path("v1", "namespaces", twin))
            labels = meta.labels(existing)
            # Adopt only this consumer's twin of this same namespace: a chosen name (twinName) may
            # collide with anything, including the tenant namespace or another namespace's twin.
            if existing is not None and (
                labels.get(CONSUMER_LABEL) != consumer or labels.get(TWIN_OF_LABEL) != spec.namespace
            ):
                msg = (
                    f"namespace {twin} already exists and is not consumer {consumer}'s twin of "
                    f"{spec.namespace}; it is left alone"
                )
                st.update(
                    phase="Refused",
                    twin=twin,
                    conditions=cond.mark(conds, "Ready", False, "NamespaceTaken", msg),
                )
                if old.get("phase") != "Refused":
                    await events.emit(self.api, req, type_="Warning", reason="NamespaceTaken", message=msg)
                await self._twin_status(req, old, st)
                continue
            if meta.is_deleting(existing):
                st.update(phase="Pending", twin=twin)
                await self._twin_status(req, old, st)
                continue
            wanted[twin] = req
            await self._apply_namespace(tenant, twin, {CONSUMER_LABEL: consumer, TWIN_OF_LABEL: spec.namespace})
            await self._bind(twin, CONSUMER_WORKLOADS_ROLE, consumer)
            await self._limit_range(twin, consumer)
            st.update(
                phase="Ready",
                twin=twin,
                conditions=cond.mark(conds, "Ready", True, "Created", f"twin namespace {twin} is ready"),
                podSecurity=published(pod_security(tenant)),
            )
            await self._twin_status(req, old, st)
            ready.append(twin)
        # Twins nobody asks for any more (the request was deleted) go away.
        owned = await rest.list_items(
            self.api, "/api/v1/namespaces", params={"labelSelector": f"{CONSUMER_LABEL}={consumer},{TWIN_OF_LABEL}"}
        )
        for ns in owned:
            n = meta.name(ns)
            if n not in wanted and not meta.is_deleting(ns):
                log.info("removing twin namespace", namespace=n)
                await rest.delete(self.api, rest.path("v1", "namespaces", n), uid=meta.uid(ns))
        return sorted(ready)

    async def _twin_status(self, req: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
        if old == new:
            return
        await st_.write(self.api, "TwinNamespace", "twinnamespaces", meta.name(req), new, meta.namespace(req))

    async def _apply_namespace(self, tenant: dict[str, Any], name: str, labels: dict[str, str]) -> None:
        # The tenant's offload policy, as the admission policy reads it from the namespace.
        policy_labels, policy_annotations = podsecurity.namespace_metadata(pod_security(tenant))
        await rest.apply(
            self.api,
            rest.path("v1", "namespaces", name),
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, **policy_labels, **labels},
                    "annotations": {
                        ORIGIN_CLUSTER_ANNOTATION: tenant["spec"]["consumerClusterId"],
                        **policy_annotations,
                    },
                    "ownerReferences": [rest.owner_ref(tenant)],
                },
            },
        )

    async def _bind(self, namespace: str, role: str, consumer: ClusterID) -> None:
        await rest.apply(
            self.api,
            rest.path(f"{_RBAC_GROUP}/v1", "rolebindings", role, namespace=namespace),
            {
                "apiVersion": f"{_RBAC_GROUP}/v1",
                "kind": "RoleBinding",
                "metadata": {
                    "name": role,
                    "namespace": namespace,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                },
                "roleRef": {"apiGroup": _RBAC_GROUP, "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": _RBAC_GROUP, "kind": "User", "name": handshake.consumer_user(consumer)}],
            },
        )

    async def _limit_range(self, namespace: str, consumer: ClusterID) -> None:
        await rest.apply(
            self.api,
            rest.path("v1", "limitranges", GRANT_QUOTA, namespace=namespace),
            {
                "apiVersion": "v1",
                "kind": "LimitRange",
                "metadata": {
                    "name": GRANT_QUOTA,
                    "namespace": namespace,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                },
                "spec": {"limits": [{"type": "Container", "defaultRequest": dict(DEFAULT_CONTAINER_REQUESTS)}]},
            },
        )
