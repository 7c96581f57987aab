"""The provider approves only the consumer's certificate request that it filed itself
(peering.controllers.tenant_handshake): not a request squatting the expected name, not one swapped
in under the recorded name, not one with other usages, signer, lifetime, owner or request."""

from __future__ import annotations

import base64
import copy
import hashlib
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509 import CertificateSigningRequestBuilder, Name, NameAttribute
from cryptography.x509.oid import NameOID

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import ClusterID
from gpufed.kube import conditions as cond
from peering import handshake
from peering.controllers.identity import Identity
from peering.controllers.provider import ProviderRole
from peering.controllers.tenant_handshake import CSR_REJECTED, CSR_SIGNER, CSR_USAGES, csr_problems
from tests.unit.fakes import FakeApiServer, serve

PROVIDER = ClusterID("prov-hands-0001")
CONSUMER = ClusterID("cons-hands-0001")
CSRS = "certificatesigningrequests"
CSR_API = "certificates.k8s.io/v1"


def _role(api: Any) -> ProviderRole:
    return ProviderRole(api, Identity(PROVIDER, "", Ed25519PrivateKey.generate()))


def _tenant(server: FakeApiServer, key: Ed25519PrivateKey) -> dict[str, Any]:
    body = {"consumerClusterId": CONSUMER, "publicKey": handshake.public_key_pem(key)}
    return server.create("tenants", {"metadata": {"name": CONSUMER}, "spec": body}, api_version=API_VERSION)


def _status(server: FakeApiServer) -> dict[str, Any]:
    obj = server.get("tenants", "", CONSUMER)
    assert obj is not None
    status: dict[str, Any] = obj.get("status") or {}
    return status


def _answer(server: FakeApiServer, key: Ed25519PrivateKey) -> dict[str, str]:
    challenge = handshake.Challenge.from_wire(_status(server)["challenge"])
    csr = handshake.make_csr(CONSUMER, ec.generate_private_key(ec.SECP256R1()))
    answer = {
        "nonce": base64.b64encode(challenge.nonce).decode(),
        "csr": csr.decode(),
        "signature": base64.b64encode(handshake.sign(key, challenge, csr)).decode(),
    }
    server.update("tenants", "", CONSUMER, lambda t: t["spec"].update(answer=answer))
    return answer


def _controller_manager_request() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = Name([NameAttribute(NameOID.COMMON_NAME, "system:kube-controller-manager")])
    return (
        CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def _impostor(server: FakeApiServer, name: str, tenant: dict[str, Any]) -> None:
    """A request for the kube-controller-manager's identity, filed by someone else under `name`,
    dressed up like gpufed's (labels, owner, signer, usages)."""
    server.create(
        CSRS,
        {
            "kind": "CertificateSigningRequest",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "gpufed", "gpufed.io/consumer-cluster-id": CONSUMER},
                "ownerReferences": [
                    {"apiVersion": API_VERSION, "kind": "Tenant", "name": CONSUMER, "uid": tenant["metadata"]["uid"]}
                ],
            },
            "spec": {
                "request": base64.b64encode(_controller_manager_request()).decode(),
                "signerName": CSR_SIGNER,
                "usages": list(CSR_USAGES),
                "expirationSeconds": 3600,
                "username": "mallory",
                "groups": ["system:authenticated"],
            },
        },
        CSR_API,
    )


def _types(server: FakeApiServer, name: str) -> list[str]:
    csr = server.get(CSRS, "", name)
    assert csr is not None
    return [c["type"] for c in (csr.get("status") or {}).get("conditions") or []]


