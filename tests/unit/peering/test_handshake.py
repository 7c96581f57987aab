"""Handshake decisions: genuine answers pass; forged, replayed, expired or mismatched ones are refused."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from gpufed.apis.wire import ClusterID
from peering import handshake as hs

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
PROVIDER = ClusterID("gpu-a-11111111")
CONSUMER = ClusterID("consumer-22222222")


@pytest.fixture
def identity() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def challenge() -> hs.Challenge:
    return hs.issue_challenge(PROVIDER, CONSUMER, os.urandom(32), NOW)


@pytest.fixture
def csr() -> bytes:
    return hs.make_csr(CONSUMER, ec.generate_private_key(ec.SECP256R1()))


def verify(ch: hs.Challenge | None, key_pem: str, sig: bytes, csr: bytes, **kw: object) -> hs.Verdict:
    args: dict[str, Any] = {
        "consumer": CONSUMER,
        "consumer_public_pem": key_pem,
        "signature": sig,
        "csr_pem": csr,
        "now": NOW + dt.timedelta(minutes=1),
    }
    args.update(kw)
    return hs.verify(ch, **args)


def test_genuine_answer_is_accepted(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    v = verify(challenge, hs.public_key_pem(identity), hs.sign(identity, challenge, csr), csr)
    assert v.accepted and CONSUMER in v.message and hs.fingerprint(hs.public_key_pem(identity)) in v.message


def test_forged_signature_other_key(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    mallory = Ed25519PrivateKey.generate()
    v = verify(challenge, hs.public_key_pem(identity), hs.sign(mallory, challenge, csr), csr)
    assert not v.accepted and v.reason == hs.Refusal.BAD_SIGNATURE


def test_tampered_signature(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    sig = bytearray(hs.sign(identity, challenge, csr))
    sig[5] ^= 0x01
    v = verify(challenge, hs.public_key_pem(identity), bytes(sig), csr)
    assert v.reason == hs.Refusal.BAD_SIGNATURE


def test_signature_is_bound_to_the_csr(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    other_csr = hs.make_csr(CONSUMER, ec.generate_private_key(ec.SECP256R1()))
    v = verify(challenge, hs.public_key_pem(identity), hs.sign(identity, challenge, csr), other_csr)
    assert v.reason == hs.Refusal.BAD_SIGNATURE


def test_signature_is_bound_to_the_nonce(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    other = hs.issue_challenge(PROVIDER, CONSUMER, os.urandom(32), NOW)
    v = verify(other, hs.public_key_pem(identity), hs.sign(identity, challenge, csr), csr)
    assert v.reason == hs.Refusal.BAD_SIGNATURE


def test_replay_is_refused(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    sig = hs.sign(identity, challenge, csr)
    v = verify(challenge, hs.public_key_pem(identity), sig, csr, used_nonces=frozenset({challenge.nonce}))
    assert v.reason == hs.Refusal.REPLAYED and "replay" in v.message


def test_expired_challenge(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr: bytes) -> None:
    v = verify(
        challenge,
        hs.public_key_pem(identity),
        hs.sign(identity, challenge, csr),
        csr,
        now=NOW + dt.timedelta(minutes=11),
    )
    assert v.reason == hs.Refusal.EXPIRED


def test_challenge_for_another_consumer(identity: Ed25519PrivateKey, csr: bytes) -> None:
    ch = hs.issue_challenge(PROVIDER, ClusterID("someone-else"), os.urandom(32), NOW)
    v = verify(ch, hs.public_key_pem(identity), hs.sign(identity, ch, csr), csr)
    assert v.reason == hs.Refusal.WRONG_CONSUMER


def test_no_challenge(identity: Ed25519PrivateKey, csr: bytes) -> None:
    assert verify(None, hs.public_key_pem(identity), b"x", csr).reason == hs.Refusal.UNKNOWN_CHALLENGE


def _csr(name: x509.Name, *, san: bool = False) -> bytes:
    b = x509.CertificateSigningRequestBuilder().subject_name(name)
    if san:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("evil")]), critical=False)
    return b.sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(
    ("csr_pem", "message"),
    [
        (
            _csr(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.COMMON_NAME, "system:admin"),
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                    ]
                )
            ),
            "expected CN=",
        ),
        (
            _csr(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, hs.CONSUMER_GROUP),
                        x509.NameAttribute(NameOID.COMMON_NAME, hs.consumer_user(CONSUMER)),
                    ]
                ),
                san=True,
            ),
            "extensions",
        ),
        (b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "not a PEM"),
    ],
)
def test_bad_csrs(identity: Ed25519PrivateKey, challenge: hs.Challenge, csr_pem: bytes, message: str) -> None:
    v = verify(challenge, hs.public_key_pem(identity), b"\0" * 64, csr_pem)
    assert v.reason == hs.Refusal.BAD_CSR and message in v.message


def test_registered_key_must_be_ed25519(challenge: hs.Challenge, csr: bytes) -> None:
    ec_pub = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    assert verify(challenge, ec_pub, b"x" * 64, csr).reason == hs.Refusal.BAD_KEY
    assert verify(challenge, "garbage", b"x" * 64, csr).reason == hs.Refusal.BAD_KEY


def test_challenge_wire_round_trip(challenge: hs.Challenge) -> None:
    assert hs.Challenge.from_wire(challenge.to_wire()) == challenge
    with pytest.raises(ValueError, match="malformed challenge"):
        hs.Challenge.from_wire({"provider": "p"})
    with pytest.raises(ValueError, match="at least 32"):
        hs.issue_challenge(PROVIDER, CONSUMER, b"short", NOW)
