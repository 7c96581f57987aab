"""The consumer role: the handshake's consumer half, credentials for providers, slice mirroring.

Owns, per ForeignCluster with role Provider (key = the provider's ClusterID), level-triggered:
- answering the provider's challenge (copied into `spec.challenge` by `gpufed peer`): a fresh
  ECDSA key for the client certificate (kept in Secret `gpufed/gpufed-csr-key-<provider>`), a CSR
  with the subject `peering.handshake` fixes, and an Ed25519 signature by this cluster's identity
  key over challenge + CSR, published in `status.answer`;
- turning the certificate the provider issued (copied into `spec.certificate`) into a kubeconfig
  Secret `gpufed/gpufed-remote-<provider>`, after checking it belongs to the key generated here
  (these Secrets are watched: a current one is not read again, a change is reconciled at once);
- renewing that certificate after two thirds of its lifetime, into the same Secret
  (`peering.controllers.renewal`, called from the reconcile; a renewed certificate stays current
  while it descends from the ForeignCluster's `spec.certificate`);
- letting the virtual kubelets read that Secret and no other of `gpufed` (a Role and RoleBinding
  per peering, peering.controllers.credentials_access), granted before the peering is reported
  Peered (which starts its virtual kubelet) and revoked when the ForeignCluster goes;
- mirroring the consumer's ResourceSlices for that provider (namespace `gpufed`) into its tenant
  namespace on the provider with those credentials, copying the provider's decision back into the
  local status (its offered StorageClasses only as far as they validate, `storage_offers`), and
  deleting mirrors whose local slice is gone.

A ForeignCluster that names only a consumer (this cluster is its provider) gets a status that
reports that consumer's Tenant here (`_consumer_peer`: phase, `TenantReady`, Ready); nothing else.

The identity key never leaves this process; the CSR key never leaves this cluster.

Metrics (shared with the provider role, which sets them with role="provider"):
`gpufed_peering_phase{remote_cluster,role,phase}` (1 for the ForeignCluster's phase) and
`gpufed_resource_granted` / `gpufed_resource_used{remote_cluster,role,resource,unit}` (the sum over the
slices for that provider of what it granted and what is used of it, as its mirrors say; base
units), all dropped when the ForeignCluster goes; and, consumer role only, the validity of the
stored client certificate (`peering.expiry`, kind `client`).

Does not: talk to the provider before it holds credentials there (the CLI carries the handshake),
or delete anything on unpeer but the virtual kubelets' access to the credentials (the rest is
`gpufed unpeer`'s; Secrets are owned by the ForeignCluster).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import structlog
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import Gauge
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.peering import (
    CONSUMER_PEER_READY,
    FOREIGN_CLUSTER_READY,
    RESOURCE_SLICE_READY,
    ForeignClusterSpec,
    ResourceSliceSpec,
    StorageClassOffer,
)
from gpufed.apis.quantity import QuantityError, parse, resource_unit
from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROVIDER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    parse_cluster_id,
    pending_key_secret,
    remote_kubeconfig_secret,
    tenant_namespace,
)
from gpufed.kube import conditions as cond
from gpufed.kube import meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.metrics import GaugeMap, StateGauge
from gpufed.kube.queue import WorkQueue
from gpufed.kube.times import rfc3339
from gpufed.kube.watch import watch
from peering import expiry, handshake
from peering.controllers import status as st_
from peering.controllers.credentials_access import CredentialsAccess
from peering.controllers.identity import Identity
from peering.controllers.remotes import Remotes
from peering.controllers.renewal import RENEWED_FROM_ANNOTATION, ClientRenewal, RenewalSettings, handshake_digest

#: Seconds between polls of the provider for a slice's decision while it is not settled.
DEFAULT_PENDING_POLL_S = 1.0
#: Seconds between re-reads of settled slices (grants change with the provider's capacity).
DEFAULT_RESYNC_S = 10.0
#: Seconds between looks at the Tenant a consumer-only ForeignCluster reports.
CONSUMER_PEER_POLL_S = 10.0
#: A Tenant's phase as its consumer's ForeignCluster says it.
_PHASE_OF_TENANT = {"Challenged": "Authenticating", "Authenticated": "Peered", "Refused": "Failed"}
#: On the credentials Secret of a provider: the API server URL they were issued for.
SERVER_ANNOTATION = "gpufed.io/server"
#: Phases of a ForeignCluster with role Provider, as this role sets them.
PHASES = ("Pending", "Authenticating", "Peered")

PEERING_PHASE = Gauge(
    "gpufed_peering_phase",
    "Phase of a peering as this cluster's role in it sees it: 1 for the current phase, 0 for the others.",
    ["remote_cluster", "role", "phase"],
)
RESOURCE_GRANTED = GaugeMap(
    Gauge(
        "gpufed_resource_granted",
        "Resources the provider granted in a peering (sum over its ResourceSlices), in base units (label unit).",
        ["remote_cluster", "role", "resource", "unit"],
    ),
    resource_unit,
)
RESOURCE_USED = GaugeMap(
    Gauge(
        "gpufed_resource_used",
        "Resources of a peering's grant in use (what the consumer's offloaded pods request), in base units "
        "(label unit).",
        ["remote_cluster", "role", "resource", "unit"],
    ),
    resource_unit,
)
_PHASE = StateGauge(PEERING_PHASE, PHASES)
ROLE = "consumer"


def quantities(resources: Mapping[str, Any]) -> dict[str, float]:
    """resource -> amount in base units, of a map of quantities (unreadable ones left out)."""
    out: dict[str, float] = {}
    for r, q in resources.items():
        try:
            out[r] = float(parse(q))
        except (QuantityError, TypeError):
            continue
    return out


def storage_offers(value: Any) -> list[dict[str, Any]]:
    """The StorageClasses a provider's slice status offers, each validated (the provider is not
    trusted: an entry that does not validate is left out, and so is every entry but the first
    marked default)."""
    out: list[dict[str, Any]] = []
    seen_default = False
    for item in value if isinstance(value, list) else []:
        try:
            offer = StorageClassOffer.model_validate(item)
        except ValidationError:
            continue
        if offer.default and seen_default:
            offer = offer.model_copy(update={"default": False})
        seen_default = seen_default or offer.default
        out.append(offer.model_dump(by_alias=True, mode="json"))
    return out


@dataclass(frozen=True)
class ConsumerSettings:
    #: Seconds between polls of the provider while a slice waits for a decision.
    pending_poll_s: float = DEFAULT_PENDING_POLL_S
    #: Seconds between re-reads of settled slices.
    resync_s: float = DEFAULT_RESYNC_S
    #: Concurrent provider reconciles.
    workers: int = 4
    #: When and how the client certificates renew themselves.
    renewal: RenewalSettings = field(default_factory=RenewalSettings)


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def kubeconfig_for(provider: str, server: str, ca_pem: str, cert_pem: str, key_pem: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": provider, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}],
        "users": [
            {"name": user, "user": {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}}
        ],
        "contexts": [{"name": provider, "context": {"cluster": provider, "user": user}}],
        "current-context": provider,
    }


class ConsumerRole:
    """Runs the consumer reconcilers of one cluster."""

    def __init__(self, api: Any, identity: Identity, settings: ConsumerSettings | None = None) -> None:
        self.api = api
        self.identity = identity
        self.settings = settings or ConsumerSettings()
        self.queue: WorkQueue[str] = WorkQueue("providers")
        self.remotes = Remotes()
        self._log = structlog.get_logger().bind(cluster=identity.cluster_id, role="consumer")
        #: Our ResourceSlices by name, from the slice watch; read only once it has synced (listing
        #: them all per provider per resync cost O(providers^2) reads: `make bench`'s api-cost part).
        self._slice_cache: dict[str, dict[str, Any]] = {}
        self._slices_synced = False
        #: Our credentials Secrets by name (label PROVIDER_LABEL, namespace gpufed), from a watch:
        #: every reconcile checks them, and a GET each time was a read per provider every few
        #: seconds. Trusted only when it says the Secret is current; anything else is read first.
        self._secret_cache: dict[str, dict[str, Any]] = {}
        self._secrets_synced = False
        #: Who may read those Secrets: the virtual kubelets, each peering's by name only.
        self.access = CredentialsAccess(api, self.queue.add)
        self.renewal = ClientRenewal(api, identity, self.settings.renewal)

    def _on_fc(self, kind: str, obj: dict[str, Any]) -> None:
        self.queue.add(obj["metadata"]["name"])

    def _on_slice(self, kind: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name:
            if kind == "DELETED":
                self._slice_cache.pop(str(name), None)
            else:
                self._slice_cache[str(name)] = obj
        provider = (obj.get("spec") or {}).get("providerClusterId")
        if provider:
            self.queue.add(str(provider))

    def _on_secret(self, kind: str, obj: dict[str, Any]) -> None:
        name = meta.name(obj)
        if not name:
            return
        if kind == "DELETED":
            self._secret_cache.pop(name, None)
        else:
            self._secret_cache[name] = obj
        provider = meta.labels(obj).get(PROVIDER_LABEL)
        if provider:  # e.g. someone deleted our credentials: the ForeignCluster says so now, not at a resync
            self.queue.add(str(provider))

    def _on_secrets_synced(self) -> None:
        self._secrets_synced = True

    async def watch_secrets(self) -> None:
        """Keep the credentials Secrets' cache (part of `run`)."""
        await watch(
            self.api,
            rest.path("v1", "secrets", namespace=SYSTEM_NAMESPACE),
            self._on_secret,
            what="credentials secrets",
            params={"labelSelector": PROVIDER_LABEL},
            on_synced=self._on_secrets_synced,
        )

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(
                    watch(self.api, rest.path(API_VERSION, "foreignclusters"), self._on_fc, what="foreignclusters")
                )
                tg.create_task(
                    watch(
                        self.api,
                        rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE),
                        self._on_slice,
                        what="resourceslices",
                        on_synced=self._on_slices_synced,
                    )
                )
                tg.create_task(self.watch_secrets())
                tg.create_task(self.access.run())
                tg.create_task(self.queue.run(self.reconcile, workers=self.settings.workers))
        finally:
            await self.remotes.close()

    # ---- reconcile one provider

    async def reconcile(self, name: str) -> float | None:
        fc = await rest.get(self.api, rest.path(API_VERSION, "foreignclusters", name))
        if fc is None or fc["metadata"].get("deletionTimestamp"):
            await self.remotes.drop(name)
            await self.access.revoke(name)
            _PHASE.remove(name, ROLE)
            RESOURCE_GRANTED.remove(name, ROLE)
            RESOURCE_USED.remove(name, ROLE)
            expiry.drop(name, expiry.CLIENT)
            self.renewal.forget(name)
            return None
        try:
            spec = ForeignClusterSpec.model_validate(fc.get("spec") or {})
            provider = parse_cluster_id(spec.cluster_id)
        except (ValidationError, ValueError):
            return None  # the CRD schema refuses such objects; nothing sensible to do
        if "Provider" not in spec.roles:
            await self.access.revoke(provider)
            return await self._consumer_peer(fc, provider)
        log = self._log.bind(remote_cluster=provider, kind="ForeignCluster", name=name)
        # Before the credentials exist and before the status says Peered (which starts the virtual
        # kubelet): it finds its Secret readable from its first try.
        await self.access.grant(fc, provider)
        old = dict(fc.get("status") or {})
        status = dict(old)
        status["conditions"] = list(status.get("conditions") or [])
        await self._answer(fc, spec, provider, status, log)
        credentials = await self._credentials(fc, spec, provider, status, log)
        wait: float | None = None
        if credentials is not None:
            _export_expiry(provider, credentials)
            status["phase"] = "Peered"
            wait = await self._slices(provider, credentials, status, log)
            renew_wait = await self._renew(fc, provider, credentials, status)
            if renew_wait is not None:
                wait = min(wait, renew_wait)
        else:
            status["phase"] = "Authenticating" if spec.challenge or status.get("answer") else "Pending"
            await self._slices_waiting(provider)
        _PHASE.set(status["phase"], provider, ROLE)
        status["conditions"] = cond.ready(status["conditions"], FOREIGN_CLUSTER_READY, meta.generation(fc))
        if cond.without_times(status) != cond.without_times(old):
            await st_.write(self.api, "ForeignCluster", "foreignclusters", name, status)
        return wait

    async def _consumer_peer(self, fc: dict[str, Any], consumer: ClusterID) -> float:
        """A ForeignCluster that names a consumer of this cluster (the provider's side of a peering):
        its status follows that consumer's Tenant (phase, and `TenantReady` from the Tenant's Ready),
        so `kubectl wait --for=condition=Ready` works on both sides. The Tenant's own reconciler
        decides everything; this only reports it, looked at again every `CONSUMER_PEER_POLL_S`."""
        tenant = await rest.get(self.api, rest.path(API_VERSION, "tenants", consumer))
        old = dict(fc.get("status") or {})
        status = dict(old)
        t_status = (tenant or {}).get("status") or {}
        t_ready = cond.find(t_status.get("conditions"), "Ready")
        if tenant is None:
            ok, reason, message = False, "NoTenant", f"no Tenant {consumer} on this cluster: run gpufed peer"
        elif t_ready is None:
            ok, reason, message = False, "TenantPending", f"Tenant {consumer} has not reported Ready yet"
        else:
            ok = t_ready.get("status") == "True"
            reason = str(t_ready.get("reason") or ("Ready" if ok else "TenantNotReady"))
            message = f"Tenant {consumer}: {t_ready.get('message') or t_ready.get('status')}"
        status["phase"] = "Peered" if ok else _PHASE_OF_TENANT.get(str(t_status.get("phase")), "Pending")
        conds = cond.mark(list(status.get("conditions") or []), "TenantReady", ok, reason, message)
        status["conditions"] = cond.ready(conds, CONSUMER_PEER_READY, meta.generation(fc))
        if cond.without_times(status) != cond.without_times(old):
            await st_.write(self.api, "ForeignCluster", "foreignclusters", meta.name(fc), status)
        return CONSUMER_PEER_POLL_S

    async def _answer(
        self, fc: dict[str, Any], spec: ForeignClusterSpec, provider: ClusterID, status: dict[str, Any], log: Any
    ) -> None:
        wire = spec.challenge
        if wire is None:
            return
        answered = status.get("answer") or {}
        if answered.get("nonce") == wire.nonce:
            return
        conds = status["conditions"]
        try:
            challenge = handshake.Challenge.from_wire(wire.model_dump(by_alias=True))
        except ValueError as e:
            status["conditions"] = cond.mark(conds, "Authentication", False, "InvalidChallenge", str(e))
            return
        if challenge.provider != provider or challenge.consumer != self.identity.cluster_id:
            msg = (
                f"the challenge is from {challenge.provider} for {challenge.consumer}; "
                f"this is {self.identity.cluster_id} peering with {provider}: not answered"
            )
            status["conditions"] = cond.mark(conds, "Authentication", False, "ChallengeMismatch", msg)
            return
        key = ec.generate_private_key(ec.SECP256R1())
        csr = handshake.make_csr(self.identity.cluster_id, key)
        signature = handshake.sign(self.identity.private_key, challenge, csr)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        await rest.apply(
            self.api,
            rest.path("v1", "secrets", pending_key_secret(provider), namespace=SYSTEM_NAMESPACE),
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": pending_key_secret(provider),
                    "namespace": SYSTEM_NAMESPACE,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, PROVIDER_LABEL: provider},
                    "ownerReferences": [rest.owner_ref(fc)],
                },
                "data": {"tls.key": _b64(key_pem), "nonce": _b64(wire.nonce)},
            },
        )
        status["answer"] = {"nonce": wire.nonce, "csr": csr.decode(), "signature": _b64(signature)}
        status["conditions"] = cond.mark(
            conds,
            "Authentication",
            None,
            "ChallengeAnswered",
            f"answered {provider}'s challenge; waiting for its certificate",
        )
        log.info("challenge answered")

    async def _credentials(
        self, fc: dict[str, Any], spec: ForeignClusterSpec, provider: ClusterID, status: dict[str, Any], log: Any
    ) -> dict[str, Any] | None:
        """The Secret with our credentials for `provider`, written from the issued certificate when
        needed; None while there are none (yet)."""
        if not spec.certificate:
            return None
        conds = status["conditions"]
        secret_name = remote_kubeconfig_secret(provider)
        secret_path = rest.path("v1", "secrets", secret_name, namespace=SYSTEM_NAMESPACE)

        def current(secret: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
            # The handshake's certificate, or one renewed from it (peering.controllers.renewal).
            return (
                secret is not None
                and (
                    (secret.get("data") or {}).get("tls.crt") == _b64(spec.certificate)
                    or meta.annotations(secret).get(RENEWED_FROM_ANNOTATION) == handshake_digest(spec.certificate)
                )
                and meta.annotations(secret).get(SERVER_ANNOTATION) == spec.api_server_url
            )

        cached = self._secret_cache.get(secret_name) if self._secrets_synced else None
        if current(cached):
            return cached
        # Not known to be current (not cached yet, or the watch lags behind our own write): the API
        # server decides before anything is written or refused.
        existing = await rest.get(self.api, secret_path)
        if current(existing):
            return existing
        pending = await rest.get(
            self.api, rest.path("v1", "secrets", pending_key_secret(provider), namespace=SYSTEM_NAMESPACE)
        )
        try:
            cert = x509.load_pem_x509_certificate(spec.certificate.encode())
        except ValueError as e:
            status["conditions"] = cond.mark(
                conds, "Authentication", False, "InvalidCertificate", f"the provider's certificate is not PEM: {e}"
            )
            return None
        key_pem = base64.b64decode((pending or {}).get("data", {}).get("tls.key", "")) if pending else b""
        if not key_pem and existing is not None:
            key_pem = base64.b64decode((existing.get("data") or {}).get("tls.key", ""))  # e.g. the API URL changed
        try:
            key = serialization.load_pem_private_key(key_pem, password=None) if key_pem else None
        except ValueError:
            key = None
        if key is None or _spki(cert.public_key()) != _spki(key.public_key()):
            status["conditions"] = cond.mark(
                conds,
                "Authentication",
                False,
                "CertificateMismatch",
                "the certificate does not belong to the key this cluster generated; run `gpufed peer` again",
            )
            return None
        kubeconfig = kubeconfig_for(
            provider,
            spec.api_server_url,
            spec.ca_data,
            spec.certificate,
            key_pem.decode(),
            handshake.consumer_user(self.identity.cluster_id),
        )
        secret = await rest.apply(
            self.api,
            secret_path,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": secret_name,
                    "namespace": SYSTEM_NAMESPACE,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY, PROVIDER_LABEL: provider},
                    "annotations": {SERVER_ANNOTATION: spec.api_server_url},
                    "ownerReferences": [rest.owner_ref(fc)],
                },
                "data": {
                    "kubeconfig": _b64(yaml.safe_dump(kubeconfig)),
                    "tls.crt": _b64(spec.certificate),
                    "tls.key": _b64(key_pem),
                    "ca.crt": _b64(spec.ca_data),
                },
            },
        )
        self._secret_cache[secret_name] = secret  # until the watch brings it (or a later version)
        if pending is not None:
            await rest.delete(
                self.api,
                rest.path("v1", "secrets", pending_key_secret(provider), namespace=SYSTEM_NAMESPACE),
                uid=pending["metadata"]["uid"],
            )
        status["kubeconfigSecret"] = secret_name
        status["conditions"] = cond.mark(
            conds,
            "Authentication",
            True,
            "Authenticated",
            f"holding credentials for {provider} (valid until "
            f"{rfc3339(cert.not_valid_after_utc)}) in Secret {SYSTEM_NAMESPACE}/{secret_name}",
        )
        await self.remotes.drop(provider)
        log.info("provider credentials stored", secret=secret_name)
        return secret

    async def _renew(
        self, fc: dict[str, Any], provider: ClusterID, credentials: dict[str, Any], status: dict[str, Any]
    ) -> float | None:
        """Renew the client certificate when it is due (peering.controllers.renewal)."""
        try:
            remote_api = await self.remotes.get(provider, credentials)
        except KubeError:
            return None  # `_slices` reported the provider unreachable
        outcome = await self.renewal.reconcile(fc, provider, credentials, remote_api, status)
        if outcome.stored is not None:
            self._secret_cache[meta.name(outcome.stored)] = outcome.stored  # until the watch brings it
            _export_expiry(provider, outcome.stored)
        return outcome.wait

    def _on_slices_synced(self) -> None:
        self._slices_synced = True

    async def _local_slices(self, provider: str) -> list[dict[str, Any]]:
        """This provider's slices: from the watch's cache once it has synced, listed before."""
        if self._slices_synced:
            items = list(self._slice_cache.values())
        else:
            items = await rest.list_items(
                self.api, rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE)
            )
        return [s for s in items if (s.get("spec") or {}).get("providerClusterId") == provider]

    async def _slices_waiting(self, provider: ClusterID) -> None:
        for s in await self._local_slices(provider):
            old = dict(s.get("status") or {})
            conds = list(old.get("conditions") or [])
            msg = f"waiting for the handshake with {provider} (run `gpufed peer`)"
            st = {
                **old,
                "conditions": cond.ready(
                    cond.mark(conds, "Authentication", None, "Pending", msg), RESOURCE_SLICE_READY, meta.generation(s)
                ),
            }
            if cond.without_times(st) != cond.without_times(old):
                await self._slice_status(s, st)

    async def _slice_status(self, s: dict[str, Any], st: dict[str, Any]) -> None:
        await st_.write(self.api, "ResourceSlice", "resourceslices", meta.name(s), st, meta.namespace(s))

    async def _slices(
        self, provider: ClusterID, credentials: dict[str, Any], status: dict[str, Any], log: Any
    ) -> float:
        conds = status["conditions"]
        tns = tenant_namespace(self.identity.cluster_id)
        local = await self._local_slices(provider)
        try:
            remote_api = await self.remotes.get(provider, credentials)
            remote_items = await rest.list_items(remote_api, rest.path(API_VERSION, "resourceslices", namespace=tns))
        except KubeError as e:
            status["conditions"] = cond.mark(conds, "ProviderReachable", False, "APIError", str(e)[:500])
            log.warning("provider unreachable", error=str(e))
            await self.remotes.drop(provider)
            return self.settings.resync_s
        status["conditions"] = cond.mark(conds, "ProviderReachable", True, "Reachable", "the provider's API answers")
        remote = {r["metadata"]["name"]: r for r in remote_items}
        settled = True
        granted: dict[str, float] = {}
        used: dict[str, float] = {}
        for s in local:
            name = s["metadata"]["name"]
            try:
                sspec = ResourceSliceSpec.model_validate(s.get("spec") or {})
            except ValidationError:
                continue
            want = sspec.model_dump(by_alias=True, exclude_none=True)
            mirror = remote.get(name)
            if mirror is None or mirror.get("spec") != want:
                mirror = await rest.apply(
                    remote_api,
                    rest.path(API_VERSION, "resourceslices", name, namespace=tns),
                    {
                        "apiVersion": API_VERSION,
                        "kind": "ResourceSlice",
                        "metadata": {"name": name, "namespace": tns, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                        "spec": want,
                    },
                )
            rst = mirror.get("status") or {}
            for total, amounts in ((granted, rst.get("granted") or {}), (used, rst.get("used") or {})):
                for r, v in quantities(amounts).items():
                    total[r] = total.get(r, 0.0) + v
            res = next((c for c in rst.get("conditions") or [] if c.get("type") == "Resources"), None)
            if res is None or res.get("observedGeneration") != mirror["metadata"].get("generation"):
                settled = False
                continue
            # The provider's conditions, observed at the local slice's generation; Ready summed up here
            # (its transition time kept from the local status).
            local_ready = cond.find((s.get("status") or {}).get("conditions"), cond.READY)
            copied = [c for c in rst.get("conditions") or [] if c.get("type") != cond.READY]
            st = {
                "conditions": cond.ready(
                    [*copied, *([dict(local_ready)] if local_ready else [])],
                    RESOURCE_SLICE_READY,
                    meta.generation(s),
                ),
                "granted": rst.get("granted") or {},
                "used": rst.get("used") or {},
                "nodeLabels": rst.get("nodeLabels") or {},
                "storageClasses": storage_offers(rst.get("storageClasses")),
            }
            st = {k: v for k, v in st.items() if v not in ({}, [])}  # the API server stores no empty maps
            if st != (s.get("status") or {}):
                await self._slice_status(s, st)
        RESOURCE_GRANTED.set(granted, provider, ROLE)
        RESOURCE_USED.set(used, provider, ROLE)
        local_names = {s["metadata"]["name"] for s in local}
        for name, mirror in remote.items():
            if name not in local_names:
                log.info("removing slice mirror", name=name)
                await rest.delete(
                    remote_api,
                    rest.path(API_VERSION, "resourceslices", name, namespace=tns),
                    uid=mirror["metadata"]["uid"],
                )
        return self.settings.resync_s if settled else self.settings.pending_poll_s


def _export_expiry(provider: ClusterID, secret: dict[str, Any]) -> None:
    """The expiry metric of the client certificate in a credentials Secret (public fields only)."""
    try:
        cert = x509.load_pem_x509_certificate(base64.b64decode((secret.get("data") or {}).get("tls.crt", "")))
    except ValueError:
        return
    expiry.export(provider, expiry.CLIENT, cert)


def _spki(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))