async def test_a_request_squatting_the_expected_name_is_never_approved() -> None:
    key = Ed25519PrivateKey.generate()
    async with serve() as (server, api):
        tenant = _tenant(server, key)
        role = _role(api)
        await role.reconcile(CONSUMER)
        challenge = handshake.Challenge.from_wire(_status(server)["challenge"])
        # The name a request for this answer used to get: derived from the nonce, readable in the Tenant.
        nonce = base64.b64encode(challenge.nonce).decode()
        squatted = f"gpufed-{CONSUMER}-{hashlib.sha256(nonce.encode()).hexdigest()[:10]}"
        _impostor(server, squatted, tenant)
        _answer(server, key)
        assert await role.reconcile(CONSUMER) == 0.5
        assert _types(server, squatted) == [], "the squatter's request is not approved"
        filed = _status(server)["csrName"]
        assert filed != squatted and filed.startswith(f"gpufed-{CONSUMER}-")
        assert _types(server, filed) == ["Approved"]


async def test_a_request_swapped_in_under_the_recorded_name_is_denied_and_the_handshake_refused() -> None:
    key = Ed25519PrivateKey.generate()
    async with serve() as (server, api):
        tenant = _tenant(server, key)
        role = _role(api)
        await role.reconcile(CONSUMER)
        _answer(server, key)
        # Filed and approved in one pass, not signed yet: an impostor takes its place under its name.
        assert await role.reconcile(CONSUMER) == 0.5
        filed = _status(server)["csrName"]
        server.remove(CSRS, "", filed)
        _impostor(server, filed, tenant)
        await role.reconcile(CONSUMER)
        assert _types(server, filed) == ["Denied"], "the impostor is denied, never approved"
        csr = server.get(CSRS, "", filed)
        assert csr is not None
        denied = csr["status"]["conditions"][0]
        assert denied["reason"] == CSR_REJECTED and "mallory" in denied["message"], denied
        status = _status(server)
        assert status["phase"] == "Refused" and "certificate" not in status
        assert cond.reason_of(status["conditions"], "Authentication") == CSR_REJECTED
        warned = [e for e in server.items("events") if e["reason"] == CSR_REJECTED]
        assert warned and warned[0]["involvedObject"]["name"] == CONSUMER and warned[0]["type"] == "Warning"


def test_csr_problems_name_every_difference_from_the_filed_request() -> None:
    answer_csr = handshake.make_csr(CONSUMER, ec.generate_private_key(ec.SECP256R1())).decode()
    tenant: dict[str, Any] = {"metadata": {"name": CONSUMER, "uid": "t-1"}}
    ours: dict[str, Any] = {
        "metadata": {"name": "x", "ownerReferences": [{"kind": "Tenant", "name": CONSUMER, "uid": "t-1"}]},
        "spec": {
            "request": base64.b64encode(answer_csr.encode()).decode(),
            "signerName": CSR_SIGNER,
            "usages": list(CSR_USAGES),
            "expirationSeconds": 3600,
            "username": "gpufed:controller",
        },
    }

    def problems(change: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> list[str]:
        csr = copy.deepcopy(ours)
        csr["spec"].update(change or {})
        csr["metadata"].update(meta or {})
        return csr_problems(
            csr,
            tenant=tenant,
            consumer=CONSUMER,
            expected_request=answer_csr,
            own_user="gpufed:controller",
            max_seconds=3600,
        )

    assert problems() == []
    assert "not by this controller" in problems({"username": "mallory"})[0]
    assert "signer" in problems({"signerName": "kubernetes.io/legacy-unknown"})[0]
    assert "usages" in problems({"usages": ["client auth", "digital signature", "server auth"]})[0]
    assert "usages" in problems({"usages": ["client auth", "client auth"]})[0]
    assert "expirationSeconds" in problems({"expirationSeconds": 10 * 365 * 86400})[0]
    assert "expirationSeconds" in problems({"expirationSeconds": None})[0]
    assert "not owned" in problems(meta={"ownerReferences": []})[0]
    other = base64.b64encode(_controller_manager_request()).decode()
    assert "not the one the consumer signed" in problems({"request": other})[0]
    assert "not the one the consumer signed" in problems({"request": "%%%"})[0]
