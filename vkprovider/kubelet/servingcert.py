"""The TLS identity of a virtual node's kubelet API: serving certificate, client CA, rotation.

Owns:
- `ServingTLS`: one `ssl.SSLContext` for the server whose certificate and client CA are replaced
  in place while it runs (new handshakes get the new ones; rotation needs no restart and never
  drops open streams);
- the serving certificate, from one of two sources (`ServingCertSettings.source`):
  * `csr` (default) — like a kubelet with serverTLSBootstrap: a fresh EC P-256 key that never
    leaves the process, a CertificateSigningRequest with signer `kubernetes.io/kubelet-serving`
    (CN `system:node:<node>`, O `system:nodes`, the node's address as IP SAN, usages digital
    signature + server auth) approved by gpufed's controller (see `csrapprove`) and signed by the
    cluster's signer, so API servers that verify kubelet certificates (`--kubelet-certificate-
    authority`) accept it. The CSR is deleted once the certificate is read. Renewal starts at
    `ServingCertSettings.renew_fraction` of the lifetime (default 80 %, the kubelet's rule); a
    failed renewal is retried with backoff while the old certificate keeps serving, and a renewed
    certificate replaces the old one in place;
  * `files` — a certificate and key an operator provides (cert-manager, a corporate CA), re-read
    when the files change;
- the client CA: `client-ca-file` of ConfigMap `kube-system/extension-apiserver-authentication`
  (what the API server itself trusts for client certificates, including its own kubelet-client
  certificate), re-read periodically. Client certificates are optional (bearer tokens work too),
  but one that is presented must verify.
- `serving_csr_problems`: the pure check the approver applies to a CSR's content;
- the validity of the certificate being served as `gpufed_credential_expiry_timestamp_seconds` /
  `gpufed_credential_issued_timestamp_seconds{remote_cluster=<node>,kind="serving"}` (`peering.expiry`),
  dropped when the manager stops.

Does not: approve CSRs (the controller does), authenticate requests (`auth`), or log keys.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from peering import expiry, handshake

SIGNER = "kubernetes.io/kubelet-serving"
NODES_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"
CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
CSR_USAGES = ("digital signature", "server auth")
#: Fraction of the lifetime after which the certificate is renewed (kubelet: 70-90 %).
RENEW_AT = 0.8


@dataclass(frozen=True)
class ServingCertSettings:
    #: "csr" (signed by the cluster through a CSR) or "files".
    source: str = "csr"
    cert_file: Path | None = None
    key_file: Path | None = None
    #: Requested lifetime of CSR-issued certificates, seconds (the signer may shorten it; min 600).
    lifetime_s: int = 7 * 24 * 3600
    #: Seconds to wait for the CSR to be approved and signed before giving up this attempt.
    issue_timeout_s: float = 120.0
    #: Seconds between re-reads of the client CA (and of the certificate files).
    reload_s: float = 60.0
    #: Longest wait between failed renewal attempts.
    max_retry_s: float = 60.0
    #: Fraction of a CSR-issued certificate's lifetime after which it is renewed (0-1; default 0.8).
    renew_fraction: float = RENEW_AT

    def __post_init__(self) -> None:
        if not 0 < self.renew_fraction < 1:
            raise ValueError(
                f"the serving certificate's renew fraction must lie between 0 and 1, not {self.renew_fraction}"
            )


class ServingCertError(GpufedError):
    """The serving certificate could not be obtained; the message says why (e.g. CSR denied)."""


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def cert_lifetime(pem: bytes) -> tuple[dt.datetime, dt.datetime]:
    cert = x509.load_pem_x509_certificate(pem)
    return _utc(cert.not_valid_before_utc), _utc(cert.not_valid_after_utc)


def renew_time(pem: bytes, fraction: float = RENEW_AT) -> dt.datetime:
    """When the certificate `pem` is due for renewal: after `fraction` (0 < fraction < 1) of the
    lifetime it was issued for (a CSR signer's backdated notBefore is not counted: with it, a
    10-minute certificate would be due at once at a small fraction)."""
    start, lifetime = handshake.issued_lifetime(x509.load_pem_x509_certificate(pem))
    return handshake.renew_at(start, start + lifetime, fraction)


def new_key_and_csr(node: str, address: str) -> tuple[bytes, bytes]:
    """(private key PEM, CSR PEM) for a kubelet-serving certificate of `node` at `address`."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(node)]
    try:
        sans.append(x509.IPAddress(ipaddress.ip_address(address)))
    except ValueError:
        sans.append(x509.DNSName(address))
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP),
                    x509.NameAttribute(NameOID.COMMON_NAME, NODE_PREFIX + node),
                ]
            )
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def serving_csr_problems(csr_pem: bytes, usages: list[str], node: str, addresses: set[str]) -> list[str]:
    """Why a kubelet-serving CSR for `node` must not be approved (empty: fine).

    Exactly what `new_key_and_csr` and `issue` file: subject `O=system:nodes, CN=system:node:<node>`
    and nothing else, an EC or RSA key, a subject-alternative-name extension (the only extension)
    naming the node and its own addresses only, and the usages `CSR_USAGES`, no more, no fewer."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        return [f"not a PEM certificate request: {e}"]
    problems: list[str] = []
    try:
        if not csr.is_signature_valid:
            problems.append("the request's signature is invalid")
        if not isinstance(csr.public_key(), (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
            problems.append("the request's key must be an EC or RSA key")
        cns = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        orgs = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        if cns != [NODE_PREFIX + node]:
            problems.append(f"common name must be {NODE_PREFIX}{node}, not {cns}")
        if orgs != [NODES_GROUP]:
            problems.append(f"organization must be [{NODES_GROUP}], not {orgs}")
        if len(csr.subject) != len(cns) + len(orgs):
            problems.append(f"the subject must hold only CN and O, not {csr.subject.rfc4514_string()!r}")
        others = [e.oid.dotted_string for e in csr.extensions if not isinstance(e.value, x509.SubjectAlternativeName)]
        if others:
            problems.append(f"extensions other than subject alternative names are refused ({', '.join(others)})")
        try:
            san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            problems.append("no subject alternative names")
        else:
            if len(list(san)) != len(san.get_values_for_type(x509.IPAddress)) + len(
                san.get_values_for_type(x509.DNSName)
            ):
                problems.append("only DNS names and IP addresses are allowed as subject alternative names")
            ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
            dns = set(san.get_values_for_type(x509.DNSName))
            if not ips <= addresses:
                problems.append(f"IP addresses {sorted(ips - addresses)} are not the node's")
            if not dns <= addresses | {node}:
                problems.append(f"DNS names {sorted(dns - addresses - {node})} are not the node's")
    except (ValueError, UnsupportedAlgorithm, x509.InvalidVersion) as e:
        # A CSR is parsed lazily: a malformed part surfaces only when it is read.
        problems.append(f"the request is malformed ({e})")
    if sorted(usages) != sorted(CSR_USAGES) or len(set(usages)) != len(usages):
        problems.append(f"usages must be exactly {list(CSR_USAGES)}, not {usages}")
    return problems


def _ext_usage_ok(pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return ExtendedKeyUsageOID.SERVER_AUTH in eku


def _load_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` reads files only: a private temporary directory (0700, key 0600), removed at once."""
    with tempfile.TemporaryDirectory(prefix="gpufed-tls-") as d:
        cert_path, key_path = Path(d) / "tls.crt", Path(d) / "tls.key"
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        cert_path.write_bytes(cert_pem)
        ctx.load_cert_chain(cert_path, key_path)


