"""The peering handshake's decisions: challenge, signature, CSR checks, verdict.

The protocol (carried by the ForeignCluster / Tenant objects; the controllers do the I/O):
1. the provider issues a Challenge for one consumer: a random nonce bound to both ClusterIDs and an
   expiry;
2. the consumer makes a fresh ECDSA P-256 key for its client certificate, a CSR whose subject is
   fixed by its ClusterID, and signs `payload(challenge, csr)` with its long-lived Ed25519 identity
   key (the identity key never touches TLS);
3. the provider verifies: the challenge exists, is for this consumer, is unused and unexpired; the
   CSR is well-formed, self-signed, asks for exactly the consumer's subject and nothing else; the
   signature over the payload verifies with the public key the operator registered for that
   consumer. Only then does it create the tenant namespace and submit the CSR to its own CSR API.

The payload binds the protocol version, both ClusterIDs, the nonce, the expiry and the SHA-256 of
the CSR, so a signature cannot be replayed for another consumer, provider, nonce or CSR.

Renewal (no challenge: the consumer already holds a valid certificate): the consumer makes a fresh
key and CSR as in 2., signs `renewal_payload(provider, consumer, csr)` (its own protocol string, so
a handshake signature never passes for a renewal nor the reverse) and files the CSR on the provider
with its current certificate; the provider approves only a request the API server records as filed
by that consumer's user, passing the same CSR checks and verifying with the same registered key
(`verify_renewal`). `renew_at` says when a certificate is due.

Pure: no I/O, no clients; randomness and time are passed in.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from gpufed.apis.wire import ClusterID
from gpufed.kube.times import parse_rfc3339, rfc3339
from peering import defaults

PROTOCOL = b"gpufed.io/peering/v1"
#: Protocol string of a renewal's signed payload.
RENEWAL_PROTOCOL = b"gpufed.io/peering/renewal/v1"
#: Fraction of a client certificate's lifetime after which the consumer renews it.
DEFAULT_RENEW_FRACTION = defaults.CLIENT_CERT_RENEW_FRACTION
NONCE_BYTES = 32
#: How long a challenge may be answered.
DEFAULT_CHALLENGE_TTL = dt.timedelta(minutes=10)
#: Group every consumer identity belongs to on a provider.
CONSUMER_GROUP = "gpufed:consumers"


#: The fields of a challenge on the wire (`Challenge.to_wire`).
_WIRE_FIELDS = ("provider", "consumer", "nonce", "expiresAt")


class Refusal(StrEnum):
    UNKNOWN_CHALLENGE = "UnknownChallenge"
    WRONG_CONSUMER = "IdentityMismatch"
    REPLAYED = "NonceReplayed"
    EXPIRED = "ChallengeExpired"
    BAD_CSR = "InvalidCSR"
    BAD_KEY = "InvalidPublicKey"
    BAD_SIGNATURE = "InvalidSignature"


@dataclass(frozen=True)
class Challenge:
    provider: ClusterID
    consumer: ClusterID
    nonce: bytes
    expires_at: dt.datetime

    def to_wire(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "consumer": self.consumer,
            "nonce": base64.b64encode(self.nonce).decode(),
            "expiresAt": rfc3339(self.expires_at),
        }

    @classmethod
    def from_wire(cls, d: dict[str, str]) -> Challenge:
        """The challenge `to_wire` wrote; ValueError (`malformed challenge: ...`) for anything else."""
        if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in _WIRE_FIELDS):
            raise ValueError(f"malformed challenge: needs the string fields {', '.join(_WIRE_FIELDS)}")
        try:
            return cls(
                ClusterID(d["provider"]),
                ClusterID(d["consumer"]),
                base64.b64decode(d["nonce"], validate=True),
                parse_rfc3339(d["expiresAt"]),
            )
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"malformed challenge: {e}") from e


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str
    message: str


def issue_challenge(
    provider: ClusterID, consumer: ClusterID, nonce: bytes, now: dt.datetime, ttl: dt.timedelta = DEFAULT_CHALLENGE_TTL
) -> Challenge:
    if len(nonce) < NONCE_BYTES:
        raise ValueError(f"nonce must have at least {NONCE_BYTES} bytes")
    return Challenge(provider, consumer, nonce, (now + ttl).replace(microsecond=0))


def consumer_user(consumer: ClusterID) -> str:
    """The Kubernetes user name a consumer's client certificate carries on a provider."""
    return f"gpufed:consumer:{consumer}"


