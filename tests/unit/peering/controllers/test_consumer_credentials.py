"""The consumer role's credentials Secrets (peering.controllers.consumer): written once from the
certificate the provider issued, then checked from a watch instead of read on every reconcile, and
never refused because the watch lags behind the role's own write; readable by the virtual kubelets
through a Role naming that Secret alone, granted before the peering is reported Peered (which starts
the virtual kubelet) and revoked with the peering. Against the in-memory API server.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.peering import ForeignClusterSpec
from gpufed.apis.wire import (
    PROVIDER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    credentials_reader,
    pending_key_secret,
    remote_kubeconfig_secret,
)
from gpufed.kube import rest
from peering.controllers.consumer import ConsumerRole
from peering.controllers.identity import Identity
from tests.unit.fakes import FakeApiServer, running, serve, until
from tests.unit.gpufed.ops.doctor.scenario import certificate

CONSUMER = ClusterID("cons-creds-0001")
PROVIDER = ClusterID("prov-creds-0001")
SECRET = remote_kubeconfig_secret(PROVIDER)
SECRET_PATH = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets/{SECRET}"


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _handshake_done(server: FakeApiServer) -> dict[str, Any]:
    """What the handshake leaves on the consumer: the CSR's key in the pending Secret and the issued
    certificate in the ForeignCluster (as `gpufed peer` copies it there)."""
    cert_pem, key_pem = certificate(1, CONSUMER)
    server.create(
        "secrets",
        {
            "metadata": {"name": pending_key_secret(PROVIDER), "namespace": SYSTEM_NAMESPACE},
            "data": {"tls.key": _b64(key_pem)},
        },
    )
    return server.create(
        "foreignclusters",
        {
            "kind": "ForeignCluster",
            "metadata": {"name": PROVIDER},
            "spec": {
                "clusterId": PROVIDER,
                "roles": ["Provider"],
                "apiServerUrl": "https://provider.example:6443",
                "certificate": cert_pem.decode(),
                "caData": certificate(1, "ca")[0].decode(),
            },
        },
        api_version=API_VERSION,
    )


async def _credentials(role: ConsumerRole, api: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    fc = await rest.get(api, rest.path(API_VERSION, "foreignclusters", PROVIDER))
    assert fc is not None
    spec = ForeignClusterSpec.model_validate(fc["spec"])
    status: dict[str, Any] = {"conditions": []}
    got = await role._credentials(fc, spec, PROVIDER, status, structlog.get_logger())
    return got, status


def _role(api: Any) -> ConsumerRole:
    return ConsumerRole(api, Identity(CONSUMER, "", Ed25519PrivateKey.generate()))


async def test_a_current_secret_is_checked_from_the_watch_not_read_again() -> None:
    async with serve() as (server, api):
        _handshake_done(server)
        role = _role(api)
        async with running(role.watch_secrets()):
            await until(lambda: role._secrets_synced, what="the secret watch to sync")
            written, status = await _credentials(role, api)
            assert written is not None and written["metadata"]["labels"][PROVIDER_LABEL] == PROVIDER
            assert status["conditions"][0]["reason"] == "Authenticated"
            assert server.get("secrets", SYSTEM_NAMESPACE, pending_key_secret(PROVIDER)) is None, "the CSR key moved"
            await until(lambda: SECRET in role._secret_cache, what="the watch to bring the secret")
            reads = len(server.calls("GET", SECRET_PATH))
            assert reads == 1, "the first reconcile reads the Secret (it did not exist)"
            requests = len(server.requests)
            for _ in range(5):
                got, status = await _credentials(role, api)
                assert got is not None and got["data"]["tls.crt"] == written["data"]["tls.crt"]
                assert status["conditions"] == [], "a current Secret changes no condition"
            secret_calls = [r for r in server.requests[requests:] if "/secrets" in r.path]
            assert secret_calls == [], f"a current Secret was read or written again: {secret_calls}"


async def test_a_watch_lagging_behind_the_roles_own_write_never_refuses_the_credentials() -> None:
    async with serve() as (server, api):
        _handshake_done(server)
        role = _role(api)
        async with running(role.watch_secrets()):
            await until(lambda: role._secrets_synced, what="the secret watch to sync")
            server.flowing.clear()  # the watch holds its events back from here on
            written, _ = await _credentials(role, api)
            assert written is not None
            # The cache lost the write-through, as if an older event had just replaced it: the API
            # server is asked, and the credentials stand (the CSR key is gone, so a rewrite would fail).
            role._secret_cache[SECRET] = {**written, "data": {**written["data"], "tls.crt": _b64("older")}}
            got, status = await _credentials(role, api)
            assert got is not None and got["data"]["tls.crt"] == written["data"]["tls.crt"]
            assert status["conditions"] == [], f"refused on a stale cache: {status['conditions']}"
            role._secret_cache.clear()  # not seen at all yet
            got, status = await _credentials(role, api)
            assert got is not None and status["conditions"] == []
            assert len(server.calls("GET", SECRET_PATH)) == 3
            server.flowing.set()


async def test_a_deleted_secret_is_reconciled_at_once_and_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve() as (server, api):
        _handshake_done(server)
        role = _role(api)
        queued: list[str] = []
        monkeypatch.setattr(role.queue, "add", lambda key, delay=0.0: queued.append(key))
        async with running(role.watch_secrets()):
            await until(lambda: role._secrets_synced, what="the secret watch to sync")
            await _credentials(role, api)
            await until(lambda: SECRET in role._secret_cache, what="the watch to bring the secret")
            queued.clear()
            server.remove("secrets", SYSTEM_NAMESPACE, SECRET)
            await until(lambda: SECRET not in role._secret_cache, what="the deletion to reach the cache")
            assert queued == [PROVIDER], "the provider's ForeignCluster is reconciled on the deletion"
            reads = len(server.calls("GET", SECRET_PATH))
            got, status = await _credentials(role, api)
            assert len(server.calls("GET", SECRET_PATH)) == reads + 1
            # the CSR key went with the first write: the condition says to peer again
            assert got is None and status["conditions"][0]["reason"] == "CertificateMismatch"


# ---- the virtual kubelets' access to the credentials

READER = credentials_reader(PROVIDER)
RBAC = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}"


def _offline(role: ConsumerRole, monkeypatch: pytest.MonkeyPatch) -> None:
    """No provider to mirror slices to: the part of the reconcile after the credentials is skipped."""

    async def no_slices(*_args: Any) -> float:
        return 10.0

    monkeypatch.setattr(role, "_slices", no_slices)


def _index(server: FakeApiServer, method: str, path: str) -> int:
    return next(i for i, r in enumerate(server.requests) if r.method == method and r.path == path)


async def test_the_virtual_kubelets_may_read_the_credentials_before_the_peering_is_reported_peered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serve() as (server, api):
        fc = _handshake_done(server)
        role = _role(api)
        _offline(role, monkeypatch)
        await role.reconcile(PROVIDER)
        status = server.get("foreignclusters", "", PROVIDER)
        assert status is not None and status["status"]["phase"] == "Peered"
        reader = server.get("roles", SYSTEM_NAMESPACE, READER)
        assert reader is not None, "no Role lets the virtual kubelets read their credentials"
        assert reader["rules"] == [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [SECRET]}
        ]
        binding = server.get("rolebindings", SYSTEM_NAMESPACE, READER)
        assert binding is not None and binding["roleRef"]["name"] == READER
        for obj in (reader, binding):
            assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [fc["metadata"]["uid"]]
        # The status that starts the virtual kubelet (phase Peered, kubeconfigSecret) comes last.
        peered = _index(server, "PATCH", f"/apis/{API_VERSION}/foreignclusters/{PROVIDER}/status")
        assert _index(server, "PATCH", f"{RBAC}/roles/{READER}") < peered
        assert _index(server, "PATCH", f"{RBAC}/rolebindings/{READER}") < peered


async def test_the_access_is_granted_while_the_handshake_is_pending_and_revoked_with_the_peering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serve() as (server, api):
        server.create(
            "foreignclusters",
            {
                "kind": "ForeignCluster",
                "metadata": {"name": PROVIDER},
                "spec": {"clusterId": PROVIDER, "roles": ["Provider"], "apiServerUrl": "https://p.example:6443"},
            },
            api_version=API_VERSION,
        )
        role = _role(api)
        _offline(role, monkeypatch)
        await role.reconcile(PROVIDER)
        assert server.get("roles", SYSTEM_NAMESPACE, READER) is not None, "a waiting virtual kubelet sees 404, not 403"
        server.remove("foreignclusters", "", PROVIDER)
        await role.reconcile(PROVIDER)
        assert server.get("roles", SYSTEM_NAMESPACE, READER) is None
        assert server.get("rolebindings", SYSTEM_NAMESPACE, READER) is None


async def test_a_foreign_cluster_that_is_no_provider_grants_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve() as (server, api):
        server.create(
            "foreignclusters",
            {
                "kind": "ForeignCluster",
                "metadata": {"name": PROVIDER},
                "spec": {"clusterId": PROVIDER, "roles": ["Consumer"]},
            },
            api_version=API_VERSION,
        )
        role = _role(api)
        _offline(role, monkeypatch)
        await role.reconcile(PROVIDER)
        assert server.items("roles") == [] and server.items("rolebindings") == []
