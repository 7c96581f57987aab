"""PKI of one local cluster, generated with `cryptography`.

Owns: creating (once) and loading the key material a local control plane needs — the cluster CA
(whose key the controller-manager uses to sign `kubernetes.io/kube-apiserver-client` CSRs), the
apiserver serving certificate, the service-account signing key pair, the front-proxy CA and client,
the apiserver's kubelet-client certificate, the kwok kubelet-API serving certificate, metrics-server's
serving certificate (for the aggregated `metrics.k8s.io` API), Kueue's serving certificate (its
webhooks, CRD conversion and metrics, for 127.0.0.1), JobSet's serving certificate (its webhooks, for
127.0.0.1), and one client certificate per identity (admin, controller-manager, scheduler, kwok,
metrics-server, Kueue, JobSet, gpufed's controller and virtual kubelets). Every cluster gets Kueue's
and JobSet's certificates, whether or not its topology runs them.

Invariants: existing material is reused as long as it is present and valid for at least
`MIN_REMAINING`; it is never regenerated silently while a cluster using it may be running (the
launcher only calls `ensure_pki` before starting components). Private keys are written 0600 and are
never logged.

Does not: start anything, write kubeconfigs (see `kubeconfig`), or know about ports beyond the SANs
it is handed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.localenv import jobset, kueue, metricsserver

#: Lifetime of the CAs (days).
CA_DAYS = 3650
#: Lifetime of leaf certificates (days).
LEAF_DAYS = 365
#: Material closer to expiry than this is regenerated (only before a cluster starts).
MIN_REMAINING = dt.timedelta(days=7)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate's subject: user name (CN) and groups (O)."""

    file_stem: str
    user: str
    groups: tuple[str, ...] = ()


