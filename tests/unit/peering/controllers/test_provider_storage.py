"""Storage grants in the provider role against the in-memory API server (peering.controllers.provider,
tenant_grants, tenant_namespaces): the caches the storage watches keep, a slice's storage decided
against the offered classes and written with them into its status, the quotas of the twins, the
twins' offer annotations, the claims policy applied, and the consumer's copy of the offer."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.peering import TenantSpec
from gpufed.apis.quantity import parse
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    DEFAULT_STORAGE_CLASS_ANNOTATION,
    GRANT_QUOTA,
    OFFERED_STORAGE_ACCESS_MODES_ANNOTATION,
    OFFERED_STORAGE_CLASSES_ANNOTATION,
    STATIC_PROVISIONER,
    TWIN_OF_LABEL,
    ClusterID,
    tenant_namespace,
)
from peering import grants, podsecurity, storage
from peering.controllers.consumer import storage_offers
from peering.controllers.identity import Identity
from peering.controllers.provider import ProviderRole
from tests.unit.fakes import FakeApiServer, serve

PROVIDER = ClusterID("prov-store-0001")
CONSUMER = ClusterID("cons-store-0001")
TNS = tenant_namespace(CONSUMER)
TWIN = f"team-a-{CONSUMER}"
GI = parse("1Gi")
LOCAL_DISK = {
    "metadata": {
        "name": "local-disk",
        "annotations": {DEFAULT_STORAGE_CLASS_ANNOTATION: "true", "gpufed.io/access-modes": "ReadWriteOnce"},
    },
    "provisioner": STATIC_PROVISIONER,
}
NODE = {
    "metadata": {"name": "n0"},
    "status": {
        "conditions": [{"type": "Ready", "status": "True"}],
        "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
    },
}


def _volume(name: str, *, claimed: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "50Gi"}, "storageClassName": "local-disk"}
    if claimed:
        spec["claimRef"] = {"namespace": "elsewhere", "name": "c"}
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": "Bound" if claimed else "Available"}}


def _role(api: Any) -> ProviderRole:
    role = ProviderRole(api, Identity(PROVIDER, "", Ed25519PrivateKey.generate()))
    role.tenants.add(CONSUMER)
    role._on_node("ADDED", NODE)
    role._on_storage_class("ADDED", LOCAL_DISK)
    for i in range(3):
        role._on_volume("ADDED", _volume(f"v{i}"))
    role._on_volume("ADDED", _volume("taken", claimed=True))
    for ns, labels in ((TNS, {CONSUMER_LABEL: CONSUMER}), (TWIN, {CONSUMER_LABEL: CONSUMER, TWIN_OF_LABEL: "team-a"})):
        role._on_namespace("ADDED", {"metadata": {"name": ns, "labels": labels}})
    return role


def _slice(server: FakeApiServer, role: ProviderRole, resources: dict[str, str]) -> dict[str, Any]:
    obj = server.create(
        "resourceslices",
        {
            "metadata": {"name": PROVIDER, "namespace": TNS},
            "spec": {"providerClusterId": PROVIDER, "resources": resources},
        },
        api_version=API_VERSION,
    )
    role._on_slice("ADDED", obj)
    return obj


def _decided(server: FakeApiServer, role: ProviderRole) -> dict[str, Any]:
    """The slice's status, and the role's cache updated with it (as its watch would)."""
    obj = server.get("resourceslices", TNS, PROVIDER)
    assert obj is not None
    role._on_slice("MODIFIED", obj)
    status: dict[str, Any] = obj["status"]
    return status


SPEC = TenantSpec(consumer_cluster_id=CONSUMER, public_key="k")


async def test_a_storage_grant_carries_the_offered_classes_and_its_quota() -> None:
    async with serve() as (server, api):
        role = _role(api)
        _slice(server, role, {"nvidia.com/gpu": "2", "pods": "4", "storage": "200Gi"})
        status: dict[str, Any] = {}
        totals = await role.grants.decide(SPEC, CONSUMER, [TWIN], status)
        st = _decided(server, role)
        assert st["granted"]["storage"] == "150Gi", "three free 50Gi volumes: a partial grant"
        assert st["conditions"][-1]["reason"] == "PartialGrant"
        assert st["storageClasses"] == [{"name": "local-disk", "default": True, "accessModes": ["ReadWriteOnce"]}]
        assert totals.granted["storage"] == 150 * GI and status["granted"]["storage"] == "150Gi"
        quota = server.get("resourcequotas", TWIN, GRANT_QUOTA)
        assert quota is not None
        assert quota["spec"]["hard"]["requests.storage"] == "150Gi"
        assert quota["spec"]["hard"]["persistentvolumeclaims"] == "4", "one claim per granted pod slot"
        offered = role.grants.storage_offer(SPEC, CONSUMER)
        assert [o.name for o in offered] == ["local-disk"], "the twins offer the class once storage is granted"


async def test_without_storage_the_twins_offer_nothing_and_allow_no_claim() -> None:
    async with serve() as (server, api):
        role = _role(api)
        _slice(server, role, {"nvidia.com/gpu": "2", "pods": "4"})
        await role.grants.decide(SPEC, CONSUMER, [TWIN], {})
        st = _decided(server, role)
        assert "storageClasses" not in st and "storage" not in st["granted"]
        quota = server.get("resourcequotas", TWIN, GRANT_QUOTA)
        assert quota is not None
        assert quota["spec"]["hard"]["requests.storage"] == quota["spec"]["hard"]["persistentvolumeclaims"] == "0"
        assert role.grants.storage_offer(SPEC, CONSUMER) == ()


async def test_a_policy_without_classes_denies_a_slice_that_asks_for_storage() -> None:
    async with serve() as (server, api):
        role = _role(api)
        _slice(server, role, {"nvidia.com/gpu": "2", "storage": "10Gi"})
        spec = SPEC.model_copy(update={"policy": SPEC.policy.model_copy(update={"storage_classes": []})})
        await role.grants.decide(spec, CONSUMER, [TWIN], {})
        st = _decided(server, role)
        assert st["conditions"][-1]["reason"] == grants.Reason.NO_STORAGE_CLASS
        assert st.get("granted", {}) == {} and "storageClasses" not in st
        assert [e["reason"] for e in server.items("events", TNS)] == ["NoStorageClass"]


async def test_claims_count_in_the_consumers_usage_and_re_decide_it() -> None:
    role = _role(None)
    role.queue._due.clear()  # what the caches' first events queued
    claim = {
        "metadata": {"name": "data", "namespace": TWIN},
        "spec": {"resources": {"requests": {"storage": "10Gi"}}},
    }
    role._on_claim("ADDED", claim)
    role._on_claim("ADDED", {**claim, "metadata": {"name": "other", "namespace": "default"}})
    assert role.cache.usage(CONSUMER) == {TWIN: {"storage": 10 * GI, grants.CLAIMS: Decimal(1)}}
    assert len(role.queue) == 1, "the consumer's claim re-decides its grant"
    role._on_claim("DELETED", claim)
    assert role.cache.usage(CONSUMER) == {}
    role._on_storage_class("DELETED", LOCAL_DISK)
    assert role.cache.storage_classes == {}


async def test_the_claims_policy_is_applied_and_the_twins_carry_the_offer() -> None:
    async with serve() as (server, api):
        role = _role(api)
        await role.namespaces.ensure_admission_policy()
        assert server.get("validatingadmissionpolicies", "", podsecurity.CLAIMS_POLICY_NAME) is not None
        assert server.get("validatingadmissionpolicybindings", "", podsecurity.CLAIMS_POLICY_NAME) is not None
        tenant = server.create(
            "tenants",
            {"metadata": {"name": CONSUMER}, "spec": {"consumerClusterId": CONSUMER, "publicKey": "k"}},
            api_version=API_VERSION,
        )
        server.create(
            "twinnamespaces",
            {"metadata": {"name": "team-a", "namespace": TNS}, "spec": {"namespace": "team-a"}},
            api_version=API_VERSION,
        )
        offers = storage.offers(role.cache.storage_classes.values(), None)
        projection = await role.namespaces.projection(tenant, CONSUMER, offers)
        await role.namespaces.ensure_tenant_namespace(tenant, CONSUMER, projection)
        plan = await role.namespaces.twins(tenant, CONSUMER, role._log, projection)
        assert plan.ready == [TWIN]
        twin = server.get("namespaces", "", TWIN)
        assert twin is not None
        assert twin["metadata"]["annotations"][OFFERED_STORAGE_CLASSES_ANNOTATION] == "local-disk"
        assert twin["metadata"]["annotations"][OFFERED_STORAGE_ACCESS_MODES_ANNOTATION] == "local-disk:ReadWriteOnce"
        tns = server.get("namespaces", "", TNS)
        assert tns is not None and tns["metadata"]["annotations"][OFFERED_STORAGE_CLASSES_ANNOTATION] == ""
        quota = server.get("resourcequotas", TNS, GRANT_QUOTA)
        assert quota is not None and quota["spec"]["hard"]["persistentvolumeclaims"] == "0"


def test_the_consumer_copies_only_offers_that_validate() -> None:
    raw = [
        {"name": "local-disk", "default": True, "accessModes": ["ReadWriteOnce"]},
        {"name": "Bad Name", "accessModes": ["ReadWriteOnce"]},
        {"name": "shared", "default": True, "accessModes": ["ReadWriteMany", "Everything"]},
        {"name": "fast", "default": True, "accessModes": ["ReadWriteMany"]},
        "junk",
    ]
    assert storage_offers(raw) == [
        {"name": "local-disk", "default": True, "accessModes": ["ReadWriteOnce"]},
        {"name": "fast", "default": False, "accessModes": ["ReadWriteMany"]},
    ]
    assert storage_offers(None) == [] and storage_offers({"name": "x"}) == []
