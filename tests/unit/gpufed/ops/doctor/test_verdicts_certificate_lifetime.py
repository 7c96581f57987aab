"""`judge_certificate`: a client certificate is a WARN once less than a third of its lifetime is
left (it renews at two thirds, so the renewal is late), and a FAIL once expired."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufed.ops.doctor.verdicts import judge_certificate

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
THIRD = 1 / 3


def _cert(lifetime: dt.timedelta) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufed:consumer:c")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(START)
        .not_valid_after(START + lifetime)
        .sign(key, hashes.SHA256())
    )


def _status(lifetime: dt.timedelta, elapsed: dt.timedelta) -> str:
    return judge_certificate("credentials", "p", _cert(lifetime), START + elapsed, THIRD, "fix").status


def test_a_third_of_the_lifetime_left_is_a_warning() -> None:
    ten_min = dt.timedelta(minutes=10)
    assert _status(ten_min, dt.timedelta(minutes=6)) == "OK", "before two thirds: not due yet"
    assert _status(ten_min, dt.timedelta(minutes=7)) == "WARN", "past two thirds: the renewal is late"
    ninety = dt.timedelta(days=90)
    assert _status(ninety, dt.timedelta(days=59)) == "OK"
    check = judge_certificate("credentials", "p", _cert(ninety), START + dt.timedelta(days=61), THIRD, "fix")
    assert check.status == "WARN" and "less than 33% of its lifetime of 90 days: its renewal is late" in check.finding
    assert _status(ninety, dt.timedelta(days=91)) == "FAIL"
