"""The provider role: tenants, the handshake's provider half, credentials, twin namespaces, grants, quotas.

Owns, per Tenant (one per consumer, key = consumer ClusterID), level-triggered and idempotent:
- the handshake: issue a challenge; judge the consumer's answer once (`peering.handshake.verify`,
  replays of an answered nonce refused); on success create the tenant namespace, bind the consumer
  roles there, submit the consumer's CSR to this cluster's CSR API (signer
  kubernetes.io/kube-apiserver-client), approve it and publish the certificate and CA;
- twin namespaces the consumer asks for with TwinNamespace objects in its tenant namespace: created
  here (the consumer has no namespace rights) under `spec.twinName` or `<namespace>-<consumer-id>`,
  labelled, bound, quota'd; removed when the request goes; a name that exists and is not this
  consumer's twin of the same namespace is refused (phase Refused + Warning Event);
- grants: every ResourceSlice in the tenant namespace is decided against LIVE capacity
  (`peering.grants.decide` over the node and pod caches this role keeps from watches) and the policy
  in the Tenant; re-decided when slices, nodes, pods or other tenants change;
- enforcement: a ResourceQuota in each of the consumer's namespaces whose limits sum to the grant
  (`peering.grants.partition`), and a LimitRange giving containers without requests a default so
  the quota can admit them;
- the offload pod-security policy (`spec.policy.podSecurity`, `peering.podsecurity`): the
  cluster's one ValidatingAdmissionPolicy and binding `gpufed-offload-policy` (applied once per
  process, before any consumer namespace is touched), the tenant's policy projected onto the labels
  and annotation of each of its namespaces (so its own API server refuses privileged, host-namespace,
  hostPath and capability-adding pods the policy does not allow, whoever creates them), the policy
  published in each Ready TwinNamespace's `status.podSecurity` (the consumer's early check) and a
  `PodSecurity` condition on the Tenant saying what is refused.

Every outcome a human must see is a condition on the Tenant / ResourceSlice / TwinNamespace and,
for refusals, a Warning Event. Never touches objects it does not own: namespaces it adopts must
carry this consumer's label.

Metrics (defined with the consumer role's, here with role="provider" and the consumer as
remote_cluster): `gpufed_peering_phase` (1 for the Tenant's phase) and `gpufed_resource_granted` /
`gpufed_resource_used` (the tenant's total grant and what its pods request), dropped with the Tenant.

Does not: delete tenants (that is `gpufed unpeer`), or know the consumer's cluster beyond its id and key.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.apis.models import (
    API_VERSION,
    GPU_RESOURCE,
    OffloadPodSecurity,
    ResourceSliceSpec,
    TenantSpec,
    TwinNamespaceSpec,
)
from gpufed.apis.quantity import format_quantity, parse
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
    TENANT_PREFIX,
    TWIN_OF_LABEL,
    ClusterID,
    parse_cluster_id,
    tenant_namespace,
    twin_namespace,
)
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from gpufed.kube.metrics import StateGauge
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from peering import grants, handshake, podsecurity
from peering.controllers import status as st_
from peering.controllers.consumer import PEERING_PHASE, RESOURCE_GRANTED, RESOURCE_USED
from peering.controllers.identity import Identity
from peering.grants import NodeInfo, PodLoad

#: Seconds between full re-evaluations of a tenant even when nothing was seen to change.
DEFAULT_RESYNC_S = 30.0
#: Lifetime requested for a consumer's client certificate.
DEFAULT_CERT_SECONDS = 90 * 24 * 3600
#: Answered nonces remembered per tenant (replays of older ones fail anyway: their challenge expired).
NONCES_KEPT = 32
#: Coalescing window for capacity changes (node and pod churn) before tenants are re-decided.
CAPACITY_DEBOUNCE_S = 1.0
#: Requests given to containers that set none, so the grant's quota can admit them.
DEFAULT_CONTAINER_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
QUOTA_NAMES = {
    "cpu": "requests.cpu",
    "memory": "requests.memory",
    GPU_RESOURCE: f"requests.{GPU_RESOURCE}",
    "pods": "pods",
}
CSR_SIGNER = "kubernetes.io/kube-apiserver-client"
#: Phases of a Tenant, as this role sets them.
PHASES = ("Pending", "Challenged", "Authenticated", "Refused")
ROLE = "provider"
_PHASE = StateGauge(PEERING_PHASE, PHASES)


@dataclass(frozen=True)
class ProviderSettings:
    #: Seconds between periodic re-evaluations of every tenant.
    resync_s: float = DEFAULT_RESYNC_S
    #: How long a challenge may be answered.
    challenge_ttl: dt.timedelta = handshake.DEFAULT_CHALLENGE_TTL
    #: Requested lifetime of consumer client certificates, in seconds.
    cert_seconds: int = DEFAULT_CERT_SECONDS
    #: Concurrent tenant reconciles.
    workers: int = 4


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _sha(nonce_b64: str) -> str:
    return hashlib.sha256(nonce_b64.encode()).hexdigest()


def _fmt(resources: Mapping[str, Decimal]) -> dict[str, str]:
    return {r: format_quantity(v, binary=r == "memory") for r, v in sorted(resources.items())}


class ProviderRole:
    """Runs the provider reconcilers of one cluster."""

    def __init__(self, api: Any, identity: Identity, settings: ProviderSettings | None = None) -> None:
        self.api = api
        self.identity = identity
        self.settings = settings or ProviderSettings()
        self.queue: WorkQueue[str] = WorkQueue("tenants")
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[tuple[str, str], tuple[str, PodLoad]] = {}
        self.slices: dict[tuple[str, str], dict[str, Any]] = {}
        self.tenants: set[str] = set()
        #: namespace -> consumer, for the tenant and twin namespaces (from their labels).
        self.ns_owner: dict[str, str] = {}
        self.ready = asyncio.Event()
        self._synced: set[str] = set()
        #: Whether this process has applied the offload admission policy and its binding.
        self._admission_applied = False
        self._log = structlog.get_logger().bind(cluster=identity.cluster_id, role="provider")

    # ---- informers

    def _synced_cb(self, what: str) -> Any:
        def done() -> None:
            self._synced.add(what)
            if self._synced >= {"nodes", "pods", "slices", "tenants", "namespaces"} and not self.ready.is_set():
                self.ready.set()
                self._log.info("provider caches synced", tenants=len(self.tenants), nodes=len(self.nodes))
            for t in self.tenants:
                self.queue.add(t)

        return done

    def _all_tenants(self) -> None:
        for t in self.tenants:
            self.queue.add(t, CAPACITY_DEBOUNCE_S)

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        before = self.nodes.get(name)
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = grants.node_info(obj)
        if self.nodes.get(name) != before:  # heartbeats change nothing a grant depends on
            self._all_tenants()

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        phase = (obj.get("status") or {}).get("phase")
        node = (obj.get("spec") or {}).get("nodeName")
        before = self.pods.get(key)
        if kind == "DELETED" or phase in ("Succeeded", "Failed") or not node:
            self.pods.pop(key, None)
        else:
            try:
                self.pods[key] = (meta["namespace"], PodLoad(node, grants.pod_requests(obj)))
            except ValueError:
                return  # a request the apiserver accepted but we cannot parse is ignored, not fatal
        if self.pods.get(key) != before:  # status updates of a bound pod change nothing a grant depends on
            self._all_tenants()

    def _tenant_of_namespace(self, namespace: str) -> str | None:
        if namespace.startswith(TENANT_PREFIX):
            return namespace[len(TENANT_PREFIX) :]
        return None

    def _on_slice(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        tenant = self._tenant_of_namespace(meta.get("namespace", ""))
        if tenant is None:
            return
        key = (meta["namespace"], meta["name"])
        before = self.slices.get(key)
        if kind == "DELETED":
            self.slices.pop(key, None)
        else:
            self.slices[key] = obj
        self.queue.add(tenant)
        # Other tenants see this slice only through its grant (it reserves capacity).
        if _grant_of(before) != _grant_of(self.slices.get(key)):
            self._all_tenants()

    def _on_tenant(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.tenants.discard(name)
        else:
            self.tenants.add(name)
            self.queue.add(name)

    def _on_labelled(self, kind: str, obj: dict[str, Any]) -> None:
        consumer = ((obj.get("metadata") or {}).get("labels") or {}).get(CONSUMER_LABEL)
        if consumer and consumer in self.tenants:
            self.queue.add(consumer)

    def _on_namespace(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        consumer = (obj["metadata"].get("labels") or {}).get(CONSUMER_LABEL)
        if kind == "DELETED" or not consumer:
            consumer = self.ns_owner.pop(name, None)
        else:
            self.ns_owner[name] = consumer
        if consumer in self.tenants:
            self.queue.add(consumer)

    def _on_twin_request(self, kind: str, obj: dict[str, Any]) -> None:
        tenant = self._tenant_of_namespace(obj["metadata"].get("namespace", ""))
        if tenant:
            self.queue.add(tenant)

    async def run(self) -> None:
        label = {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"}
        running = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
        # (path, handler, name, params, counts for readiness)
        informers: list[tuple[str, Any, str, dict[str, str] | None, bool]] = [
            ("/api/v1/nodes", self._on_node, "nodes", None, True),
            ("/api/v1/pods", self._on_pod, "pods", running, True),
            (rest.path(API_VERSION, "resourceslices"), self._on_slice, "slices", None, True),
            (rest.path(API_VERSION, "tenants"), self._on_tenant, "tenants", None, True),
            ("/api/v1/namespaces", self._on_namespace, "namespaces", {"labelSelector": CONSUMER_LABEL}, True),
            (rest.path(API_VERSION, "twinnamespaces"), self._on_twin_request, "twinns", None, False),
            ("/apis/certificates.k8s.io/v1/certificatesigningrequests", self._on_labelled, "csrs", label, False),
            ("/api/v1/resourcequotas", self._on_labelled, "quotas", label, False),
        ]
        async with asyncio.TaskGroup() as tg:
            for path_, handler, what, params, gates in informers:
                synced = self._synced_cb(what) if gates else None
                tg.create_task(watch(self.api, path_, handler, what=what, params=params, on_synced=synced))
            await self.ready.wait()
            tg.create_task(self.queue.run(self.reconcile, workers=self.settings.workers))

    # ---- reconcile one tenant

    async def reconcile(self, name: str) -> float | None:
        tenant = await rest.get(self.api, rest.path(API_VERSION, "tenants", name))
        if tenant is None or tenant["metadata"].get("deletionTimestamp"):
            _PHASE.remove(name, ROLE)
            RESOURCE_GRANTED.remove(name, ROLE)
            RESOURCE_USED.remove(name, ROLE)
            return None
        log = self._log.bind(remote_cluster=name, kind="Tenant", name=name)
        old_status: dict[str, Any] = dict(tenant.get("status") or {})
        status = dict(old_status)
        status.setdefault("conditions", [])
        try:
            spec = TenantSpec.model_validate(tenant.get("spec") or {})
            consumer = parse_cluster_id(spec.consumer_cluster_id)
            if consumer != name:
                raise ValueError(f"spec.consumerClusterId {consumer!r} must equal the Tenant's name {name!r}")
        except (ValidationError, ValueError) as e:
            status["phase"] = "Refused"
            status["conditions"] = st_.mark(
                status["conditions"], "Authentication", False, "InvalidTenant", str(e)[:500]
            )
            await self._write_status(tenant, old_status, status)
            _PHASE.set("Refused", name, ROLE)
            return None

        requeue = self.settings.resync_s
        # Before any namespace of the consumer exists: its pods are checked from their first.
        await self._ensure_admission_policy()
        wait = await self._authenticate(tenant, spec, consumer, status, log)
        if wait is not None:
            requeue = min(requeue, wait)
        if status.get("phase") == "Authenticated":
            await self._ensure_tenant_namespace(tenant, consumer)
            twins = await self._twins(tenant, consumer, log)
            await self._grants(tenant, spec, consumer, twins, status)
            status["conditions"] = st_.mark(
                status["conditions"],
                "PodSecurity",
                True,
                "Enforced",
                f"offload policy for consumer {consumer}'s pods: {podsecurity.describe(spec.policy.pod_security)}",
            )
        await self._write_status(tenant, old_status, status)
        _PHASE.set(str(status.get("phase") or "Pending"), name, ROLE)
        return requeue

    async def _write_status(self, tenant: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
        if old == new:
            return
        await st_.write(self.api, "Tenant", "tenants", tenant["metadata"]["name"], new)

    # ---- handshake

    async def _authenticate(
        self, tenant: dict[str, Any], spec: TenantSpec, consumer: ClusterID, status: dict[str, Any], log: Any
    ) -> float | None:
        """Advance the handshake; returns a requeue hint while waiting on something."""
        conds = status["conditions"]
        if status.get("authGeneration") != spec.auth_generation:
            # A new handshake was asked for: forget the old one's state (not the answered nonces).
            for k in ("challenge", "certificate", "csrName", "answered"):
                status.pop(k, None)
            status["authGeneration"] = spec.auth_generation
            status["phase"] = "Pending"
        now = _now()
        answer = spec.answer
        if answer is not None and _sha(answer.nonce) != status.get("answered"):
            verdict = self._judge(spec, consumer, status, now)
            status["answered"] = _sha(answer.nonce)
            status["usedNonces"] = [*(status.get("usedNonces") or []), _sha(answer.nonce)][-NONCES_KEPT:]
            status.pop("challenge", None)
            if verdict.accepted:
                log.info("consumer verified", reason=verdict.reason)
                await self._ensure_tenant_namespace(tenant, consumer)
                status["csrName"] = await self._submit_csr(tenant, consumer, answer.csr, answer.nonce)
                status["phase"] = "Challenged"
                status["conditions"] = st_.mark(
                    conds, "Authentication", None, "Verified", verdict.message + "; signing its certificate"
                )
            else:
                log.warning("consumer refused", reason=verdict.reason)
                status["phase"] = "Refused"
                status["conditions"] = st_.mark(conds, "Authentication", False, verdict.reason, verdict.message)
                await events.emit(self.api, tenant, type_="Warning", reason=verdict.reason, message=verdict.message)
                return None
        conds = status["conditions"]
        if status.get("phase") == "Refused":
            return None
        if status.get("csrName") and not status.get("certificate"):
            return await self._collect_certificate(tenant, consumer, status, log)
        if status.get("phase") == "Authenticated":
            return None
        ch = status.get("challenge")
        if ch is None or _challenge(ch) is None or handshake.Challenge.from_wire(ch).expires_at < now:
            challenge = handshake.issue_challenge(
                self.identity.cluster_id,
                consumer,
                secrets.token_bytes(handshake.NONCE_BYTES),
                now,
                self.settings.challenge_ttl,
            )
            status["challenge"] = challenge.to_wire()
            status["phase"] = "Challenged"
            status["conditions"] = st_.mark(
                conds, "Authentication", None, "Challenged", f"waiting for consumer {consumer} to answer the challenge"
            )
            return self.settings.challenge_ttl.total_seconds()
        return None

    def _judge(
        self, spec: TenantSpec, consumer: ClusterID, status: dict[str, Any], now: dt.datetime
    ) -> handshake.Verdict:
        answer = spec.answer
        assert answer is not None
        if _sha(answer.nonce) in (status.get("usedNonces") or []):
            return handshake.Verdict(
                False,
                handshake.Refusal.REPLAYED,
                "this answer's challenge was already answered once; a replay is refused",
            )
        ch_wire = status.get("challenge")
        # A hand-edited, malformed challenge in the status counts as none: the answer cannot be to it.
        challenge = _challenge(ch_wire) if ch_wire else None
        if challenge is not None and ch_wire and ch_wire.get("nonce") != answer.nonce:
            return handshake.Verdict(
                False, handshake.Refusal.UNKNOWN_CHALLENGE, "the answer is for a challenge this provider did not issue"
            )
        try:
            signature = base64.b64decode(answer.signature, validate=True)
        except ValueError:
            return handshake.Verdict(False, handshake.Refusal.BAD_SIGNATURE, "the signature is not valid base64")
        return handshake.verify(
            challenge,
            consumer=consumer,
            consumer_public_pem=spec.public_key,
            signature=signature,
            csr_pem=answer.csr.encode(),
            now=now,
        )

    async def _submit_csr(self, tenant: dict[str, Any], consumer: ClusterID, csr_pem: str, nonce: str) -> str:
        name = f"gpufed-{consumer}-{_sha(nonce)[:10]}"
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {
                "name": name,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                "ownerReferences": [rest.owner_ref(tenant)],
            },
            "spec": {
                "request": base64.b64encode(csr_pem.encode()).decode(),
                "signerName": CSR_SIGNER,
                "expirationSeconds": self.settings.cert_seconds,
                "usages": ["digital signature", "client auth"],
            },
        }
        try:
            await rest.request(self.api, "POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", body=body)
        except KubeError as e:
            if not e.conflict:
                raise
        return name

    async def _collect_certificate(
        self, tenant: dict[str, Any], consumer: ClusterID, status: dict[str, Any], log: Any
    ) -> float | None:
        conds = status["conditions"]
        url = f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{status['csrName']}"
        csr = await rest.get(self.api, url)
        if csr is None:
            # Lost (garbage-collected or deleted by hand) before we read it: a new handshake is needed.
            status["phase"] = "Refused"
            msg = (
                f"the certificate request {status['csrName']} disappeared before it was signed; run `gpufed peer` again"
            )
            status["conditions"] = st_.mark(conds, "Authentication", False, "CSRLost", msg)
            return None
        cst = csr.get("status") or {}
        types = {c.get("type") for c in cst.get("conditions") or []}
        if "Denied" in types or "Failed" in types:
            status["phase"] = "Refused"
            detail = "; ".join(str(c.get("message", "")) for c in cst.get("conditions") or [])
            msg = f"the certificate request {status['csrName']} was denied or failed: {detail}"
            status["conditions"] = st_.mark(conds, "Authentication", False, "CSRRefused", msg)
            await events.emit(self.api, tenant, type_="Warning", reason="CSRRefused", message=msg)
            return None
        if "Approved" not in types:
            await rest.request(
                self.api,
                "PUT",
                url + "/approval",
                body={
                    **csr,
                    "status": {
                        **cst,
                        "conditions": [
                            *(cst.get("conditions") or []),
                            {
                                "type": "Approved",
                                "status": "True",
                                "reason": "GpufedPeering",
                                "message": f"consumer {consumer} proved possession of its registered identity key",
                            },
                        ],
                    },
                },
            )
            return 0.5
        if not cst.get("certificate"):
            return 0.5
        cert = base64.b64decode(cst["certificate"]).decode()
        ca = await rest.get(self.api, rest.path("v1", "configmaps", "kube-root-ca.crt", namespace=SYSTEM_NAMESPACE))
        if ca is None:
            return 1.0  # kube-controller-manager publishes it shortly after the namespace appears
        status["certificate"] = cert
        status["caData"] = (ca.get("data") or {}).get("ca.crt", "")
        status["phase"] = "Authenticated"
        status["namespace"] = tenant_namespace(consumer)
        status["conditions"] = st_.mark(
            conds,
            "Authentication",
            True,
            "Authenticated",
            f"consumer {consumer} authenticated (key {handshake.fingerprint(tenant['spec']['publicKey'])}); "
            f"its identity here is user {handshake.consumer_user(consumer)}",
        )
        log.info("consumer certificate issued", csr=status["csrName"])
        await events.emit(
            self.api, tenant, type_="Normal", reason="Authenticated", message=status["conditions"][-1]["message"]
        )
        return None

    # ---- namespaces and RBAC

    async def _ensure_admission_policy(self) -> None:
        """The offload pod-security policy and its binding (cluster-wide, the same for every tenant)."""
        if self._admission_applied:
            return
        group = "admissionregistration.k8s.io/v1"
        name = podsecurity.POLICY_NAME
        await rest.apply(
            self.api, rest.path(group, "validatingadmissionpolicies", name), podsecurity.admission_policy()
        )
        await rest.apply(
            self.api, rest.path(group, "validatingadmissionpolicybindings", name), podsecurity.admission_binding()
        )
        self._admission_applied = True
        self._log.info("offload pod-security policy applied", policy=name)

    async def _apply_namespace(self, tenant: dict[str, Any], name: str, labels: dict[str, str]) -> None:
        # The tenant's offload policy, as the admission policy reads it from the namespace.
        policy_labels, policy_annotations = podsecurity.namespace_metadata(_pod_security(tenant))
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
            rest.path("rbac.authorization.k8s.io/v1", "rolebindings", role, namespace=namespace),
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {
                    "name": role,
                    "namespace": namespace,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                },
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": handshake.consumer_user(consumer)}
                ],
            },
        )

    async def _ensure_tenant_namespace(self, tenant: dict[str, Any], consumer: ClusterID) -> None:
        ns = tenant_namespace(consumer)
        await self._apply_namespace(tenant, ns, {CONSUMER_LABEL: consumer, TENANT_LABEL: "true"})
        await self._bind(ns, CONSUMER_CONTROL_ROLE, consumer)
        await self._bind(ns, CONSUMER_WORKLOADS_ROLE, consumer)

    async def _twins(self, tenant: dict[str, Any], consumer: ClusterID, log: Any) -> list[str]:
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
                    conditions=st_.mark(conds, "Ready", False, "InvalidRequest", str(e)[:500]),
                )
                await self._twin_status(req, old, st)
                continue
            existing = await rest.get(self.api, rest.path("v1", "namespaces", twin))
            labels = (existing or {}).get("metadata", {}).get("labels") or {}
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
                    conditions=st_.mark(conds, "Ready", False, "NamespaceTaken", msg),
                )
                if old.get("phase") != "Refused":
                    await events.emit(self.api, req, type_="Warning", reason="NamespaceTaken", message=msg)
                await self._twin_status(req, old, st)
                continue
            if existing is not None and existing["metadata"].get("deletionTimestamp"):
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
                conditions=st_.mark(conds, "Ready", True, "Created", f"twin namespace {twin} is ready"),
                podSecurity=_published(_pod_security(tenant)),
            )
            await self._twin_status(req, old, st)
            ready.append(twin)
        # Twins nobody asks for any more (the request was deleted) go away.
        owned = await rest.list_items(
            self.api, "/api/v1/namespaces", params={"labelSelector": f"{CONSUMER_LABEL}={consumer},{TWIN_OF_LABEL}"}
        )
        for ns in owned:
            n = ns["metadata"]["name"]
            if n not in wanted and not ns["metadata"].get("deletionTimestamp"):
                log.info("removing twin namespace", namespace=n)
                await rest.delete(self.api, rest.path("v1", "namespaces", n), uid=ns["metadata"]["uid"])
        return sorted(ready)

    async def _twin_status(self, req: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
        if old == new:
            return
        meta = req["metadata"]
        await st_.write(self.api, "TwinNamespace", "twinnamespaces", meta["name"], new, meta["namespace"])

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

    # ---- grants and quotas

    def _usage(self, consumer: str) -> dict[str, dict[str, Decimal]]:
        """What the consumer's pods request now, per namespace it owns (tenant and twins)."""
        out: dict[str, dict[str, Decimal]] = {}
        for ns, load in self.pods.values():
            if self.ns_owner.get(ns) == consumer:
                out[ns] = grants.add(out.get(ns, {}), load.requests)
        return out

    def _policy(self, spec: TenantSpec) -> grants.TenantPolicy:
        return grants.TenantPolicy(
            maximum={r: parse(q) for r, q in spec.policy.max_resources.items()},
            allowed_gpu_products=frozenset(spec.policy.allowed_gpu_products)
            if spec.policy.allowed_gpu_products is not None
            else None,
            allow_partial=spec.policy.allow_partial,
        )

    def _grant_shares(self) -> dict[tuple[str, str], grants.OtherGrant]:
        """Every slice's grant and its share of its tenant's usage (attributed in slice-name order)."""
        out: dict[tuple[str, str], grants.OtherGrant] = {}
        remaining: dict[str, dict[str, Decimal]] = {}
        for (ns, name), obj in sorted(self.slices.items()):
            if ns not in remaining:
                remaining[ns] = _sum(self._usage(ns[len(TENANT_PREFIX) :]).values())
            try:
                granted = {r: parse(q) for r, q in _grant_of(obj).items()}
            except ValueError:
                continue
            used = {r: min(remaining[ns].get(r, Decimal(0)), g) for r, g in granted.items()}
            remaining[ns] = {r: v - used.get(r, Decimal(0)) for r, v in remaining[ns].items()}
            out[(ns, name)] = grants.OtherGrant(granted, used, (obj.get("spec") or {}).get("gpuProduct"))
        return out

    async def _grants(
        self, tenant: dict[str, Any], spec: TenantSpec, consumer: ClusterID, twins: list[str], status: dict[str, Any]
    ) -> None:
        tns = tenant_namespace(consumer)
        policy = self._policy(spec)
        # The watch cache is at least as fresh as the event that queued this reconcile.
        slices = [obj for (ns, _name), obj in sorted(self.slices.items()) if ns == tns]
        usage = self._usage(consumer)
        remaining = _sum(usage.values())
        shares = self._grant_shares()
        pods = [load for _ns, load in self.pods.values()]
        total_granted: dict[str, Decimal] = {}
        for s in slices:
            old = dict(s.get("status") or {})
            st: dict[str, Any] = {"conditions": list(old.get("conditions") or [])}
            conds = st["conditions"]
            auth = st_.condition(
                "Authentication", True, "Authenticated", f"consumer {consumer} is authenticated", conds
            )
            try:
                sspec = ResourceSliceSpec.model_validate(s.get("spec") or {})
                request = grants.SliceRequest({r: parse(q) for r, q in sspec.resources.items()}, sspec.gpu_product)
                own = {r: min(remaining.get(r, Decimal(0)), v) for r, v in request.resources.items()}
                remaining = {r: v - own.get(r, Decimal(0)) for r, v in remaining.items()}
                decision = grants.decide(
                    request,
                    nodes=self.nodes.values(),
                    pods=pods,
                    own_usage=own,
                    others=[g for key, g in shares.items() if key != (tns, s["metadata"]["name"])],
                    policy=policy,
                )
                res = st_.condition("Resources", decision.accepted, decision.reason, decision.message, conds)
                granted = dict(decision.granted)
                used = own
                st["nodeLabels"] = grants.shared_gpu_labels(self.nodes.values(), sspec.gpu_product)
            except (ValidationError, ValueError) as e:
                res = st_.condition("Resources", False, "InvalidSlice", f"the slice is invalid: {str(e)[:400]}", conds)
                granted, used = {}, {}
            res["observedGeneration"] = s["metadata"].get("generation", 1)
            st["conditions"] = st_.set_condition(st_.set_condition(conds, auth), res)
            st["granted"] = _fmt(granted)
            st["used"] = _fmt({r: v for r, v in used.items() if r in granted})
            total_granted = grants.add(total_granted, granted)
            if st_.without_times(old) != st_.without_times(st):
                await st_.write(self.api, "ResourceSlice", "resourceslices", s["metadata"]["name"], st, tns)
                if res["status"] == "False" and _reason(old) != res["reason"]:
                    await events.emit(self.api, s, type_="Warning", reason=res["reason"], message=res["message"])
        # Enforcement: the tenant namespace holds control objects only; the twins share the grant.
        limits = grants.partition(total_granted, {t: usage.get(t, {}) for t in twins})
        limits[tns] = {r: Decimal(0) for r in grants.RESOURCES}
        for ns, hard in limits.items():
            await self._quota(ns, consumer, hard)
        status["granted"] = _fmt(total_granted)
        status["used"] = _fmt(_sum(usage.values()))
        RESOURCE_GRANTED.set({r: float(v) for r, v in total_granted.items()}, consumer, ROLE)
        RESOURCE_USED.set({r: float(v) for r, v in _sum(usage.values()).items()}, consumer, ROLE)
        status["twinNamespaces"] = twins
        status["namespace"] = tns

    async def _quota(self, namespace: str, consumer: ClusterID, hard: Mapping[str, Decimal]) -> None:
        await rest.apply(
            self.api,
            rest.path("v1", "resourcequotas", GRANT_QUOTA, namespace=namespace),
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {
                    "name": GRANT_QUOTA,
                    "namespace": namespace,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                },
                "spec": {
                    "hard": {QUOTA_NAMES[r]: format_quantity(v, binary=r == "memory") for r, v in sorted(hard.items())}
                },
            },
        )


