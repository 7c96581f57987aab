"""Client certificate renewal: when it is due (`handshake.renew_at`), what the provider accepts
(`handshake.verify_renewal`, `renewal_approval`), and the consumer's whole round
(`renewal.ClientRenewal`: file, approved by the provider's reviewer, issued, stored in the same
Secret, reported; failures retried with backoff and reported), plus the expiry metric. Against two
in-memory API servers (the consumer's and the provider's); the test plays the provider's signer."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
import structlog
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID
from prometheus_client import REGISTRY

from gpufed.apis.meta import API_VERSION
from gpufed.apis.peering import ForeignClusterSpec
from gpufed.apis.wire import PROVIDER_LABEL, SYSTEM_NAMESPACE, ClusterID, remote_kubeconfig_secret
from peering import expiry, handshake
from peering.controllers.consumer import SERVER_ANNOTATION, ConsumerRole, kubeconfig_for
from peering.controllers.identity import Identity
from peering.controllers.renewal import (
    CONDITION,
    RENEWAL_SIGNATURE_ANNOTATION,
    RENEWED_FROM_ANNOTATION,
    ClientRenewal,
    RenewalSettings,
    handshake_digest,
)
from peering.controllers.renewal_approval import RenewalApprover, renewal_problems
from tests.unit.fakes import FakeApiServer, serve

CONSUMER = ClusterID("cons-renew-0001")
PROVIDER = ClusterID("prov-renew-0001")
SECRET = remote_kubeconfig_secret(PROVIDER)
LIFETIME = dt.timedelta(seconds=600)
CA_KEY = ec.generate_private_key(ec.SECP256R1())
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "provider-ca")])


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _issue(public_key: Any, not_before: dt.datetime, lifetime: dt.timedelta = LIFETIME) -> x509.Certificate:
    """What the provider's signer issues for a consumer's key."""
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, handshake.CONSUMER_GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, handshake.consumer_user(CONSUMER)),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(CA_NAME)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + lifetime)
        .sign(CA_KEY, hashes.SHA256())
    )


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def _peered(consumer: FakeApiServer, provider: FakeApiServer, identity: Identity, issued: dt.datetime) -> None:
    """A finished handshake: the ForeignCluster with its certificate, the credentials Secret, and the
    provider's Authenticated Tenant with the consumer's identity key."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _pem(_issue(key.public_key(), issued))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    consumer.create(
        "foreignclusters",
        {
            "kind": "ForeignCluster",
            "metadata": {"name": PROVIDER},
            "spec": {"clusterId": PROVIDER, "certificate": cert},
        },
        api_version=API_VERSION,
    )
    cfg = kubeconfig_for(PROVIDER, "https://provider.example:6443", "CA", cert, key_pem, "u")
    consumer.create(
        "secrets",
        {
            "metadata": {"name": SECRET, "namespace": SYSTEM_NAMESPACE, "labels": {PROVIDER_LABEL: PROVIDER}},
            "data": {"kubeconfig": _b64(yaml.safe_dump(cfg)), "tls.crt": _b64(cert), "tls.key": _b64(key_pem)},
        },
    )
    provider.create(
        "tenants",
        {
            "kind": "Tenant",
            "metadata": {"name": CONSUMER},
            "spec": {"consumerClusterId": CONSUMER, "publicKey": identity.public_pem},
            "status": {"phase": "Authenticated"},
        },
        api_version=API_VERSION,
    )


def _identity() -> Identity:
    key = Ed25519PrivateKey.generate()
    return Identity(CONSUMER, handshake.public_key_pem(key), key)


def _as_filed_by(provider: FakeApiServer, name: str, user: str = "", groups: tuple[str, ...] = ()) -> None:
    """What the API server records on a request: who filed it."""
    user = user or handshake.consumer_user(CONSUMER)
    groups = groups or (handshake.CONSUMER_GROUP, "system:authenticated")

    def filed(csr: dict[str, Any]) -> None:
        csr["spec"]["username"], csr["spec"]["groups"] = user, list(groups)

    provider.update("certificatesigningrequests", "", name, filed)


def _sign_approved(provider: FakeApiServer, name: str, now: dt.datetime) -> None:
    """The provider's signer: issues an approved request."""
    csr = provider.get("certificatesigningrequests", "", name)
    assert csr is not None
    types = {c["type"] for c in (csr.get("status") or {}).get("conditions") or []}
    assert types == {"Approved"}, f"{name} was not approved: {csr.get('status')}"
    request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
    cert = _pem(_issue(request.public_key(), now))

    def issue(obj: dict[str, Any]) -> None:
        obj["status"]["certificate"] = _b64(cert)

    provider.update("certificatesigningrequests", "", name, issue)


