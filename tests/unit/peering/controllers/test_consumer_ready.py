"""The consumer role's Ready conditions (peering.controllers.consumer): a ForeignCluster's, summed up
from Authentication and ProviderReachable, and a ResourceSlice's, from the provider's decision copied
back; every condition observed at the local object's generation. Against the in-memory API server."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import SYSTEM_NAMESPACE, ClusterID, tenant_namespace
from gpufed.kube import conditions as cond
from peering.controllers.consumer import ConsumerRole
from peering.controllers.identity import Identity
from tests.unit.fakes import serve
from tests.unit.peering.controllers.readiness import conditions_of, new_generation, observed_at, ready_of
from tests.unit.peering.controllers.test_consumer_credentials import CONSUMER, PROVIDER, _handshake_done

# ---- ForeignCluster (consumer side)


def _consumer(api: Any, monkeypatch: pytest.MonkeyPatch, reachable: bool) -> ConsumerRole:
    role = ConsumerRole(api, Identity(CONSUMER, "", Ed25519PrivateKey.generate()))

    async def slices(_provider: Any, _credentials: Any, status: dict[str, Any], _log: Any) -> float:
        if reachable:
            status["conditions"] = cond.mark(status["conditions"], "ProviderReachable", True, "Reachable", "ok")
        else:
            status["conditions"] = cond.mark(status["conditions"], "ProviderReachable", False, "APIError", "refused")
        return 10.0

    async def no_renewal(*_args: Any) -> None:
        return None

    monkeypatch.setattr(role, "_slices", slices)
    monkeypatch.setattr(role, "_renew", no_renewal, raising=False)  # no provider to renew with
    return role


@pytest.mark.parametrize(
    ("reachable", "ready"), [(True, ("True", "Ready")), (False, ("False", "APIError"))], ids=["reachable", "not"]
)
async def test_a_foreign_cluster_is_ready_once_authenticated_and_its_provider_answers(
    monkeypatch: pytest.MonkeyPatch, reachable: bool, ready: tuple[str, str]
) -> None:
    async with serve() as (server, api):
        _handshake_done(server)
        new_generation(server, "foreignclusters", "", PROVIDER, 3)
        await _consumer(api, monkeypatch, reachable).reconcile(PROVIDER)
        conds = conditions_of(server, "foreignclusters", "", PROVIDER)
        assert ready_of(conds) == ready
        assert {"Ready", "Authentication", "ProviderReachable"} <= {c["type"] for c in conds}
        assert observed_at(conds) == {3}


async def test_a_foreign_cluster_without_credentials_is_not_ready_for_want_of_authentication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serve() as (server, api):
        fc = _handshake_done(server)
        server.update("foreignclusters", "", PROVIDER, lambda o: o["spec"].update(certificate="not a certificate"))
        await _consumer(api, monkeypatch, True).reconcile(fc["metadata"]["name"])
        conds = conditions_of(server, "foreignclusters", "", PROVIDER)
        assert ready_of(conds) == ("False", "InvalidCertificate")
        ready = cond.find(conds, "Ready")
        assert ready is not None and str(ready["message"]).startswith("Authentication: ")
        assert observed_at(conds) == {1}


async def test_a_foreign_cluster_of_a_consumer_is_ready_when_its_tenant_is() -> None:
    """The provider's side of a peering: its ForeignCluster names the consumer and follows its Tenant."""
    async with serve() as (server, api):
        fc = {"metadata": {"name": CONSUMER}, "spec": {"clusterId": CONSUMER, "roles": ["Consumer"]}}
        server.create("foreignclusters", fc, api_version=API_VERSION)
        new_generation(server, "foreignclusters", "", CONSUMER, 2)
        role = ConsumerRole(api, Identity(PROVIDER, "", Ed25519PrivateKey.generate()))
        assert await role.reconcile(CONSUMER) is not None, "looked at again until its Tenant is Ready"
        conds = conditions_of(server, "foreignclusters", "", CONSUMER)
        assert ready_of(conds) == ("False", "NoTenant") and observed_at(conds) == {2}
        tenant = {
            "metadata": {"name": CONSUMER},
            "spec": {"consumerClusterId": CONSUMER},
            "status": {
                "phase": "Authenticated",
                "conditions": [{"type": "Ready", "status": "False", "reason": "NamespacesPending", "message": "x"}],
            },
        }
        server.create("tenants", tenant, api_version=API_VERSION)
        await role.reconcile(CONSUMER)
        assert ready_of(conditions_of(server, "foreignclusters", "", CONSUMER)) == ("False", "NamespacesPending")
        server.update(
            "tenants",
            "",
            CONSUMER,
            lambda t: t["status"].update(conditions=[{"type": "Ready", "status": "True", "reason": "Ready"}]),
        )
        await role.reconcile(CONSUMER)
        got = server.get("foreignclusters", "", CONSUMER)
        assert got is not None and got["status"]["phase"] == "Peered"
        conds = conditions_of(server, "foreignclusters", "", CONSUMER)
        assert ready_of(conds) == ("True", "Ready") and {"Ready", "TenantReady"} == {c["type"] for c in conds}


