"""The provider approves consumers' renewals of their client certificates (runs in the provider role).

Owns: a watch on CertificateSigningRequests with signer kubernetes.io/kube-apiserver-client, and
for each undecided one filed by a consumer identity (`spec.username` = `gpufed:consumer:<id>`,
which the API server takes from the certificate the request was filed with; nobody can forge it)
a review (`renewal_problems`):
- the requester: that user, in the groups `gpufed:consumers` and `system:authenticated`;
- its Tenant: it exists, is not being deleted and is Authenticated (an unpeered or refused consumer
  renews nothing);
- the request: exactly the usages and signer of the handshake, no longer than the lifetime this
  provider issues (`cert_seconds`), and `peering.handshake.verify_renewal`: the handshake's CSR
  checks (subject `CN=gpufed:consumer:<id>, O=gpufed:consumers`, ECDSA, no extensions) and the
  signature of the identity key registered in the Tenant over the renewal payload (annotation
  `gpufed.io/renewal-signature`).
Then Approved (the cluster's signer issues it) or Denied with every reason, plus a Warning Event on
the Tenant. The approval carries the reviewed object's UID and resourceVersion, so it approves
exactly what was reviewed.

Requests of anyone else (this controller's own handshake requests, kubelets, other tools) are never
touched.

Does not: sign (kube-controller-manager does), file requests (the consumer's
`peering.controllers.renewal` does), or change the Tenant.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import structlog

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import ClusterID, parse_cluster_id
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from peering import handshake
from peering.controllers.renewal import CSR_SIGNER, RENEWAL_SIGNATURE_ANNOTATION
from peering.controllers.tenant_handshake import client_csr_problems

CSR_API = "certificates.k8s.io/v1"
USER_PREFIX = handshake.consumer_user(ClusterID(""))
AUTHENTICATED = "system:authenticated"
#: The reason of an approval (the CSR's condition).
APPROVED_REASON = "GpufedRenewal"
#: The reason of a denial (the CSR's condition and the Tenant's Warning Event).
DENIED_REASON = "RenewalRefused"


def consumer_of(csr: Mapping[str, Any]) -> ClusterID | None:
    """The consumer a request was filed by (None: it was not filed by a consumer identity)."""
    user = str((csr.get("spec") or {}).get("username") or "")
    if not user.startswith(USER_PREFIX):
        return None
    try:
        return parse_cluster_id(user.removeprefix(USER_PREFIX))
    except ValueError:
        return None


def renewal_problems(
    csr: Mapping[str, Any],
    *,
    provider: ClusterID,
    consumer: ClusterID,
    tenant: Mapping[str, Any] | None,
    max_seconds: int,
) -> list[str]:
    """Why `csr` is not a genuine renewal by `consumer` (empty: it is)."""
    spec = csr.get("spec") or {}
    meta = csr.get("metadata") or {}
    problems: list[str] = []
    groups = {str(g) for g in spec.get("groups") or ()}
    if not {handshake.CONSUMER_GROUP, AUTHENTICATED} <= groups:
        problems.append(f"the requester is not in {handshake.CONSUMER_GROUP} and {AUTHENTICATED}")
    if tenant is None:
        problems.append(f"consumer {consumer} has no Tenant here")
    else:
        if (tenant.get("metadata") or {}).get("deletionTimestamp"):
            problems.append(f"the Tenant {consumer} is being deleted")
        if (tenant.get("status") or {}).get("phase") != "Authenticated":
            problems.append(f"the Tenant {consumer} is not Authenticated")
    problems += client_csr_problems(spec, max_seconds)
    if problems or tenant is None:
        return problems
    try:
        request = base64.b64decode(str(spec.get("request") or ""), validate=True)
        signature = base64.b64decode(
            str((meta.get("annotations") or {}).get(RENEWAL_SIGNATURE_ANNOTATION) or ""), validate=True
        )
    except ValueError:
        return ["the request or its signature is not valid base64"]
    verdict = handshake.verify_renewal(
        provider=provider,
        consumer=consumer,
        consumer_public_pem=str((tenant.get("spec") or {}).get("publicKey") or ""),
        signature=signature,
        csr_pem=request,
    )
    return [] if verdict.accepted else [verdict.message]


class RenewalApprover:
    """Reviews consumers' renewal requests as they appear."""

    def __init__(self, api: Any, provider: ClusterID, cert_seconds: int) -> None:
        self.api = api
        self.provider = provider
        self.cert_seconds = cert_seconds
        self._pending: set[str] = set()
        self._wake = asyncio.Event()
        self._log = structlog.get_logger().bind(cluster=provider, role="provider", kind="CertificateSigningRequest")

    @staticmethod
    def is_candidate(csr: Mapping[str, Any]) -> bool:
        decided = {c.get("type") for c in (csr.get("status") or {}).get("conditions") or []}
        return (
            (csr.get("spec") or {}).get("signerName") == CSR_SIGNER
            and consumer_of(csr) is not None
            and not decided & {"Approved", "Denied", "Failed"}
        )

    def _on_csr(self, kind: str, obj: dict[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        if kind == "DELETED" or not self.is_candidate(obj):
            self._pending.discard(name)
            return
        self._pending.add(name)
        self._wake.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                watch(
                    self.api,
                    rest.path(CSR_API, "certificatesigningrequests"),
                    self._on_csr,
                    what="consumer renewal CSRs",
                    params={"fieldSelector": f"spec.signerName={CSR_SIGNER}"},
                )
            )
            while True:
                await self._wake.wait()
                self._wake.clear()
                for name in sorted(self._pending):
                    try:
                        await self.review(name)
                        self._pending.discard(name)
                    except KubeError as e:
                        self._log.warning("cannot review renewal request; retrying", name=name, error=str(e))
                        self._wake.set()
                if self._wake.is_set():
                    await asyncio.sleep(1.0)

    async def review(self, name: str) -> None:
        """Approve or deny one request (nothing when it is not an undecided consumer request)."""
        url = rest.path(CSR_API, "certificatesigningrequests", name)
        csr = await rest.get(self.api, url)
        if csr is None or not self.is_candidate(csr):
            return
        consumer = consumer_of(csr)
        assert consumer is not None
        tenant = await rest.get(self.api, rest.path(API_VERSION, "tenants", consumer))
        problems = renewal_problems(
            csr, provider=self.provider, consumer=consumer, tenant=tenant, max_seconds=self.cert_seconds
        )
        message = "; ".join(problems) or f"consumer {consumer} renewed its client certificate with its identity key"
        cond = {
            "type": "Denied" if problems else "Approved",
            "status": "True",
            "reason": DENIED_REASON if problems else APPROVED_REASON,
            "message": message[:1024],
        }
        body = {**csr, "status": {**(csr.get("status") or {}), "conditions": [cond]}}
        await rest.request(
            self.api,
            "PUT",
            rest.path(CSR_API, "certificatesigningrequests", name, sub="approval"),
            body=body,
            what=f"{'deny' if problems else 'approve'} CSR {name}",
        )
        log = self._log.bind(remote_cluster=consumer, name=name)
        if not problems:
            log.info("client certificate renewal approved")
            return
        log.warning("client certificate renewal denied", reason=message)
        if tenant is not None:
            await events.emit(
                self.api,
                tenant,
                type_="Warning",
                reason=DENIED_REASON,
                message=f"renewal request {name} denied: {message}"[:1024],
            )


__all__ = ["DENIED_REASON", "RenewalApprover", "consumer_of", "renewal_problems"]
