"""The provider's `tenant-certificate` check sees a consumer's renewed certificates while the CSR API
holds them (`issued_renewals`): only requests filed by that consumer's own user and issued count."""

from __future__ import annotations

import base64
from typing import Any

from cryptography import x509

from gpufed.ops.doctor.probes import issued_renewals
from tests.unit.gpufed.ops.doctor.scenario import certificate


def _csr(user: str, cert: bytes | None) -> dict[str, Any]:
    status = {"certificate": base64.b64encode(cert).decode()} if cert else {}
    return {"spec": {"username": user}, "status": status}


def test_only_issued_requests_of_the_consumers_own_user_count() -> None:
    mine, _ = certificate(80)
    theirs, _ = certificate(80)
    csrs = [
        _csr("gpufed:consumer:c1", mine),
        _csr("gpufed:consumer:c2", theirs),
        _csr("gpufed:consumer:c1", None),
        {"spec": {"username": "gpufed:consumer:c1"}, "status": {"certificate": "not base64!"}},
    ]
    [got] = issued_renewals(csrs, "c1")
    assert got.serial_number == x509.load_pem_x509_certificate(mine).serial_number
