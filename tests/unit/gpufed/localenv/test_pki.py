"""Local cluster PKI: chains, SANs, identities, file modes, idempotence and renewal."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.localenv import pki as pkimod
from gpufed.localenv.pki import CLIENTS, ensure_pki


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _signed_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    return tmp_path / "pki"


def test_every_leaf_chains_to_its_ca(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    ca = _cert(p.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for stem in ["apiserver", "kwok-serving", "metrics-server-serving", *(c.file_stem for c in CLIENTS)]:
        assert _signed_by(_cert(p.cert(stem)), ca), stem
    assert _signed_by(_cert(p.cert("front-proxy-client")), _cert(p.front_proxy_ca_cert))
    assert not _signed_by(_cert(p.cert("front-proxy-client")), ca)


def test_apiserver_serving_cert_sans(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.100.0.0/16", extra_ips=("192.0.2.7",))
    cert = _cert(p.cert("apiserver"))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = set(san.get_values_for_type(x509.IPAddress))
    assert {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.100.0.1"),
        ipaddress.ip_address("192.0.2.7"),
    } <= ips
    assert "kubernetes.default.svc.cluster.local" in san.get_values_for_type(x509.DNSName)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku and ExtendedKeyUsageOID.CLIENT_AUTH not in eku


@pytest.mark.parametrize(
    ("stem", "dns"),
    [
        # kwok's kubelet API: apiserver (exec/logs) and metrics-server dial the nodes' InternalIP 127.0.0.1.
        ("kwok-serving", {"localhost"}),
        # metrics-server: dialled at 127.0.0.1 and verified by the aggregator as <service>.<namespace>.svc.
        ("metrics-server-serving", {"localhost", "metrics-server.kube-system.svc"}),
        # Kueue's webhooks and CRD conversion: the apiserver calls https://127.0.0.1:<port> by URL.
        ("kueue-serving", {"localhost"}),
    ],
)
def test_serving_certs_match_how_they_are_reached(pki_dir: Path, stem: str, dns: set[str]) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    cert = _cert(p.cert(stem))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("127.0.0.1")}
    assert set(san.get_values_for_type(x509.DNSName)) == dns
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]


def test_metrics_server_is_not_a_cluster_admin(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    cert = _cert(p.cert("metrics-server"))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:metrics-server"
    assert not cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME), "RBAC grants it what it needs"


@pytest.mark.parametrize("ident", CLIENTS, ids=lambda c: c.file_stem)
def test_client_identities(pki_dir: Path, ident: pkimod.ClientIdentity) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    cert = _cert(p.cert(ident.file_stem))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == ident.user
    groups = tuple(a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    assert groups == ident.groups
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_scheduler_and_controller_manager_are_not_cluster_admins(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    for stem in ("scheduler", "controller-manager"):
        cert = _cert(p.cert(stem))
        assert not cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME), stem


def test_private_keys_are_owner_only(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    keys = list(pki_dir.glob("*.key"))
    assert p.ca_key in keys and p.sa_key in keys and len(keys) >= 9
    for k in keys:
        assert stat.S_IMODE(k.stat().st_mode) == 0o600, k
    assert stat.S_IMODE(pki_dir.stat().st_mode) == 0o700


def test_second_call_changes_nothing(pki_dir: Path) -> None:
    ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    before = {f.name: f.read_bytes() for f in pki_dir.iterdir()}
    ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    after = {f.name: f.read_bytes() for f in pki_dir.iterdir()}
    assert before == after


def test_leaf_close_to_expiry_is_reissued_alone(pki_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    ca_before = p.ca_cert.read_bytes()
    admin_before = p.cert("admin").read_bytes()
    real_now = pkimod._now
    # Pretend a year went by: leaves (365 d) are about to expire, the CA (10 y) is not.
    monkeypatch.setattr(pkimod, "_now", lambda: real_now() + dt.timedelta(days=360))
    ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    assert p.ca_cert.read_bytes() == ca_before
    assert p.cert("admin").read_bytes() != admin_before
    assert _signed_by(_cert(p.cert("admin")), _cert(p.ca_cert))


def test_lost_ca_reissues_every_leaf(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    p.ca_key.unlink()
    ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    ca = _cert(p.ca_cert)
    for stem in ["apiserver", *(c.file_stem for c in CLIENTS)]:
        assert _signed_by(_cert(p.cert(stem)), ca), stem


def test_mismatched_key_is_detected(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    p.key("admin").write_bytes(p.key("scheduler").read_bytes())
    ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    cert_pub = _cert(p.cert("admin")).public_key()
    key = pkimod._load_key(p.key("admin"))
    assert cert_pub == key.public_key()


def test_kueue_is_a_plain_user_bound_only_by_its_roles(pki_dir: Path) -> None:
    p = ensure_pki(pki_dir, cluster="c1", service_cidr="10.96.0.0/16")
    cert = _cert(p.cert("kueue"))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:kueue"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME) == []
    assert _signed_by(cert, _cert(p.ca_cert)) and _signed_by(_cert(p.cert("kueue-serving")), _cert(p.ca_cert))
