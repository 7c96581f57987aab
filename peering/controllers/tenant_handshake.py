"""The provider's half of the handshake for one Tenant: challenge, verdict, CSR signing, certificate.

Owns, per Tenant, level-triggered and idempotent: a new handshake when `spec.authGeneration`
rises; issuing a challenge (again when it expired or is malformed); judging the consumer's answer
once (`peering.handshake.verify`; replays of an answered nonce refused, answered nonces remembered
in the status); on success, the tenant namespace (so the consumer's RBAC exists before its
certificate does) and the consumer's CSR submitted to this cluster's CSR API (signer
kubernetes.io/kube-apiserver-client) and approved; then the issued certificate and this cluster's
CA published in the Tenant's status (phase Authenticated). Every refusal is an `Authentication`
condition and a Warning Event.

Does not: reconcile the tenant's namespaces beyond asking for the tenant namespace
(`peering.controllers.tenant_namespaces`), or decide grants (`peering.controllers.tenant_grants`).
The cryptographic checks are `peering.handshake`'s.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets
from typing import Any

from gpufed.apis.peering import TenantSpec
from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL, SYSTEM_NAMESPACE, ClusterID, tenant_namespace
from gpufed.kube import conditions as cond
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from peering import handshake
from peering.controllers.identity import Identity
from peering.controllers.tenant_namespaces import TenantNamespaces

#: Lifetime requested for a consumer's client certificate.
DEFAULT_CERT_SECONDS = 90 * 24 * 3600
#: Answered nonces remembered per tenant (replays of older ones fail anyway: their challenge expired).
NONCES_KEPT = 32
CSR_SIGNER = "kubernetes.io/kube-apiserver-client"
_CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _sha(nonce_b64: str) -> str:
    return hashlib.sha256(nonce_b64.encode()).hexdigest()


def _challenge(wire: Any) -> handshake.Challenge | None:
    """The challenge in a Tenant's status, or None when it is malformed (a new one is issued)."""
    try:
        return handshake.Challenge.from_wire(wire)
    except (ValueError, TypeError, KeyError):
        return None


class TenantHandshake:
    """Advances the handshake of the provider's tenants, one reconcile at a time."""

    def __init__(
        self,
        api: Any,
        identity: Identity,
        namespaces: TenantNamespaces,
        *,
        challenge_ttl: dt.timedelta = handshake.DEFAULT_CHALLENGE_TTL,
        cert_seconds: int = DEFAULT_CERT_SECONDS,
    ) -> None:
        self.api = api
        self.identity = identity
        self.namespaces = namespaces
        self.challenge_ttl = challenge_ttl
        self.cert_seconds = cert_seconds

    async def authenticate(
        self, tenant: dict[str, Any], spec: TenantSpec, consumer: ClusterID, status: dict[str, Any], log: Any
    ) -> float | None:
        """Advance the handshake in `status`; returns a requeue hint while waiting on something."""
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
                await self.namespaces.ensure_tenant_namespace(tenant, consumer)
                status["csrName"] = await self._submit_csr(tenant, consumer, answer.csr, answer.nonce)
                status["phase"] = "Challenged"
                status["conditions"] = cond.mark(
                    conds, "Authentication", None, "Verified", verdict.message + "; signing its certificate"
                )
            else:
                log.warning("consumer refused", reason=verdict.reason)
                status["phase"] = "Refused"
                status["conditions"] = cond.mark(conds, "Authentication", False, verdict.reason, verdict.message)
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
                self.challenge_ttl,
            )
            status["challenge"] = challenge.to_wire()
            status["phase"] = "Challenged"
            status["conditions"] = cond.mark(
                conds, "Authentication", None, "Challenged", f"waiting for consumer {consumer} to answer the challenge"
            )
            return self.challenge_ttl.total_seconds()
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
                "expirationSeconds": self.cert_seconds,
                "usages": ["digital signature", "client auth"],
            },
        }
        try:
            await rest.request(self.api, "POST", _CSR_PATH, body=body)
        except KubeError as e:
            if not e.conflict:
                raise
        return name

    async def _collect_certificate(
        self, tenant: dict[str, Any], consumer: ClusterID, status: dict[str, Any], log: Any
    ) -> float | None:
        conds = status["conditions"]
        url = f"{_CSR_PATH}/{status['csrName']}"
        csr = await rest.get(self.api, url)
        if csr is None:
            # Lost (garbage-collected or deleted by hand) before we read it: a new handshake is needed.
            status["phase"] = "Refused"
            msg = (
                f"the certificate request {status['csrName']} disappeared before it was signed; run `gpufed peer` again"
            )
            status["conditions"] = cond.mark(conds, "Authentication", False, "CSRLost", msg)
            return None
        cst = csr.get("status") or {}
        types = {c.get("type") for c in cst.get("conditions") or []}
        if "Denied" in types or "Failed" in types:
            status["phase"] = "Refused"
            detail = "; ".join(str(c.get("message", "")) for c in cst.get("conditions") or [])
            msg = f"the certificate request {status['csrName']} was denied or failed: {detail}"
            status["conditions"] = cond.mark(conds, "Authentication", False, "CSRRefused", msg)
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
        status["conditions"] = cond.mark(
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
