"""Serving certificates gpufed's own servers issue themselves, kept in a Secret.

Owns, for one server reachable at one host (the offloading webhook, the capacity estimator): a
fresh CA and a serving certificate for the host (IP SAN for an address, else DNS SAN); whether
stored material can be used (it loads, the key belongs to the certificate, the certificate names
the host and is not due for renewal); and `ensure`, which reuses the material of a Secret when it
is usable, else issues new material and stores it there with server-side apply (`ca.crt`,
`tls.crt`, `tls.key`). Clients trust the CA, which they get through a channel they already trust
(the webhook configuration's caBundle, the estimator's ConfigMap read through the API).

Does not: serve, publish the CA, or decide when to look again (the servers do). Keys are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import ipaddress
from dataclasses import dataclass
from typing import Any

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.kube import rest
from gpufed.kube.client import KubeError

#: Lifetime of issued certificates (days) and how long before expiry they are replaced.
DEFAULT_CERT_DAYS = 365
DEFAULT_RENEW_BEFORE = dt.timedelta(days=30)
_MANAGED_BY = {"app.kubernetes.io/managed-by": "gpufed"}
_KEYS = ("ca.crt", "tls.crt", "tls.key")


@dataclass(frozen=True)
class TLSMaterial:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def not_after(self) -> dt.datetime:
        return x509.load_pem_x509_certificate(self.cert_pem).not_valid_after_utc


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def issue(
    host: str, days: int = DEFAULT_CERT_DAYS, now: dt.datetime | None = None, *, ca_name: str = "gpufed-ca"
) -> TLSMaterial:
    """A fresh CA and a serving certificate for `host` signed by it."""
    now = now or dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host)) if _is_ip(host) else x509.DNSName(host)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return TLSMaterial(
        ca.public_bytes(pem),
        cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def usable(material: TLSMaterial, host: str, renew_before: dt.timedelta, now: dt.datetime | None = None) -> bool:
    """Whether stored material loads, its key belongs to its certificate, the certificate names
    `host` and is not due for renewal."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        cert = x509.load_pem_x509_certificate(material.cert_pem)
        x509.load_pem_x509_certificate(material.ca_pem)
        key = serialization.load_pem_private_key(material.key_pem, password=None)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound):
        return False
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        return False
    if _is_ip(host):
        covered = ipaddress.ip_address(host) in names.get_values_for_type(x509.IPAddress)
    else:
        covered = host in names.get_values_for_type(x509.DNSName)
    return covered and cert.not_valid_after_utc - now > renew_before


async def ensure(
    api: Any,
    namespace: str,
    secret: str,
    host: str,
    *,
    days: int = DEFAULT_CERT_DAYS,
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE,
    ca_name: str = "gpufed-ca",
) -> tuple[TLSMaterial, bool]:
    """The Secret's material when usable, else newly issued and stored there; (material, whether new).

    Safe for replicas racing: the Secret is created (409: another replica did, use its material) or
    replaced with the read resourceVersion (409: re-read), so every replica ends up serving what the
    Secret holds."""
    path_ = rest.path("v1", "secrets", secret, namespace=namespace)
    for _attempt in range(5):
        existing = await rest.get(api, path_)
        data = (existing or {}).get("data") or {}
        if set(_KEYS) <= data.keys():
            try:
                stored = TLSMaterial(*(base64.b64decode(data[k]) for k in _KEYS))
            except (binascii.Error, ValueError):
                stored = TLSMaterial(b"", b"", b"")
            if usable(stored, host, renew_before):
                return stored, False
        material = await asyncio.to_thread(issue, host, days, ca_name=ca_name)
        encoded = (material.ca_pem, material.cert_pem, material.key_pem)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace, "labels": dict(_MANAGED_BY)},
            "data": {k: base64.b64encode(v).decode() for k, v in zip(_KEYS, encoded, strict=True)},
        }
        try:
            if existing is None:
                await rest.create(api, rest.path("v1", "secrets", namespace=namespace), body)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                await rest.request(api, "PUT", path_, body=body, what=f"renew serving certificate {namespace}/{secret}")
        except KubeError as e:
            if e.status == 409:  # another replica wrote it first: use what it stored
                continue
            raise
        break
    else:
        raise KubeError(f"serving certificate {namespace}/{secret}: kept conflicting with other writers")
    structlog.get_logger().info(
        "serving certificate issued", secret=f"{namespace}/{secret}", host=host, not_after=str(material.not_after)
    )
    return material, True