def _field(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


def payload(ch: Challenge, csr_pem: bytes) -> bytes:
    """The exact bytes the consumer signs (length-prefixed fields, no ambiguity)."""
    csr = x509.load_pem_x509_csr(csr_pem)
    csr_digest = hashlib.sha256(csr.public_bytes(serialization.Encoding.DER)).digest()
    parts = [
        PROTOCOL,
        ch.provider.encode(),
        ch.consumer.encode(),
        ch.nonce,
        ch.to_wire()["expiresAt"].encode(),
        csr_digest,
    ]
    return b"".join(_field(p) for p in parts)


def make_csr(consumer: ClusterID, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The consumer's CSR: CN = its user name, O = the consumers group, no extensions."""
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, CONSUMER_GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, consumer_user(consumer)),
        ]
    )
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(name)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def sign(identity_key: Ed25519PrivateKey, ch: Challenge, csr_pem: bytes) -> bytes:
    return identity_key.sign(payload(ch, csr_pem))


def public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def fingerprint(public_pem: str) -> str:
    """Short, human-comparable fingerprint of an Ed25519 public key: `SHA256:<16 hex>`; ValueError
    for anything that is not an Ed25519 public key in PEM."""
    key = _load_public_key(public_pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + hashlib.sha256(raw).hexdigest()[:16]


def _load_public_key(public_pem: str) -> object:
    """Any PEM public key; ValueError (never UnsupportedAlgorithm or UnicodeError) when it is none we can use."""
    try:
        return serialization.load_pem_public_key(public_pem.encode())
    except (ValueError, UnsupportedAlgorithm, UnicodeError) as e:
        raise ValueError(f"not a usable PEM public key: {e}") from None


def _check_csr(consumer: ClusterID, csr_pem: bytes) -> str | None:
    # A CSR is parsed lazily: a malformed key, curve, version, name or extension surfaces only when
    # that part is read, as ValueError, UnsupportedAlgorithm or InvalidVersion. Each is a refusal.
    try:
        return _csr_problem(consumer, csr_pem)
    except (ValueError, UnsupportedAlgorithm, x509.InvalidVersion) as e:
        return f"the CSR is malformed ({e})"


def _csr_problem(consumer: ClusterID, csr_pem: bytes) -> str | None:
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        return f"the CSR is not a PEM certificate request ({e})"
    if not csr.is_signature_valid:
        return "the CSR's self-signature does not verify"
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey):
        return "the CSR must carry an ECDSA key"
    cn = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    want = consumer_user(consumer)
    if cn != [want] or orgs != [CONSUMER_GROUP] or len(csr.subject) != 2:
        return f"the CSR asks for subject {csr.subject.rfc4514_string()!r}, expected CN={want}, O={CONSUMER_GROUP}"
    if len(csr.extensions) != 0:
        return "the CSR must not request extensions (no SANs, no CA, no usages)"
    return None


def verify(
    ch: Challenge | None,
    *,
    consumer: ClusterID,
    consumer_public_pem: str,
    signature: bytes,
    csr_pem: bytes,
    now: dt.datetime,
    used_nonces: frozenset[bytes] = frozenset(),
) -> Verdict:
    """Decide whether the consumer's answer is genuine; every refusal says why in plain words."""
    if ch is None:
        return Verdict(
            False, Refusal.UNKNOWN_CHALLENGE, "no challenge was issued for this consumer; run `gpufed peer` again"
        )
    if ch.consumer != consumer:
        return Verdict(
            False, Refusal.WRONG_CONSUMER, f"the challenge was issued to consumer {ch.consumer}, not {consumer}"
        )
    if ch.nonce in used_nonces:
        return Verdict(False, Refusal.REPLAYED, "this challenge was already answered once; a replay is refused")
    if now > ch.expires_at:
        return Verdict(False, Refusal.EXPIRED, f"the challenge expired at {ch.to_wire()['expiresAt']}")
    refused = _refusal(consumer, consumer_public_pem, csr_pem, signature, lambda: payload(ch, csr_pem), "signature")
    if refused is not None:
        return refused
    return Verdict(True, "Verified", f"consumer {consumer} proved possession of key {fingerprint(consumer_public_pem)}")


