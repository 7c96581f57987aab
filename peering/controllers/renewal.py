"""The consumer's client certificates on its providers renew themselves.

Owns, per provider whose credentials Secret `gpufed/gpufed-remote-<provider>` holds a certificate
(called by the consumer role's reconcile, so per-key serialised with it):
- the schedule: a certificate is due after `renew_fraction` of the lifetime it was issued for
  (`peering.handshake.renew_at`; two thirds by default; counted from its issue, not from the
  notBefore the signer dates 5 minutes back); before that the reconcile is asked back when it
  falls due;
- the renewal: a fresh ECDSA key (kept in this process's memory only until the new certificate is
  stored), a CSR with the handshake's subject, signed with the cluster identity key
  (`peering.handshake.sign_renewal`), filed on the provider's CSR API with the current
  credentials (signer kubernetes.io/kube-apiserver-client, the lifetime the current certificate
  was issued for, so a provider that shortened its lifetime since denies the request; the
  signature in annotation `RENEWAL_SIGNATURE_ANNOTATION`); the provider's
  `peering.controllers.renewal_approval` approves it after the handshake's checks;
- collecting the certificate (polled while pending) and, when it belongs to the key made here,
  writing it into the same Secret (kubeconfig, tls.crt, tls.key), marked with the handshake
  certificate it descends from (`RENEWED_FROM_ANNOTATION`, so the consumer role keeps it as
  current). Every user of the Secret reloads it: the role's provider clients (`Remotes`, by
  resourceVersion), the virtual kubelet (`gpufed.app.virtual_kubelet.CredentialsFollower`);
- the outcome on the ForeignCluster: condition `CredentialsRenewal` (True `Renewed`, False
  `RenewalFailed`), an Event (Normal `CredentialsRenewed` / Warning `CredentialsRenewalFailed`)
  and a log line; failures are retried with capped exponential backoff and jitter.

Keys are never logged or written anywhere but the credentials Secret.

Does not: run the first handshake (`gpufed peer` and the consumer role), approve anything on the
provider, or delete the provider's CSR objects (its CSR cleaner removes issued ones after an hour).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import random
import time
from dataclasses import dataclass
from typing import Any

import structlog
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL, ClusterID
from gpufed.kube import conditions as cond
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from peering import defaults, handshake
from peering.controllers.identity import Identity

#: On a renewal CSR: the base64 Ed25519 signature of `handshake.renewal_payload`.
RENEWAL_SIGNATURE_ANNOTATION = "gpufed.io/renewal-signature"
#: On a credentials Secret holding a renewed certificate: SHA-256 (hex) of the handshake
#: certificate (the ForeignCluster's `spec.certificate`) the renewals started from.
RENEWED_FROM_ANNOTATION = "gpufed.io/renewed-from"
#: The ForeignCluster condition that reports renewals.
CONDITION = "CredentialsRenewal"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
CSR_SIGNER = "kubernetes.io/kube-apiserver-client"
CSR_USAGES = ("digital signature", "client auth")
#: The CSR API's shortest `expirationSeconds`.
MIN_EXPIRATION_S = defaults.MIN_CERT_SECONDS
#: Seconds between looks at a filed request while the provider has not issued it.
DEFAULT_POLL_S = 1.0
#: First and longest wait after a failed renewal.
DEFAULT_RETRY_S = 5.0
DEFAULT_RETRY_MAX_S = 300.0
#: A filed request not issued after this long is given up (and a new one filed after the backoff).
DEFAULT_ISSUE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RenewalSettings:
    #: Fraction of a client certificate's lifetime after which it is renewed (0-1; default 2/3).
    renew_fraction: float = handshake.DEFAULT_RENEW_FRACTION
    #: Seconds between polls of a filed request.
    poll_s: float = DEFAULT_POLL_S
    #: First and longest wait (s) after a failed attempt (doubling, with jitter).
    retry_s: float = DEFAULT_RETRY_S
    retry_max_s: float = DEFAULT_RETRY_MAX_S
    #: Seconds a filed request may stay unissued before the attempt counts as failed.
    issue_timeout_s: float = DEFAULT_ISSUE_TIMEOUT_S


@dataclass(frozen=True)
class Outcome:
    #: Seconds until the renewal wants to run again (None: nothing to schedule).
    wait: float | None
    #: The credentials Secret as a renewal just wrote it (None: unchanged).
    stored: dict[str, Any] | None = None


@dataclass
class _Attempt:
    key_pem: bytes
    csr_name: str
    started: float


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def handshake_digest(certificate_pem: str) -> str:
    """The value of `RENEWED_FROM_ANNOTATION` for a handshake certificate."""
    return hashlib.sha256(certificate_pem.strip().encode()).hexdigest()


def stored_certificate(secret: dict[str, Any]) -> x509.Certificate | None:
    """The client certificate in a credentials Secret (None when there is none or it does not load)."""
    data = (secret.get("data") or {}).get("tls.crt")
    if not data:
        return None
    try:
        return x509.load_pem_x509_certificate(base64.b64decode(data))
    except ValueError:
        return None


def _spki(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


class ClientRenewal:
    """Renews the consumer's client certificates; `reconcile` is called per provider."""

    def __init__(
        self,
        api: Any,
        identity: Identity,
        settings: RenewalSettings | None = None,
        *,
        clock: Any = None,
    ) -> None:
        self.api = api
        self.identity = identity
        self.settings = settings or RenewalSettings()
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._attempts: dict[str, _Attempt] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._log = structlog.get_logger().bind(cluster=identity.cluster_id, role="consumer")

    def forget(self, provider: str) -> None:
        """The peering is gone: drop any attempt in progress."""
        self._attempts.pop(provider, None)
        self._failures.pop(provider, None)
        self._retry_at.pop(provider, None)

    def due(self, cert: x509.Certificate) -> dt.datetime:
        """When `cert` is to be renewed: after `renew_fraction` of the lifetime it was issued for."""
        start, lifetime = handshake.issued_lifetime(cert)
        return handshake.renew_at(start, start + lifetime, self.settings.renew_fraction)

    async def reconcile(
        self,
        fc: dict[str, Any],
        provider: ClusterID,
        secret: dict[str, Any],
        remote_api: Any,
        status: dict[str, Any],
    ) -> Outcome:
        """Renew `secret`'s certificate when it is due; writes the Secret, and the outcome in `status`."""
        cert = stored_certificate(secret)
        if cert is None:
            return Outcome(None)
        now = self.clock()
        log = self._log.bind(remote_cluster=provider, kind="ForeignCluster", name=fc["metadata"]["name"])
        attempt = self._attempts.get(provider)
        if attempt is None:
            wait = (self.due(cert) - now).total_seconds()
            if wait > 0:
                return Outcome(wait)
            retry = self._retry_at.get(provider, 0.0) - time.monotonic()
            if retry > 0:
                return Outcome(retry)
        try:
            if attempt is None:
                attempt = await self._file(provider, cert, remote_api)
                self._attempts[provider] = attempt
                log.info("client certificate renewal requested", csr=attempt.csr_name)
            issued = await self._collect(attempt, remote_api)
            if issued is None:
                if time.monotonic() - attempt.started > self.settings.issue_timeout_s:
                    raise RenewalError(f"the provider did not issue request {attempt.csr_name} in time")
                return Outcome(self.settings.poll_s)
            stored = await self._store(fc, provider, secret, attempt, issued)
            new = issued
        except (RenewalError, KubeError) as e:
            return Outcome(await self._failed(fc, provider, cert, status, log, str(e)))
        self._attempts.pop(provider, None)
        self._failures.pop(provider, None)
        self._retry_at.pop(provider, None)
        msg = (
            f"client certificate renewed (serial {new.serial_number:x}), valid until "
            f"{new.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}; the previous one is no longer used"
        )
        status["conditions"] = cond.mark(status["conditions"], CONDITION, True, "Renewed", msg)
        log.info(
            "client certificate renewed", serial=f"{new.serial_number:x}", expires=new.not_valid_after_utc.isoformat()
        )
        await events.emit(self.api, fc, type_="Normal", reason="CredentialsRenewed", message=msg)
        return Outcome(max((self.due(new) - self.clock()).total_seconds(), self.settings.poll_s), stored)

    async def _failed(
        self, fc: dict[str, Any], provider: str, cert: x509.Certificate, status: dict[str, Any], log: Any, why: str
    ) -> float:
        self._attempts.pop(provider, None)
        n = self._failures[provider] = self._failures.get(provider, 0) + 1
        jitter = random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not crypto
        delay = min(self.settings.retry_max_s, self.settings.retry_s * 2.0 ** (n - 1)) * jitter
        self._retry_at[provider] = time.monotonic() + delay
        left = (cert.not_valid_after_utc - self.clock()).total_seconds()
        msg = (
            f"renewing the client certificate failed (attempt {n}; next in {delay:.0f} s; the current one "
            f"expires in {max(left, 0):.0f} s): {why}"
        )[:1000]
        status["conditions"] = cond.mark(status["conditions"], CONDITION, False, "RenewalFailed", msg)
        log.warning("client certificate renewal failed", attempt=n, retry_s=round(delay, 1), error=why[:500])
        await events.emit(self.api, fc, type_="Warning", reason="CredentialsRenewalFailed", message=msg)
        return delay

    async def _file(self, provider: ClusterID, cert: x509.Certificate, remote_api: Any) -> _Attempt:
        key = ec.generate_private_key(ec.SECP256R1())
        csr = handshake.make_csr(self.identity.cluster_id, key)
        signature = handshake.sign_renewal(self.identity.private_key, provider, self.identity.cluster_id, csr)
        lifetime = handshake.issued_lifetime(cert)[1].total_seconds()
        consumer = self.identity.cluster_id
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {
                "generateName": f"gpufed-renew-{consumer}-",
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
                "annotations": {RENEWAL_SIGNATURE_ANNOTATION: _b64(signature)},
            },
            "spec": {
                "request": _b64(csr),
                "signerName": CSR_SIGNER,
                "expirationSeconds": max(MIN_EXPIRATION_S, round(lifetime)),
                "usages": list(CSR_USAGES),
            },
        }
        created = await rest.request(remote_api, "POST", CSR_PATH, body=body, what="file a renewal CSR")
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return _Attempt(key_pem, str(created["metadata"]["name"]), time.monotonic())

    async def _collect(self, attempt: _Attempt, remote_api: Any) -> x509.Certificate | None:
        csr = await rest.get(remote_api, f"{CSR_PATH}/{attempt.csr_name}")
        if csr is None:
            raise RenewalError(f"the renewal request {attempt.csr_name} disappeared before it was issued")
        cst = csr.get("status") or {}
        for c in cst.get("conditions") or []:
            if c.get("type") in ("Denied", "Failed"):
                raise RenewalError(
                    f"the provider {str(c.get('type')).lower()} request {attempt.csr_name}: {c.get('message', '')}"
                )
        if not cst.get("certificate"):
            return None
        try:
            cert = x509.load_pem_x509_certificate(base64.b64decode(cst["certificate"]))
        except ValueError as e:
            raise RenewalError(f"the issued certificate does not load: {e}") from None
        key = serialization.load_pem_private_key(attempt.key_pem, password=None)
        if _spki(cert.public_key()) != _spki(key.public_key()):
            raise RenewalError("the issued certificate does not belong to the key made for it")
        return cert

    async def _store(
        self, fc: dict[str, Any], provider: str, secret: dict[str, Any], attempt: _Attempt, cert: x509.Certificate
    ) -> dict[str, Any]:
        data = secret.get("data") or {}
        try:
            kubeconfig = yaml.safe_load(base64.b64decode(data.get("kubeconfig", "")))
            users = kubeconfig["users"]
        except (ValueError, yaml.YAMLError, KeyError, TypeError) as e:
            raise RenewalError(f"the stored kubeconfig does not load: {type(e).__name__}") from None
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        for u in users:
            user = u.get("user") or {}
            user["client-certificate-data"] = _b64(cert_pem)
            user["client-key-data"] = _b64(attempt.key_pem)
            u["user"] = user
        spec_cert = str((fc.get("spec") or {}).get("certificate") or "")
        annotations = dict((secret.get("metadata") or {}).get("annotations") or {})
        annotations[RENEWED_FROM_ANNOTATION] = handshake_digest(spec_cert)
        meta = secret["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": secret.get("type") or "Opaque",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": meta.get("labels") or {},
                "annotations": annotations,
                "ownerReferences": meta.get("ownerReferences") or [],
            },
            "data": {
                **data,
                "kubeconfig": _b64(yaml.safe_dump(kubeconfig)),
                "tls.crt": _b64(cert_pem),
                "tls.key": _b64(attempt.key_pem),
            },
        }
        return await rest.apply(self.api, rest.path("v1", "secrets", meta["name"], namespace=meta["namespace"]), body)


class RenewalError(Exception):
    """A renewal attempt failed (the message says why; it names no key)."""


__all__ = [
    "CONDITION",
    "RENEWAL_SIGNATURE_ANNOTATION",
    "RENEWED_FROM_ANNOTATION",
    "ClientRenewal",
    "Outcome",
    "RenewalError",
    "RenewalSettings",
    "handshake_digest",
    "stored_certificate",
]
