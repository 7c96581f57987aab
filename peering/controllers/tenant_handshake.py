"""The provider's half of the handshake for one Tenant: challenge, verdict, CSR signing, certificate.

Owns, per Tenant, level-triggered and idempotent: a new handshake when `spec.authGeneration`
rises; issuing a challenge (again when it expired or is malformed); judging the consumer's answer
once (`peering.handshake.verify`; replays of an answered nonce refused, answered nonces remembered
in the status); on success, the tenant namespace (so the consumer's RBAC exists before its
certificate does) and the consumer's CSR submitted to this cluster's CSR API (signer
kubernetes.io/kube-apiserver-client, a generated name nobody can claim first) and approved; then
the issued certificate and this cluster's CA published in the Tenant's status (phase
Authenticated). Every refusal is an `Authentication` condition and a Warning Event.

What is approved: only the request this controller filed for the verified answer
(`csr_problems`): filed by this controller's own identity (`spec.username`, which the API server
records and nobody can forge; learnt from the request it files, or once with a
SelfSubjectReview), for the signer above, with exactly the usages client auth + digital signature,
no longer than the lifetime asked for, owned by this Tenant, and carrying byte for byte the
certificate request of the answer that `peering.handshake.verify` accepted (subject
`CN=<consumer user>, O=gpufed:consumers`, no extensions). Anything else under the recorded name is
Denied with the reasons (a Warning Event on the Tenant too) and the handshake is refused: the
consumer runs `gpufed peer` again.

Does not: reconcile the tenant's namespaces beyond asking for the tenant namespace
(`peering.controllers.tenant_namespaces`), or decide grants (`peering.controllers.tenant_grants`).
The cryptographic checks are `peering.handshake`'s.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

from gpufed.apis.peering import TenantSpec
from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL, SYSTEM_NAMESPACE, ClusterID, tenant_namespace
from gpufed.kube import conditions as cond
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from peering import defaults, handshake
from peering.controllers.identity import Identity
from peering.controllers.tenant_namespaces import TenantNamespaces

#: Lifetime requested for a consumer's client certificate (the consumer renews it at two thirds).
DEFAULT_CERT_SECONDS = defaults.CLIENT_CERT_SECONDS
#: Answered nonces remembered per tenant (replays of older ones fail anyway: their challenge expired).
NONCES_KEPT = 32
CSR_SIGNER = "kubernetes.io/kube-apiserver-client"
#: The usages of a consumer's client certificate, no more and no fewer.
CSR_USAGES = ("digital signature", "client auth")


def client_csr_problems(spec: Mapping[str, Any], max_seconds: int) -> list[str]:
    """What makes a CSR's spec other than a consumer client certificate gpufed approves: the signer,
    exactly the client usages, a lifetime no longer than `max_seconds` (the handshake's and the
    renewal's shared checks)."""
    problems: list[str] = []
    if spec.get("signerName") != CSR_SIGNER:
        problems.append(f"signer {spec.get('signerName')!r} is not {CSR_SIGNER}")
    usages = list(spec.get("usages") or [])
    if sorted(usages) != sorted(CSR_USAGES) or len(set(usages)) != len(usages):
        problems.append(f"usages must be exactly {list(CSR_USAGES)}, not {usages}")
    seconds = spec.get("expirationSeconds")
    if not isinstance(seconds, int) or seconds > max_seconds:
        problems.append(f"expirationSeconds must be at most {max_seconds}, not {seconds}")
    return problems


_CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
_SELF_REVIEW_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
#: The reason of a refused certificate request (the CSR's Denied condition, the Tenant's condition and Event).
CSR_REJECTED = "CSRRejected"


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


def csr_problems(
    csr: dict[str, Any],
    *,
    tenant: dict[str, Any],
    consumer: ClusterID,
    expected_request: str,
    own_user: str,
    max_seconds: int,
) -> list[str]:
    """Why `csr` is not the request this controller filed for `tenant`'s verified answer (empty: it is)."""
    meta = csr.get("metadata") or {}
    spec = csr.get("spec") or {}
    problems: list[str] = []
    problems += client_csr_problems(spec, max_seconds)
    if str(spec.get("username") or "") != own_user:
        problems.append(f"filed by {spec.get('username') or '(nobody)'}, not by this controller ({own_user})")
    tenant_uid = (tenant.get("metadata") or {}).get("uid")
    if not tenant_uid or not any(ref.get("uid") == tenant_uid for ref in meta.get("ownerReferences") or ()):
        problems.append(f"not owned by Tenant {consumer}")
    try:
        request = base64.b64decode(str(spec.get("request") or ""), validate=True)
    except ValueError:
        request = b""
    # The answer's request passed `handshake.verify` (subject, key, no extensions) before it was filed.
    if not expected_request or request.strip() != expected_request.encode().strip():
        problems.append("its certificate request is not the one the consumer signed in its answer")
    return problems


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
        #: This controller's own user name, as the API server records it on requests it files.
        self._own_user: str | None = None

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
                status["csrName"] = await self._submit_csr(tenant, consumer, answer.csr)
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
            return await self._collect_certificate(tenant, spec, consumer, status, log)
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

    async def _submit_csr(self, tenant: dict[str, Any], consumer: ClusterID, csr_pem: str) -> str:
        """File the consumer's verified request; its name is generated by the API server, so nobody
        can create a request under it first."""
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {
                "generateName": f"gpufed-{consumer}-",
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                "ownerReferences": [rest.owner_ref(tenant)],
            },
            "spec": {
                "request": base64.b64encode(csr_pem.encode()).decode(),
                "signerName": CSR_SIGNER,
                "expirationSeconds": self.cert_seconds,
                "usages": list(CSR_USAGES),
            },
        }
        created = await rest.request(
            self.api, "POST", _CSR_PATH, body=body, what=f"file the CSR of consumer {consumer}"
        )
        # The API server records who filed it: that is this controller's own user name.
        self._own_user = str((created.get("spec") or {}).get("username") or "")
        return str(created["metadata"]["name"])

    async def own_user(self) -> str:
        """This controller's user name: from the last request it filed, else a SelfSubjectReview (once)."""
        if self._own_user is None:
            review = await rest.request(
                self.api,
                "POST",
                _SELF_REVIEW_PATH,
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                what="SelfSubjectReview",
            )
            self._own_user = str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")
        return self._own_user

    async def _reject_csr(
        self, tenant: dict[str, Any], csr: dict[str, Any], status: dict[str, Any], problems: list[str]
    ) -> None:
        """Deny a request that is not ours (where the signer lets us) and refuse the handshake."""
        name = csr["metadata"]["name"]
        reasons = "; ".join(problems)
        if (csr.get("spec") or {}).get("signerName") == CSR_SIGNER:
            cst = csr.get("status") or {}
            denied = {"type": "Denied", "status": "True", "reason": CSR_REJECTED, "message": reasons[:1024]}
            body = {**csr, "status": {**cst, "conditions": [*(cst.get("conditions") or []), denied]}}
            try:
                await rest.request(self.api, "PUT", f"{_CSR_PATH}/{name}/approval", body=body, what=f"deny CSR {name}")
            except KubeError as e:
                if not (e.conflict or e.not_found):
                    raise
        msg = f"the certificate request {name} is not the one filed for this consumer, refused: {reasons}"
        status["phase"] = "Refused"
        status["conditions"] = cond.mark(status["conditions"], "Authentication", False, CSR_REJECTED, msg)
        await events.emit(self.api, tenant, type_="Warning", reason=CSR_REJECTED, message=msg)

    async def _collect_certificate(
        self, tenant: dict[str, Any], spec: TenantSpec, consumer: ClusterID, status: dict[str, Any], log: Any
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
        problems = csr_problems(
            csr,
            tenant=tenant,
            consumer=consumer,
            expected_request=spec.answer.csr if spec.answer is not None else "",
            own_user=await self.own_user(),
            max_seconds=self.cert_seconds,
        )
        if problems:
            log.warning("certificate request refused", csr=status["csrName"], problems=problems)
            await self._reject_csr(tenant, csr, status, problems)
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