# ---- ResourceSlice (consumer side: the provider's decision copied back)


async def test_the_consumer_copies_the_decision_observed_at_its_own_slice_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One in-memory API server plays both clusters: the consumer's slice in `gpufed`, its mirror in
    the tenant namespace."""
    async with serve() as (server, api):
        _handshake_done(server)
        server.create(
            "resourceslices",
            {
                "metadata": {"name": PROVIDER, "namespace": SYSTEM_NAMESPACE, "generation": 4},
                "spec": {"providerClusterId": PROVIDER, "resources": {"nvidia.com/gpu": "1"}},
            },
            api_version=API_VERSION,
        )
        role = ConsumerRole(api, Identity(CONSUMER, "", Ed25519PrivateKey.generate()))

        async def same_server(_provider: str, _secret: dict[str, Any]) -> Any:
            return api

        monkeypatch.setattr(role.remotes, "get", same_server)
        await role.reconcile(PROVIDER)
        local = conditions_of(server, "resourceslices", SYSTEM_NAMESPACE, PROVIDER)
        assert local == [], "not decided yet: nothing copied"
        tns = tenant_namespace(ClusterID(CONSUMER))
        decided = cond.ready(
            [
                cond.condition("Authentication", True, "Authenticated", "ok", []),
                cond.condition("Resources", True, "Granted", "1 GPU", []),
            ],
            ("Authentication", "Resources"),
            1,
        )

        def provider_decides(o: dict[str, Any]) -> None:
            o["metadata"]["generation"] = 1
            o["status"] = {"conditions": decided, "granted": {"nvidia.com/gpu": "1"}}

        server.update("resourceslices", tns, PROVIDER, provider_decides)
        await role.reconcile(PROVIDER)
        local = conditions_of(server, "resourceslices", SYSTEM_NAMESPACE, PROVIDER)
        assert ready_of(local) == ("True", "Ready")
        assert observed_at(local) == {4}, "observed at the consumer's own slice generation"
        fc = conditions_of(server, "foreignclusters", "", PROVIDER)
        assert ready_of(fc) == ("True", "Ready")


async def test_slices_waiting_for_the_handshake_are_not_ready() -> None:
    async with serve() as (server, api):
        server.create(
            "foreignclusters",
            {"metadata": {"name": PROVIDER}, "spec": {"clusterId": PROVIDER, "roles": ["Provider"]}},
            api_version=API_VERSION,
        )
        server.create(
            "resourceslices",
            {
                "metadata": {"name": PROVIDER, "namespace": SYSTEM_NAMESPACE},
                "spec": {"providerClusterId": PROVIDER, "resources": {"nvidia.com/gpu": "1"}},
            },
            api_version=API_VERSION,
        )
        await ConsumerRole(api, Identity(CONSUMER, "", Ed25519PrivateKey.generate())).reconcile(PROVIDER)
        assert ready_of(conditions_of(server, "resourceslices", SYSTEM_NAMESPACE, PROVIDER)) == ("False", "Pending")
        assert ready_of(conditions_of(server, "foreignclusters", "", PROVIDER)) == ("False", "AuthenticationPending")