def _secret(server: FakeApiServer) -> dict[str, Any]:
    s = server.get("secrets", SYSTEM_NAMESPACE, SECRET)
    assert s is not None
    return s


def _cert_of(secret: dict[str, Any]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))


# ---------------------------------------------------------------- pure decisions


def test_renewal_is_due_after_the_fraction_of_the_lifetime() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    end = start + dt.timedelta(days=90)
    assert handshake.renew_at(start, end) == start + dt.timedelta(days=60)
    assert handshake.renew_at(start, start + LIFETIME, 0.1) == start + dt.timedelta(seconds=60)
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            handshake.renew_at(start, end, bad)


def test_a_renewal_signature_verifies_only_for_its_provider_key_and_protocol() -> None:
    identity = _identity()
    csr = handshake.make_csr(CONSUMER, ec.generate_private_key(ec.SECP256R1()))
    sig = handshake.sign_renewal(identity.private_key, PROVIDER, CONSUMER, csr)

    def verdict(**kw: Any) -> handshake.Verdict:
        args: dict[str, Any] = {
            "provider": PROVIDER,
            "consumer": CONSUMER,
            "consumer_public_pem": identity.public_pem,
            "signature": sig,
            "csr_pem": csr,
        }
        return handshake.verify_renewal(**{**args, **kw})

    assert verdict().accepted
    assert verdict(provider=ClusterID("prov-other-0001")).reason == handshake.Refusal.BAD_SIGNATURE
    other = handshake.public_key_pem(Ed25519PrivateKey.generate())
    assert verdict(consumer_public_pem=other).reason == handshake.Refusal.BAD_SIGNATURE
    # A handshake signature over the same CSR is not a renewal signature.
    ch = handshake.issue_challenge(PROVIDER, CONSUMER, b"n" * 32, dt.datetime.now(dt.UTC))
    assert verdict(signature=handshake.sign(identity.private_key, ch, csr)).reason == handshake.Refusal.BAD_SIGNATURE
    foreign = handshake.make_csr(ClusterID("cons-other-0001"), ec.generate_private_key(ec.SECP256R1()))
    assert verdict(csr_pem=foreign).reason == handshake.Refusal.BAD_CSR


# ---------------------------------------------------------------- the round trip


async def test_a_due_certificate_is_renewed_approved_stored_and_reported() -> None:
    identity = _identity()
    issued = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=30)
    clock = Clock(issued + dt.timedelta(seconds=59))
    async with serve() as (consumer, api), serve() as (provider, remote):
        _peered(consumer, provider, identity, issued)
        renewal = ClientRenewal(api, identity, RenewalSettings(renew_fraction=0.1), clock=clock)
        approver = RenewalApprover(remote, PROVIDER, cert_seconds=600)
        fc = consumer.get("foreignclusters", "", PROVIDER)
        assert fc is not None
        status: dict[str, Any] = {"conditions": []}

        # Not due yet: asked back when it is, and the provider hears nothing.
        out = await renewal.reconcile(fc, PROVIDER, _secret(consumer), remote, status)
        assert out.wait == pytest.approx(1.0) and out.stored is None
        assert provider.requests == [] and status["conditions"] == []

        clock.now = issued + dt.timedelta(seconds=61)
        out = await renewal.reconcile(fc, PROVIDER, _secret(consumer), remote, status)
        assert out.stored is None and out.wait == renewal.settings.poll_s, "waits for the provider"
        [csr] = provider.items("certificatesigningrequests")
        name = csr["metadata"]["name"]
        assert (
            csr["spec"]["expirationSeconds"] == 600 and RENEWAL_SIGNATURE_ANNOTATION in csr["metadata"]["annotations"]
        )
        assert "PRIVATE KEY" not in str(csr)

        _as_filed_by(provider, name)
        await approver.review(name)
        _sign_approved(provider, name, clock.now)
        old = _cert_of(_secret(consumer))
        out = await renewal.reconcile(fc, PROVIDER, _secret(consumer), remote, status)
        assert out.stored is not None
        secret = _secret(consumer)
        new = _cert_of(secret)
        assert new.serial_number != old.serial_number
        assert secret["metadata"]["annotations"][RENEWED_FROM_ANNOTATION] == handshake_digest(fc["spec"]["certificate"])
        cfg = yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"]))
        assert cfg["users"][0]["user"]["client-certificate-data"] == secret["data"]["tls.crt"]
        assert cfg["users"][0]["user"]["client-key-data"] == secret["data"]["tls.key"]
        key = serialization.load_pem_private_key(base64.b64decode(secret["data"]["tls.key"]), password=None)
        spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        assert key.public_key().public_bytes(*spki) == new.public_key().public_bytes(*spki)
        [c] = status["conditions"]
        assert (c["type"], c["status"], c["reason"]) == (CONDITION, "True", "Renewed")
        assert any(e["reason"] == "CredentialsRenewed" for e in consumer.items("events", "default"))
        # The next renewal is due a tenth into the new certificate's lifetime.
        assert out.wait == pytest.approx(60, abs=2)