def _pod_security(tenant: Mapping[str, Any]) -> OffloadPodSecurity:
    """The tenant's offload policy; the strictest one when its spec cannot be read (reconcile refuses
    such a tenant anyway)."""
    try:
        return TenantSpec.model_validate(tenant.get("spec") or {}).policy.pod_security
    except ValidationError:
        return OffloadPodSecurity()


def _published(policy: OffloadPodSecurity) -> dict[str, Any]:
    """The policy as TwinNamespace status carries it (an empty list is left out: applied status
    fields must not be empty, see `rest.apply`)."""
    return {k: v for k, v in policy.model_dump(by_alias=True, mode="json").items() if v != []}


def _sum(items: Any) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for u in items:
        total = grants.add(total, u)
    return total


def _reason(status: dict[str, Any]) -> str:
    return next((str(c.get("reason")) for c in status.get("conditions") or [] if c.get("type") == "Resources"), "")


def _grant_of(slice_: dict[str, Any] | None) -> dict[str, str]:
    return dict(((slice_ or {}).get("status") or {}).get("granted") or {})


def _challenge(wire: Any) -> handshake.Challenge | None:
    """The challenge in a Tenant's status, or None when it is malformed (a new one is issued)."""
    try:
        return handshake.Challenge.from_wire(wire)
    except (ValueError, TypeError, KeyError):
        return None