class ServingTLS:
    """A server SSLContext whose certificate and client CA are replaced in place while it serves.

    OpenSSL copies the context's certificate into each new connection, so a replacement applies to
    the handshakes that follow and leaves open connections alone. Client CAs accumulate (a CA
    rotation adds the new one; dropping the old one takes a restart).
    """

    def __init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_alpn_protocols(["http/1.1"])
        self.context.verify_mode = ssl.CERT_NONE
        self.cert_pem = b""
        self.client_ca_pem = b""
        self.ready = asyncio.Event()

    def update(
        self, *, cert_pem: bytes | None = None, key_pem: bytes | None = None, client_ca: bytes | None = None
    ) -> None:
        """Install a new certificate + key and/or client CA for the handshakes that follow."""
        if cert_pem is not None and key_pem is not None:
            _load_chain(self.context, cert_pem, key_pem)
            self.cert_pem = cert_pem
            self.ready.set()
        if client_ca is not None:
            self.context.load_verify_locations(cadata=client_ca.decode())
            # Optional: bearer-token clients (metrics-server, Prometheus) present no certificate;
            # one that is presented must verify.
            self.context.verify_mode = ssl.CERT_OPTIONAL
            self.client_ca_pem = client_ca


class ServingCertManager:
    """Keeps `tls` supplied with a valid serving certificate and the current client CA."""

    def __init__(
        self,
        api: Any,
        node: str,
        address: str,
        tls: ServingTLS,
        settings: ServingCertSettings | None = None,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.api = api
        self.node = node
        self.address = address
        self.tls = tls
        self.settings = settings or ServingCertSettings()
        self.clock = clock
        self._log = structlog.get_logger().bind(node=node)
        self._files_mtime: tuple[float, float] = (0.0, 0.0)

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._client_ca_loop())
                if self.settings.source == "files":
                    tg.create_task(self._files_loop())
                else:
                    tg.create_task(self._csr_loop())
        finally:
            expiry.drop(self.node, expiry.SERVING)

    def _install(self, cert: bytes, key: bytes) -> None:
        """Serve `cert` from the next handshake on, and publish its validity (`peering.expiry`)."""
        self.tls.update(cert_pem=cert, key_pem=key)
        with contextlib.suppress(ValueError):
            expiry.export(self.node, expiry.SERVING, x509.load_pem_x509_certificate(cert))

    # ---- client CA

    async def client_ca(self) -> bytes:
        ns, name = CLIENT_CA_CONFIGMAP
        cm = await rest.get(self.api, rest.path("v1", "configmaps", name, namespace=ns))
        ca = ((cm or {}).get("data") or {}).get("client-ca-file", "")
        if not ca:
            raise ServingCertError(f"ConfigMap {ns}/{name} has no client-ca-file")
        return str(ca).encode()

    async def _client_ca_loop(self) -> None:
        while True:
            try:
                ca = await self.client_ca()
                if ca != self.tls.client_ca_pem:
                    self.tls.update(client_ca=ca)
                    self._log.info("kubelet API client CA loaded")
            except (KubeError, ServingCertError, ssl.SSLError) as e:
                self._log.warning("cannot read the client CA; client certificates are not accepted", error=str(e))
            await asyncio.sleep(self.settings.reload_s)

    # ---- files

    async def _files_loop(self) -> None:
        cert_file, key_file = self.settings.cert_file, self.settings.key_file
        if cert_file is None or key_file is None:
            raise ServingCertError("serving certificate source 'files' needs a certificate and a key file")
        while True:
            try:
                mtimes = (cert_file.stat().st_mtime, key_file.stat().st_mtime)
                if mtimes != self._files_mtime:
                    cert, key = (
                        await asyncio.to_thread(cert_file.read_bytes),
                        await asyncio.to_thread(key_file.read_bytes),
                    )
                    self._install(cert, key)
                    self._files_mtime = mtimes
                    self._log.info(
                        "serving certificate loaded", file=str(cert_file), expires=str(cert_lifetime(cert)[1])
                    )
            except (OSError, ValueError, ssl.SSLError) as e:
                self._log.error("cannot load the serving certificate files", error=str(e))
            await asyncio.sleep(self.settings.reload_s)

    # ---- CSR

    async def _csr_loop(self) -> None:
        delay = 1.0
        while True:
            pem = self.tls.cert_pem
            if pem:
                wait = (renew_time(pem, self.settings.renew_fraction) - self.clock()).total_seconds()
                if wait > 0:
                    await asyncio.sleep(min(wait, 3600.0))
                    continue
            try:
                cert, key = await self.issue()
            except (KubeError, ServingCertError) as e:
                self._log.warning("serving certificate not issued; retrying", error=str(e), retry_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.max_retry_s)
                continue
            delay = 1.0
            self._install(cert, key)
            _start, end = cert_lifetime(cert)
            renews = renew_time(cert, self.settings.renew_fraction)
            serial = f"{x509.load_pem_x509_certificate(cert).serial_number:x}"
            self._log.info(
                "serving certificate installed", serial=serial, expires=end.isoformat(), renews=renews.isoformat()
            )

    async def issue(self) -> tuple[bytes, bytes]:
        """One CSR round: create, wait for approval and signature, read, delete."""
        key_pem, csr_pem = await asyncio.to_thread(new_key_and_csr, self.node, self.address)
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"generateName": f"gpufed-{self.node}-", "labels": {"gpufed.io/virtual-node": self.node}},
            "spec": {
                "request": base64.b64encode(csr_pem).decode(),
                "signerName": SIGNER,
                "usages": list(CSR_USAGES),
                "expirationSeconds": max(600, self.settings.lifetime_s),
            },
        }
        created = await rest.request(
            self.api, "POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", body=body, what="create CSR"
        )
        name = created["metadata"]["name"]
        url = rest.path("certificates.k8s.io/v1", "certificatesigningrequests", name)
        self._log.info("serving certificate requested", csr=name, signer=SIGNER)
        try:
            async with asyncio.timeout(self.settings.issue_timeout_s):
                while True:
                    csr = await rest.get(self.api, url)
                    if csr is None:
                        raise ServingCertError(f"CSR {name} was deleted before it was signed")
                    status = csr.get("status") or {}
                    for cond in status.get("conditions") or []:
                        if cond.get("type") in ("Denied", "Failed") and cond.get("status", "True") == "True":
                            why = f"{cond.get('reason', '')} {cond.get('message', '')}".strip()
                            raise ServingCertError(f"CSR {name} {cond['type'].lower()}: {why}")
                    if status.get("certificate"):
                        cert = base64.b64decode(status["certificate"])
                        if not _ext_usage_ok(cert):
                            raise ServingCertError(f"CSR {name}: the signed certificate is not for server auth")
                        return cert, key_pem
                    await asyncio.sleep(1.0)
        except TimeoutError:
            raise ServingCertError(
                f"CSR {name} not approved and signed within {self.settings.issue_timeout_s:.0f}s"
                " (is `gpufed controller` running, and does the cluster sign kubelet-serving certificates?)"
            ) from None
        finally:
            with contextlib.suppress(KubeError):
                await rest.delete(self.api, url)