def _refusal(
    consumer: ClusterID,
    consumer_public_pem: str,
    csr_pem: bytes,
    signature: bytes,
    signed: Callable[[], bytes],
    what: str,
) -> Verdict | None:
    """Why a CSR and its signature by the registered key over `signed()` (computed only once the CSR
    passed its checks) are refused (None: they are not)."""
    problem = _check_csr(consumer, csr_pem)
    if problem:
        return Verdict(False, Refusal.BAD_CSR, problem)
    try:
        pub = _load_public_key(consumer_public_pem)
    except ValueError as e:
        return Verdict(False, Refusal.BAD_KEY, f"the registered consumer key is not a PEM public key ({e})")
    if not isinstance(pub, Ed25519PublicKey):
        return Verdict(False, Refusal.BAD_KEY, "the registered consumer key is not an Ed25519 key")
    try:
        pub.verify(signature, signed())
    except InvalidSignature:
        return Verdict(
            False,
            Refusal.BAD_SIGNATURE,
            f"the {what} does not verify with the consumer's key {fingerprint(consumer_public_pem)}",
        )
    return None


def renewal_payload(provider: ClusterID, consumer: ClusterID, csr_pem: bytes) -> bytes:
    """The exact bytes the consumer signs to renew its certificate (length-prefixed fields)."""
    csr = x509.load_pem_x509_csr(csr_pem)
    csr_digest = hashlib.sha256(csr.public_bytes(serialization.Encoding.DER)).digest()
    return b"".join(_field(p) for p in (RENEWAL_PROTOCOL, provider.encode(), consumer.encode(), csr_digest))


def sign_renewal(identity_key: Ed25519PrivateKey, provider: ClusterID, consumer: ClusterID, csr_pem: bytes) -> bytes:
    return identity_key.sign(renewal_payload(provider, consumer, csr_pem))


def verify_renewal(
    *, provider: ClusterID, consumer: ClusterID, consumer_public_pem: str, signature: bytes, csr_pem: bytes
) -> Verdict:
    """Whether a renewal request is genuine: the handshake's CSR checks and the signature of the
    registered identity key over `renewal_payload`."""
    refused = _refusal(
        consumer,
        consumer_public_pem,
        csr_pem,
        signature,
        lambda: renewal_payload(provider, consumer, csr_pem),
        "renewal's signature",
    )
    if refused is not None:
        return refused
    return Verdict(True, "Verified", f"consumer {consumer} renewed with key {fingerprint(consumer_public_pem)}")


#: Kubernetes' CSR signers date a certificate's notBefore this many seconds before it was issued
#: (against clock skew): its lifetime as written is `expirationSeconds` plus this.
SIGNER_BACKDATE_S = 300


def issued_lifetime(cert: x509.Certificate) -> tuple[dt.datetime, dt.timedelta]:
    """When `cert` was issued and for how long (what `expirationSeconds` asked for): its validity
    without the CSR signer's backdating, where the validity is long enough to hold it."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    backdate = dt.timedelta(seconds=SIGNER_BACKDATE_S)
    if end - start >= backdate + dt.timedelta(seconds=defaults.MIN_CERT_SECONDS):
        start += backdate
    return start, end - start


def renew_at(not_before: dt.datetime, not_after: dt.datetime, fraction: float = DEFAULT_RENEW_FRACTION) -> dt.datetime:
    """When a certificate valid from `not_before` to `not_after` is due for renewal: after
    `fraction` (0 < fraction < 1) of its lifetime."""
    if not 0 < fraction < 1:
        raise ValueError(f"the renewal fraction must lie between 0 and 1, not {fraction}")
    return not_before + (not_after - not_before) * fraction
