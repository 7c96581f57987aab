"""A tenant's namespaces on the provider: its tenant namespace, its twin namespaces, their RBAC and policy.

Owns, for one Tenant (one consumer), level-triggered and idempotent:
- the cluster's admission policies and their bindings (`gpufed-offload-policy` for pods,
  `gpufed-consumer-objects` for the Services, EndpointSlices and Ingresses a consumer writes,
  `gpufed-consumer-claims` for its PersistentVolumeClaims), applied once per process before any
  consumer namespace is touched;
- the tenant namespace (`gpufed-tenant-<consumer-id>`) with its quota (control objects only) and the
  consumer's control and workload role bindings;
- twin namespaces the consumer asks for with TwinNamespace objects in its tenant namespace: created
  here (the consumer has no namespace rights) under `spec.twinName` or `<namespace>-<consumer-id>`,
  labelled, given a LimitRange (containers without requests get a default so the grant's quota can
  admit them); removed when the request goes. A name that is reserved (`default`, `kube-*`,
  `gpufed`, `gpufed-*`) or that exists and is not this consumer's twin of the same namespace is
  refused (phase Refused + Warning Event): a namespace that does not exist is created, never
  applied over, so two consumers racing for one name cannot both take it;
- opening a namespace to the consumer (`open`): its role bindings are created only once the grant's
  ResourceQuota there is in force (the quota controller has filled its status), and only then is
  its TwinNamespace marked Ready;
- the tenant's policy (`peering.podsecurity.Projection`: the pod policy, the GPU products it may pin,
  the provider's default priority class, the address ranges its EndpointSlices may name — the
  provider's pod range and the consumer's ranges as this provider reaches them, from the fabric's
  NetworkConfig and RemoteNetwork — its Ingress hosts and annotations, and in twin namespaces the
  StorageClasses offered with its storage grant) projected onto the labels and annotations of each
  of its namespaces, where the admission policies read it, and the pod policy
  published in each Ready TwinNamespace's `status.podSecurity` (the consumer's early check).

Never touches namespaces it does not own: one it adopts must carry this consumer's label.

Does not: decide the handshake (`peering.controllers.tenant_handshake`) or the grant and its quotas
(`peering.controllers.tenant_grants`); the policy's rules are `peering.podsecurity`, the admission policies
`peering.admission`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.network import NETWORK_CONFIG
from gpufed.apis.offloading import OffloadPodSecurity, TwinNamespaceSpec, reserved_namespace
from gpufed.apis.peering import StorageClassOffer, TenantSpec
from gpufed.apis.wire import (
    CONSUMER_CONTROL_ROLE,
    CONSUMER_LABEL,
    CONSUMER_WORKLOADS_ROLE,
    GRANT_QUOTA,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ORIGIN_CLUSTER_ANNOTATION,
    SYSTEM_NAMESPACE,
    TENANT_LABEL,
    TWIN_OF_LABEL,
    ClusterID,
    tenant_namespace,
    twin_namespace,
)
from gpufed.kube import conditions as cond
from gpufed.kube import events, meta, rest
from gpufed.kube.client import KubeError
from peering import grants, handshake, podsecurity
from peering.admission.claims import claims_binding, claims_policy
from peering.admission.devices import device_claims_binding, device_claims_policy
from peering.admission.objects import objects_binding, objects_policy
from peering.admission.pods import admission_binding, admission_policy
from peering.controllers import status as st_
from peering.controllers.tenant_grants import apply_quota

#: Requests given to containers that set none, so the grant's quota can admit them.
DEFAULT_CONTAINER_REQUESTS = {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "512Mi"}
#: Limits given to containers that set none: the grant's quota limits ephemeral storage.
DEFAULT_CONTAINER_LIMITS = {"ephemeral-storage": "8Gi"}
#: Seconds until a namespace whose quota is not in force yet is looked at again.
QUOTA_WAIT_S = 1.0
_ADMISSION_GROUP = "admissionregistration.k8s.io/v1"
_RBAC_GROUP = "rbac.authorization.k8s.io"


def pod_security(tenant: Mapping[str, Any]) -> OffloadPodSecurity:
    """The tenant's offload policy; the strictest one when its spec cannot be read (reconcile refuses
    such a tenant anyway)."""
    try:
        return TenantSpec.model_validate(tenant.get("spec") or {}).policy.pod_security
    except ValidationError:
        return OffloadPodSecurity()


def ingress_annotations(tenant: Mapping[str, Any]) -> list[str]:
    """The Ingress annotations the tenant's policy admits (none when its spec cannot be read)."""
    spec = tenant_spec(tenant)
    return list(spec.policy.ingress_annotations) if spec is not None else []