async def test_a_denied_renewal_is_reported_and_retried_with_backoff() -> None:
    identity = _identity()
    issued = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=500)
    async with serve() as (consumer, api), serve() as (provider, remote):
        _peered(consumer, provider, identity, issued)
        # The provider's record of the consumer's key is another key: every renewal is refused.
        provider.update(
            "tenants",
            "",
            CONSUMER,
            lambda t: t["spec"].__setitem__("publicKey", handshake.public_key_pem(Ed25519PrivateKey.generate())),
        )
        renewal = ClientRenewal(api, identity, RenewalSettings(retry_s=30))
        approver = RenewalApprover(remote, PROVIDER, cert_seconds=600)
        fc = consumer.get("foreignclusters", "", PROVIDER)
        assert fc is not None
        status: dict[str, Any] = {"conditions": []}
        before = _secret(consumer)["data"]["tls.crt"]
        await renewal.reconcile(fc, PROVIDER, _secret(consumer), remote, status)
        [csr] = provider.items("certificatesigningrequests")
        _as_filed_by(provider, csr["metadata"]["name"])
        await approver.review(csr["metadata"]["name"])
        out = await renewal.reconcile(fc, PROVIDER, _secret(consumer), remote, status)
        assert out.wait is not None and 24 <= out.wait <= 36, "the first retry after about retry_s"
        [c] = status["conditions"]
        assert (c["type"], c["status"], c["reason"]) == (CONDITION, "False", "RenewalFailed")
        assert "denied" in c["message"] and "attempt 1" in c["message"]
        assert any(e["reason"] == "CredentialsRenewalFailed" for e in consumer.items("events", "default"))
        assert any(e["reason"] == "RenewalRefused" for e in provider.items("events", "default"))
        assert _secret(consumer)["data"]["tls.crt"] == before, "the current credentials stay"
        # Within the backoff nothing new is filed.
        out = await renewal.reconcile(fc, PROVIDER, _secret(consumer), remote, status)
        assert out.wait is not None and out.wait > 20
        assert len(provider.items("certificatesigningrequests")) == 1


# ---------------------------------------------------------------- what the provider approves


def _filed(identity: Identity, *, consumer: ClusterID = CONSUMER, **spec: Any) -> dict[str, Any]:
    csr = handshake.make_csr(consumer, ec.generate_private_key(ec.SECP256R1()))
    sig = handshake.sign_renewal(identity.private_key, PROVIDER, consumer, csr)
    return {
        "metadata": {"name": "r", "annotations": {RENEWAL_SIGNATURE_ANNOTATION: _b64(sig)}},
        "spec": {
            "request": _b64(csr),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "usages": ["digital signature", "client auth"],
            "expirationSeconds": 600,
            "username": handshake.consumer_user(consumer),
            "groups": [handshake.CONSUMER_GROUP, "system:authenticated"],
            **spec,
        },
    }


def test_the_provider_approves_only_genuine_renewals_of_authenticated_tenants() -> None:
    identity = _identity()
    tenant = {
        "metadata": {"name": CONSUMER},
        "spec": {"publicKey": identity.public_pem},
        "status": {"phase": "Authenticated"},
    }

    def problems(csr: dict[str, Any], t: dict[str, Any] | None = tenant) -> str:
        return "; ".join(renewal_problems(csr, provider=PROVIDER, consumer=CONSUMER, tenant=t, max_seconds=600))

    assert problems(_filed(identity)) == ""
    assert "at most 600" in problems(_filed(identity, expirationSeconds=86400))
    assert "usages" in problems(_filed(identity, usages=["client auth", "server auth"]))
    assert "not in gpufed:consumers" in problems(_filed(identity, groups=["system:authenticated"]))
    assert "no Tenant" in problems(_filed(identity), None)
    assert "not Authenticated" in problems(_filed(identity), {**tenant, "status": {"phase": "Refused"}})
    assert "does not verify" in problems(_filed(_identity()))
    # Another consumer's subject, filed with this consumer's credentials and key.
    assert "subject" in problems(_filed(identity, consumer=ClusterID("cons-other-0001")))


