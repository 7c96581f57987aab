"""Generated bad input for the peering handshake: replays, forged or mutated answers, wrong keys.

Owns the property that `peering.handshake.verify` answers every hostile answer with a refusal
(`Verdict(accepted=False, reason=<Refusal>, message)`) and never raises: mutated CSR bytes (which
the cryptography library parses lazily, raising ValueError, UnsupportedAlgorithm or InvalidVersion
from deep inside), keys of the wrong type or garbage PEM, flipped signature bits, replays, and
challenges for someone else. `fingerprint` raises ValueError only. Hypothesis runs derandomized with
explicit `max_examples`; counts are in docs/reliability.md.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x25519
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufed.apis.wire import ClusterID
from peering import handshake as hs

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
PROVIDER = ClusterID("gpu-a-11111111")
CONSUMER = ClusterID("consumer-22222222")
IDENTITY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC = hs.public_key_pem(IDENTITY)
CHALLENGE = hs.issue_challenge(PROVIDER, CONSUMER, bytes(range(32, 64)), NOW)
CSR_KEY = ec.derive_private_key(12345678901234567890, ec.SECP256R1())
CSR = hs.make_csr(CONSUMER, CSR_KEY)
SIGNATURE = hs.sign(IDENTITY, CHALLENGE, CSR)
CSR_DER = base64.b64decode(b"".join(CSR.splitlines()[1:-1]))
LATER = NOW + dt.timedelta(minutes=1)
REFUSALS = set(hs.Refusal)


def bounded(n: int) -> settings:
    """Deterministic, bounded hypothesis settings: `n` generated cases, no deadline, no database."""
    return settings(max_examples=n, derandomize=True, deadline=None, database=None)


def pem(der: bytes, label: str = "CERTIFICATE REQUEST") -> bytes:
    return f"-----BEGIN {label}-----\n".encode() + base64.encodebytes(der) + f"-----END {label}-----\n".encode()


def judge(
    *,
    ch: hs.Challenge | None = CHALLENGE,
    key: str = PUBLIC,
    sig: bytes = SIGNATURE,
    csr: bytes = CSR,
    consumer: ClusterID = CONSUMER,
    used: frozenset[bytes] = frozenset(),
) -> hs.Verdict:
    """verify(), asserting the shape every answer must have: accepted, or refused with a reason and words."""
    v = hs.verify(
        ch, consumer=consumer, consumer_public_pem=key, signature=sig, csr_pem=csr, now=LATER, used_nonces=used
    )
    assert isinstance(v, hs.Verdict) and v.message
    if not v.accepted:
        assert v.reason in REFUSALS
    return v


def test_the_genuine_answer_is_accepted() -> None:
    assert judge().accepted


_mutations = st.lists(st.tuples(st.integers(0, len(CSR_DER) - 1), st.integers(1, 255)), min_size=1, max_size=4)


@bounded(150)
@given(_mutations)
@example([(4, 75)])  # regression: InvalidVersion escaped verify() (the CSR's version byte)
@example([(len(CSR_DER) // 3, 1)])
def test_a_mutated_csr_is_refused_never_raises(flips: list[tuple[int, int]]) -> None:
    der = bytearray(CSR_DER)
    for pos, delta in flips:
        der[pos] = (der[pos] + delta) % 256
    v = judge(csr=pem(bytes(der)))
    if bytes(der) != CSR_DER:
        assert not v.accepted and v.reason in (hs.Refusal.BAD_CSR, hs.Refusal.BAD_SIGNATURE)


def _curve_oid_mutation() -> bytes:
    """The genuine CSR with its P-256 curve OID changed into one nobody supports (UnsupportedAlgorithm)."""
    oid = bytes.fromhex("2a8648ce3d030107")  # 1.2.840.10045.3.1.7
    assert oid in CSR_DER
    return CSR_DER.replace(oid, bytes.fromhex("2a8648ce3d030163"))


def test_regression_unsupported_curve_in_csr_is_a_refusal() -> None:
    v = judge(csr=pem(_curve_oid_mutation()))
    assert (v.accepted, v.reason) == (False, hs.Refusal.BAD_CSR) and "malformed" in v.message


@bounded(60)
@given(st.one_of(st.binary(max_size=600), st.text(max_size=300).map(str.encode), st.just(CSR[:-30])))
def test_garbage_csr_is_refused(csr: bytes) -> None:
    v = judge(csr=csr)
    assert not v.accepted and v.reason == hs.Refusal.BAD_CSR


def _spki(key: Any) -> str:
    return str(
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


WRONG_KEYS: dict[str, Callable[[], str]] = {
    "ecdsa-p256": lambda: _spki(ec.derive_private_key(7, ec.SECP256R1())),
    "rsa-1024": lambda: _spki(rsa.generate_private_key(65537, 1024)),
    "dsa-1024": lambda: _spki(dsa.generate_private_key(1024)),
    "ed448": lambda: _spki(ed448.Ed448PrivateKey.generate()),
    "x25519": lambda: _spki(x25519.X25519PrivateKey.generate()),
    "another-ed25519": lambda: hs.public_key_pem(Ed25519PrivateKey.generate()),
    "private-key-pem": lambda: IDENTITY.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode(),
    "truncated": lambda: PUBLIC[:40],
    "empty": lambda: "",
    "lone-surrogate": lambda: "\ud800",
}


@pytest.mark.parametrize("name", sorted(WRONG_KEYS))
def test_a_registered_key_of_the_wrong_kind_is_refused(name: str) -> None:
    key = WRONG_KEYS[name]()
    v = judge(key=key)
    assert not v.accepted
    assert v.reason == (hs.Refusal.BAD_SIGNATURE if name == "another-ed25519" else hs.Refusal.BAD_KEY)
    if name != "another-ed25519":
        with pytest.raises(ValueError):
            hs.fingerprint(key)


@bounded(60)
@given(st.lists(st.tuples(st.integers(0, len(PUBLIC) - 1), st.characters(codec="utf-8")), min_size=1, max_size=3))
@example([(30, "Z")])
@example([(27, "\x00")])
def test_a_mutated_registered_key_is_refused_never_raises(edits: list[tuple[int, str]]) -> None:
    key = list(PUBLIC)
    for pos, ch in edits:
        key[pos] = ch
    text = "".join(key)
    v = judge(key=text)
    if text != PUBLIC:
        assert not v.accepted and v.reason in (hs.Refusal.BAD_KEY, hs.Refusal.BAD_SIGNATURE)
    with contextlib.suppress(ValueError):  # ValueError is the documented refusal
        assert hs.fingerprint(text).startswith("SHA256:")


@bounded(80)
@given(st.one_of(st.binary(max_size=100), st.lists(st.tuples(st.integers(0, 63), st.integers(1, 255)), max_size=3)))
def test_a_forged_or_flipped_signature_is_refused(sig: bytes | list[tuple[int, int]]) -> None:
    if isinstance(sig, list):
        flipped = bytearray(SIGNATURE)
        for pos, delta in sig:
            flipped[pos] = (flipped[pos] + delta) % 256
        sig = bytes(flipped)
    v = judge(sig=sig)
    assert v.accepted == (sig == SIGNATURE)
    if not v.accepted:
        assert v.reason == hs.Refusal.BAD_SIGNATURE


_ids = st.sampled_from([PROVIDER, CONSUMER, ClusterID("mallory-33333333"), ClusterID("")])


@bounded(80)
@given(
    provider=_ids,
    consumer=_ids,
    nonce=st.one_of(st.just(CHALLENGE.nonce), st.binary(min_size=32, max_size=40)),
    expires=st.integers(-3600, 3600),
    answering_as=_ids,
)
def test_a_signature_is_bound_to_every_field_of_the_challenge(
    provider: ClusterID, consumer: ClusterID, nonce: bytes, expires: int, answering_as: ClusterID
) -> None:
    """A genuine signature presented against a challenge that differs in any field is refused."""
    ch = dataclasses.replace(
        CHALLENGE, provider=provider, consumer=consumer, nonce=nonce, expires_at=NOW + dt.timedelta(seconds=expires)
    )
    v = judge(ch=ch, consumer=answering_as)
    if ch == CHALLENGE and answering_as == CONSUMER:
        assert v.accepted
        return
    assert not v.accepted
    if consumer != answering_as:
        assert v.reason == hs.Refusal.WRONG_CONSUMER
    elif ch.expires_at < LATER:
        assert v.reason == hs.Refusal.EXPIRED
    elif answering_as != CONSUMER:
        assert v.reason == hs.Refusal.BAD_CSR  # the CSR names CONSUMER
    else:
        assert v.reason == hs.Refusal.BAD_SIGNATURE


@bounded(30)
@given(st.sets(st.binary(min_size=32, max_size=32), max_size=5))
def test_a_replayed_nonce_is_refused(others: set[bytes]) -> None:
    assert judge(used=frozenset(others)).accepted == (CHALLENGE.nonce not in others)
    v = judge(used=frozenset({*others, CHALLENGE.nonce}))
    assert (v.accepted, v.reason) == (False, hs.Refusal.REPLAYED)


def test_no_challenge_is_a_refusal() -> None:
    assert judge(ch=None).reason == hs.Refusal.UNKNOWN_CHALLENGE