#: Identities with client certificates signed by the cluster CA. The controller-manager and the
#: scheduler use their bootstrap-RBAC user names (least privilege); admin and kwok are
#: system:masters — admin is the operator, kwok simulates every node and pod of a test cluster.
CLIENTS: tuple[ClientIdentity, ...] = (
    ClientIdentity("admin", "gpufed-local-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "system:kwok-controller", ("system:masters",)),
    ClientIdentity("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)),
    # gpufed's controller: only what deploy/rbac/controller.yaml grants the user gpufed:controller.
    ClientIdentity("gpufed-controller", "gpufed:controller"),
    # gpufed's virtual kubelets: only what deploy/rbac/virtual-kubelet.yaml grants gpufed:virtual-kubelet.
    ClientIdentity("gpufed-virtual-kubelet", "gpufed:virtual-kubelet"),
    # metrics-server, towards the apiserver and every kubelet: only what `metricsserver.manifests` grants.
    ClientIdentity(metricsserver.IDENTITY, metricsserver.USER),
    # Kueue's manager: only what upstream's manager roles grant (`kueue.rbac`).
    ClientIdentity(kueue.IDENTITY, kueue.USER),
    # JobSet's controller manager: only what upstream's manager role grants (`jobset.rbac`).
    ClientIdentity(jobset.IDENTITY, jobset.USER),
)


@dataclass(frozen=True)
class ClusterPKI:
    """Paths of one cluster's PKI files (all under `directory`)."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca_cert(self) -> Path:
        return self.path("ca.crt")

    @property
    def ca_key(self) -> Path:
        return self.path("ca.key")

    @property
    def sa_key(self) -> Path:
        return self.path("sa.key")

    @property
    def sa_pub(self) -> Path:
        return self.path("sa.pub")

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.path("front-proxy-ca.crt")

    def cert(self, stem: str) -> Path:
        return self.path(f"{stem}.crt")

    def key(self, stem: str) -> Path:
        return self.path(f"{stem}.key")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: expected an EC private key")
    return key


def _valid(cert_path: Path, key_path: Path) -> bool:
    if not (cert_path.exists() and key_path.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = _load_key(key_path)
    except ValueError:
        return False
    if cert.not_valid_after_utc - _now() < MIN_REMAINING:
        return False
    return cert.public_key() == key.public_key()


def _name(cn: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures for every certificate; certificate and CRL signing only for CAs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key (EC P-256)."""
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    cn: str,
    groups: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
    dns_names: tuple[str, ...] = (),
    ips: tuple[IPAddress, ...] = (),
    days: int = LEAF_DAYS,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Issue a leaf certificate signed by `ca_cert`; `server`/`client` set the extended key usages."""
    key = _new_key()
    now = _now()
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, groups))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


@dataclass(frozen=True)
class _LeafSpec:
    cn: str
    groups: tuple[str, ...] = ()
    server: bool = False
    client: bool = False
    dns_names: tuple[str, ...] = ()
    ips: tuple[IPAddress, ...] = ()


def _ensure_ca(pki: ClusterPKI, stem: str, cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = pki.cert(stem), pki.key(stem)
    if not _valid(cert_path, key_path):
        cert, key = make_ca(cn)
        _write_key(key_path, key)
        _write_cert(cert_path, cert)
    return x509.load_pem_x509_certificate(cert_path.read_bytes()), _load_key(key_path)


def apiserver_sans(service_cidr: str, extra_ips: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[IPAddress, ...]]:
    """DNS names and IPs the apiserver serving certificate must carry.

    The first address of the service CIDR is the in-cluster `kubernetes` Service's ClusterIP.
    """
    net = ipaddress.ip_network(service_cidr, strict=False)
    dns = (
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    ips: list[IPAddress] = [ipaddress.ip_address("127.0.0.1"), net.network_address + 1]
    ips += [ipaddress.ip_address(i) for i in extra_ips]
    return dns, tuple(dict.fromkeys(ips))


def ensure_pki(directory: Path, *, cluster: str, service_cidr: str, extra_ips: tuple[str, ...] = ()) -> ClusterPKI:
    """Create whatever is missing or about to expire in `directory`; return the paths.

    Leaf certificates are re-issued when their CA was (re)created, so a chain never breaks.
    """
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    pki = ClusterPKI(directory)
    ca_existed = _valid(pki.ca_cert, pki.ca_key)
    ca_cert, ca_key = _ensure_ca(pki, "ca", f"gpufed-local-{cluster}-ca")
    fp_existed = _valid(pki.front_proxy_ca_cert, pki.key("front-proxy-ca"))
    fp_cert, fp_key = _ensure_ca(pki, "front-proxy-ca", f"gpufed-local-{cluster}-front-proxy-ca")

    ca = (ca_cert, ca_key)
    fp = (fp_cert, fp_key)
    localhost = (ipaddress.ip_address("127.0.0.1"),)
    dns, ips = apiserver_sans(service_cidr, extra_ips)
    kueue_dns, kueue_ips = kueue.serving_sans()
    jobset_dns, jobset_ips = jobset.serving_sans()
    specs: list[tuple[str, tuple[x509.Certificate, ec.EllipticCurvePrivateKey], bool, _LeafSpec]] = [
        ("apiserver", ca, ca_existed, _LeafSpec("kube-apiserver", server=True, dns_names=dns, ips=ips)),
        (
            "kwok-serving",
            ca,
            ca_existed,
            _LeafSpec("kwok-kubelet", server=True, dns_names=("localhost",), ips=localhost),
        ),
        (
            "metrics-server-serving",
            ca,
            ca_existed,
            _LeafSpec("metrics-server", server=True, dns_names=("localhost", metricsserver.SERVICE_DNS), ips=localhost),
        ),
        (
            kueue.SERVING_STEM,
            ca,
            ca_existed,
            _LeafSpec("kueue-webhook", server=True, dns_names=kueue_dns, ips=kueue_ips),
        ),
        (
            jobset.SERVING_STEM,
            ca,
            ca_existed,
            _LeafSpec("jobset-webhook", server=True, dns_names=jobset_dns, ips=jobset_ips),
        ),
        ("front-proxy-client", fp, fp_existed, _LeafSpec("front-proxy-client", client=True)),
    ]
    specs += [(i.file_stem, ca, ca_existed, _LeafSpec(i.user, groups=i.groups, client=True)) for i in CLIENTS]
    for stem, (signer_cert, signer_key), signer_existed, spec in specs:
        if signer_existed and _valid(pki.cert(stem), pki.key(stem)):
            continue
        cert, key = issue_leaf(
            signer_cert,
            signer_key,
            cn=spec.cn,
            groups=spec.groups,
            server=spec.server,
            client=spec.client,
            dns_names=spec.dns_names,
            ips=spec.ips,
        )
        _write_key(pki.key(stem), key)
        _write_cert(pki.cert(stem), cert)

    if not (pki.sa_key.exists() and pki.sa_pub.exists()):
        sa = _new_key()
        _write_key(pki.sa_key, sa)
        pki.sa_pub.write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    return pki