async def test_requests_of_anyone_else_are_left_alone() -> None:
    identity = _identity()
    async with serve() as (provider, remote):
        approver = RenewalApprover(remote, PROVIDER, cert_seconds=600)
        theirs = _filed(identity, username="system:serviceaccount:gpufed:gpufed-controller")
        provider.create(
            "certificatesigningrequests", {**theirs, "metadata": {"name": "handshake"}}, "certificates.k8s.io/v1"
        )
        assert not approver.is_candidate(theirs)
        await approver.review("handshake")
        assert "status" not in (provider.get("certificatesigningrequests", "", "handshake") or {})


# ---------------------------------------------------------------- the metric


def test_the_expiry_metric_follows_the_certificate_and_goes_with_the_peering() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    cert = _issue(ec.generate_private_key(ec.SECP256R1()).public_key(), start)
    expiry.export(PROVIDER, expiry.CLIENT, cert)
    labels = {"remote_cluster": PROVIDER, "kind": expiry.CLIENT}
    got = REGISTRY.get_sample_value("gpufed_credential_expiry_timestamp_seconds", labels)
    assert got == (start + LIFETIME).timestamp()
    assert REGISTRY.get_sample_value("gpufed_credential_issued_timestamp_seconds", labels) == start.timestamp()
    expiry.drop(PROVIDER, expiry.CLIENT)
    expiry.drop(PROVIDER, expiry.CLIENT)  # twice is fine
    assert REGISTRY.get_sample_value("gpufed_credential_expiry_timestamp_seconds", labels) is None


async def test_the_consumer_role_keeps_a_renewed_secret_as_current() -> None:
    identity = _identity()
    issued = dt.datetime.now(dt.UTC).replace(microsecond=0)
    async with serve() as (consumer, api), serve() as (provider, _remote):
        _peered(consumer, provider, identity, issued)
        url = "https://provider.example:6443"

        def handshake_fields(fc: dict[str, Any]) -> None:
            fc["spec"].update(roles=["Provider"], apiServerUrl=url, caData="CA")

        consumer.update("foreignclusters", "", PROVIDER, handshake_fields)
        fc = consumer.get("foreignclusters", "", PROVIDER)
        assert fc is not None
        renewed = _pem(_issue(ec.generate_private_key(ec.SECP256R1()).public_key(), issued))

        def as_renewed(s: dict[str, Any]) -> None:
            s["data"]["tls.crt"] = _b64(renewed)
            s["metadata"]["annotations"] = {
                SERVER_ANNOTATION: url,
                RENEWED_FROM_ANNOTATION: handshake_digest(fc["spec"]["certificate"]),
            }

        consumer.update("secrets", SYSTEM_NAMESPACE, SECRET, as_renewed)
        role = ConsumerRole(api, identity)
        status: dict[str, Any] = {"conditions": []}
        spec = ForeignClusterSpec.model_validate(fc["spec"])
        writes = len(consumer.requests)
        got = await role._credentials(fc, spec, PROVIDER, status, structlog.get_logger())
        assert got is not None and got["data"]["tls.crt"] == _b64(renewed), "the renewed certificate stands"
        assert status["conditions"] == []
        assert [r.method for r in consumer.requests[writes:]] == ["GET"], "read once, nothing rewritten"


def test_the_schedule_and_the_request_count_from_the_issue_not_the_backdated_start() -> None:
    issued = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    # Kubernetes' signers write notBefore 5 minutes before the issue: 600 s asked for, 900 s written.
    backdated = _issue(key, issued - dt.timedelta(seconds=300), dt.timedelta(seconds=900))
    assert handshake.issued_lifetime(backdated) == (issued, LIFETIME)
    renewal = ClientRenewal(None, _identity(), RenewalSettings(renew_fraction=0.1))
    assert renewal.due(backdated) == issued + dt.timedelta(seconds=60)
    # A validity too short to hold a backdate is taken as written.
    assert handshake.issued_lifetime(_issue(key, issued)) == (issued, LIFETIME)