def tenant_spec(tenant: Mapping[str, Any]) -> TenantSpec | None:
    try:
        return TenantSpec.model_validate(tenant.get("spec") or {})
    except ValidationError:
        return None


def published(policy: OffloadPodSecurity) -> dict[str, Any]:
    """The policy as TwinNamespace status carries it (an empty list is left out: applied status
    fields must not be empty, see `rest.apply`)."""
    return {k: v for k, v in policy.model_dump(by_alias=True, mode="json").items() if v != []}


@dataclass
class TwinPlan:
    """What `twins` prepared: the twin namespaces to open, and the Ready statuses written once they are."""

    #: Twin namespaces that exist (or were just created) for a valid request, in request order.
    ready: list[str] = field(default_factory=list)
    #: (request, its status as read, its Ready status) per twin in `ready`.
    pending: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = field(default_factory=list)


class TenantNamespaces:
    """Applies the namespaces, role bindings and admission policies of the provider's tenants."""

    def __init__(self, api: Any, log: Any | None = None) -> None:
        self.api = api
        #: Whether this process has applied the admission policies and their bindings.
        self._admission_applied = False
        #: Namespaces whose quota was seen in force (their role bindings may exist) -> their consumer.
        self._opened: dict[str, str] = {}
        #: The provider's global default PriorityClass (kept by the provider role's watch).
        self.default_priority_class: str | None = None
        self._log = log if log is not None else structlog.get_logger()

    async def ensure_admission_policy(self) -> None:
        """The admission policies and their bindings (cluster-wide, the same for every tenant)."""
        if self._admission_applied:
            return
        for name, policy, binding in (
            (podsecurity.POLICY_NAME, admission_policy(), admission_binding()),
            (podsecurity.OBJECTS_POLICY_NAME, objects_policy(handshake.CONSUMER_GROUP), objects_binding()),
            (podsecurity.CLAIMS_POLICY_NAME, claims_policy(handshake.CONSUMER_GROUP), claims_binding()),
            (
                podsecurity.DEVICE_CLAIMS_POLICY_NAME,
                device_claims_policy(handshake.CONSUMER_GROUP),
                device_claims_binding(),
            ),
        ):
            await rest.apply(self.api, rest.path(_ADMISSION_GROUP, "validatingadmissionpolicies", name), policy)
            await rest.apply(self.api, rest.path(_ADMISSION_GROUP, "validatingadmissionpolicybindings", name), binding)
            self._log.info("admission policy applied", policy=name)
        self._admission_applied = True

    async def projection(
        self, tenant: Mapping[str, Any], consumer: ClusterID, storage_classes: Sequence[StorageClassOffer] = ()
    ) -> podsecurity.Projection:
        """What the admission policies read from the consumer's twin namespaces, `storage_classes` the
        classes offered to its claims (the strictest policy when the tenant's spec cannot be read)."""
        spec = tenant_spec(tenant)
        policy = spec.policy if spec is not None else None
        return podsecurity.Projection(
            pod_security=policy.pod_security if policy is not None else OffloadPodSecurity(),
            gpu_products=(policy.allowed_gpu_products if policy is not None else []),
            default_priority_class=self.default_priority_class,
            endpoint_cidrs=await self._endpoint_cidrs(consumer),
            ingress_hosts=policy.ingress_hosts if policy is not None else (),
            ingress_annotations=policy.ingress_annotations if policy is not None else (),
            storage_classes=tuple(storage_classes) if policy is not None else (),
        )

    async def _endpoint_cidrs(self, consumer: ClusterID) -> tuple[str, ...]:
        """The ranges a consumer's EndpointSlice addresses may be in: this provider's pod range (its
        offloaded pods live there) and the consumer's pod and external ranges as this provider reaches
        them. Without the fabric's NetworkConfig the provider does not know its own ranges: private
        (pod-like) ranges then."""
        try:
            config = await rest.get(
                self.api, rest.path(API_VERSION, "networkconfigs", NETWORK_CONFIG, namespace=SYSTEM_NAMESPACE)
            )
            remote = await rest.get(
                self.api, rest.path(API_VERSION, "remotenetworks", consumer, namespace=SYSTEM_NAMESPACE)
            )
        except KubeError as e:
            if not e.forbidden:
                raise
            config = remote = None
        pod_cidr = ((config or {}).get("spec") or {}).get("podCidr")
        if not pod_cidr:
            return podsecurity.PRIVATE_CIDRS
        cidrs = [str(pod_cidr)]
        mapped = ((remote or {}).get("spec") or {}).get("mapped") or {}
        cidrs += [str(mapped[k]) for k in ("podCidr", "externalCidr") if mapped.get(k)]
        return tuple(dict.fromkeys(cidrs))

    async def ensure_tenant_namespace(
        self, tenant: dict[str, Any], consumer: ClusterID, projection: podsecurity.Projection | None = None
    ) -> bool:
        """The tenant namespace with its quota (control objects only: no pods, no compute) and, once that
        quota is in force, the consumer's control and workload roles; False when the name is taken by
        a namespace that is not this consumer's."""
        ns = tenant_namespace(consumer)
        existing = await rest.get(self.api, rest.path("v1", "namespaces", ns))
        if existing is not None and meta.labels(existing).get(CONSUMER_LABEL) != consumer:
            self._log.error("tenant namespace exists and is not this consumer's; left alone", namespace=ns)
            return False
        labels = {CONSUMER_LABEL: consumer, TENANT_LABEL: "true"}
        # Control objects only: no claims either, whatever the twins are offered.
        projection = replace(projection, storage_classes=()) if projection is not None else None
        if not await self._apply_namespace(tenant, ns, labels, projection, create=existing is None):
            return False
        zero = {r: Decimal(0) for r in grants.QUOTA_RESOURCES}
        await apply_quota(self.api, ns, consumer, grants.quota_hard(zero, (), tenant=True))
        if await self._quota_in_force(ns, consumer):
            await self._bind(ns, CONSUMER_CONTROL_ROLE, consumer)
            await self._bind(ns, CONSUMER_WORKLOADS_ROLE, consumer)
        return True

    async def twins(
        self,
        tenant: dict[str, Any],
        consumer: ClusterID,
        log: Any,
        projection: podsecurity.Projection | None = None,
    ) -> TwinPlan:
        """Create the twin namespaces asked for, remove those no longer asked for; those to open."""
        tns = tenant_namespace(consumer)
        requests = await rest.list_items(self.api, rest.path(API_VERSION, "twinnamespaces", namespace=tns))
        wanted: dict[str, dict[str, Any]] = {}
        plan = TwinPlan()
        for req in requests:
            old = dict(req.get("status") or {})
            st: dict[str, Any] = dict(old)
            conds = list(st.get("conditions") or [])
            try:
                spec = TwinNamespaceSpec.model_validate(req.get("spec") or {})
                twin = spec.twin_name or twin_namespace(spec.namespace, consumer)
            except (ValidationError, ValueError) as e:
                # A twinName that is reserved is refused here too (TwinNamespaceSpec says why).
                await self._refuse(req, old, st, conds, str(old.get("twin") or ""), "InvalidRequest", str(e)[:500])
                continue
            if reserved_namespace(twin):
                msg = f"twin namespace name {twin} is reserved (default, kube-*, gpufed, gpufed-*); it is refused"
                await self._refuse(req, old, st, conds, twin, "NamespaceReserved", msg)
                continue
            existing = await rest.get(self.api, rest.path("v1", "namespaces", twin))
            labels = meta.labels(existing)
            # Adopt only this consumer's twin of this same namespace: a chosen name (twinName) may
            # collide with anything, including the tenant namespace or another namespace's twin, and
            # two consumers' default names may collide (`a` of `b-c` and `a-b` of `c`).
            if existing is not None and (
                labels.get(CONSUMER_LABEL) != consumer or labels.get(TWIN_OF_LABEL) != spec.namespace
            ):
                msg = (
                    f"namespace {twin} already exists and is not consumer {consumer}'s twin of "
                    f"{spec.namespace}; it is left alone"
                )
                await self._refuse(req, old, st, conds, twin, "NamespaceTaken", msg)
                continue
            if meta.is_deleting(existing):
                st.update(phase="Pending", twin=twin)
                await self._twin_status(req, old, st)
                continue
            labels_ = {CONSUMER_LABEL: consumer, TWIN_OF_LABEL: spec.namespace}
            if not await self._apply_namespace(tenant, twin, labels_, projection, create=existing is None):
                msg = f"namespace {twin} was created by someone else meanwhile; it is left alone"
                await self._refuse(req, old, st, conds, twin, "NamespaceTaken", msg)
                continue
            wanted[twin] = req
            await self._limit_range(twin, consumer)
            st.update(
                phase="Ready",
                twin=twin,
                conditions=cond.mark(conds, "Ready", True, "Created", f"twin namespace {twin} is ready"),
                podSecurity=published(pod_security(tenant)),
            )
            st.pop("ingressAnnotations", None)
            if allowed := ingress_annotations(tenant):  # applied status fields must not be empty
                st["ingressAnnotations"] = allowed
            plan.ready.append(twin)
            plan.pending.append((req, old, st))
        # Twins nobody asks for any more (the request was deleted) go away.
        owned = await rest.list_items(
            self.api, "/api/v1/namespaces", params={"labelSelector": f"{CONSUMER_LABEL}={consumer},{TWIN_OF_LABEL}"}
        )
        for ns in owned:
            n = meta.name(ns)
            if n not in wanted and not meta.is_deleting(ns):
                log.info("removing twin namespace", namespace=n)
                self._opened.pop(n, None)
                await rest.delete(self.api, rest.path("v1", "namespaces", n), uid=meta.uid(ns))
        return plan

    async def open(self, consumer: ClusterID, plan: TwinPlan) -> float | None:
        """Bind the consumer's workload role in each twin of `plan` whose quota (applied by the grants) is
        in force, and mark those twins Ready; the seconds until the others are looked at again (None: none)."""
        wait: float | None = None
        if tenant_namespace(consumer) not in self._opened:
            wait = QUOTA_WAIT_S  # its roles are bound by ensure_tenant_namespace once its quota holds
        for twin, (req, old, st) in zip(plan.ready, plan.pending, strict=True):
            if not await self._quota_in_force(twin, consumer):
                wait = QUOTA_WAIT_S
                pending = {**st, "phase": "Pending"}
                pending.pop("podSecurity", None)
                pending.pop("ingressAnnotations", None)
                pending["conditions"] = cond.mark(
                    list(old.get("conditions") or []),
                    "Ready",
                    False,
                    "QuotaPending",
                    f"waiting for the quota of {twin}",
                )
                await self._twin_status(req, old, pending)
                continue
            await self._bind(twin, CONSUMER_WORKLOADS_ROLE, consumer)
            await self._twin_status(req, old, st)
        return wait

    def forget(self, consumer: str) -> None:
        """Drop what this process knows of a consumer that is gone (its namespaces go with it)."""
        self._opened = {ns: c for ns, c in self._opened.items() if c != consumer}

    async def _quota_in_force(self, namespace: str, consumer: str) -> bool:
        """Whether the grant's quota in `namespace` is enforced: the quota controller has computed its
        status for every limit (before that, quota admission lets everything through)."""
        if namespace in self._opened:
            return True
        quota = await rest.get(self.api, rest.path("v1", "resourcequotas", GRANT_QUOTA, namespace=namespace))
        hard = ((quota or {}).get("spec") or {}).get("hard") or {}
        status = ((quota or {}).get("status") or {}).get("hard") or {}
        if quota is None or not hard or not set(hard) <= set(status):
            return False
        self._opened[namespace] = consumer
        return True

    async def _refuse(
        self,
        req: dict[str, Any],
        old: dict[str, Any],
        st: dict[str, Any],
        conds: list[dict[str, Any]],
        twin: str,
        reason: str,
        msg: str,
    ) -> None:
        st.update(phase="Refused", conditions=cond.mark(conds, "Ready", False, reason, msg))
        if twin:
            st["twin"] = twin
        st.pop("podSecurity", None)
        st.pop("ingressAnnotations", None)
        if old.get("phase") != "Refused" or cond.reason_of(old.get("conditions"), "Ready") != reason:
            await events.emit(self.api, req, type_="Warning", reason=reason, message=msg)
        await self._twin_status(req, old, st)

    async def _twin_status(self, req: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
        new = {**new, "conditions": cond.observed(new.get("conditions") or [], meta.generation(req))}
        if old == new:
            return
        await st_.write(self.api, "TwinNamespace", "twinnamespaces", meta.name(req), new, meta.namespace(req))

    async def _apply_namespace(
        self,
        tenant: dict[str, Any],
        name: str,
        labels: dict[str, str],
        projection: podsecurity.Projection | None,
        *,
        create: bool,
    ) -> bool:
        """Apply the namespace, or create it when `create` (False: someone else created it meanwhile)."""
        # The tenant's policy, as the admission policies read it from the namespace.
        projected = projection or podsecurity.Projection(pod_security=pod_security(tenant))
        policy_labels, policy_annotations = podsecurity.namespace_metadata(projected)
        body = {
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
        }
        url = rest.path("v1", "namespaces", name)
        if create:
            # Never server-side apply over a namespace that appeared since we looked: creating fails
            # with a conflict instead, and the next reconcile sees whose it is.
            try:
                await rest.create(self.api, rest.path("v1", "namespaces"), body)
            except KubeError as e:
                if e.conflict:
                    return False
                raise
        await rest.apply(self.api, url, body)
        return True

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
                "spec": {
                    "limits": [
                        {
                            "type": "Container",
                            "defaultRequest": dict(DEFAULT_CONTAINER_REQUESTS),
                            "default": dict(DEFAULT_CONTAINER_LIMITS),
                        }
                    ]
                },
            },
        )
