"""The provider role against the in-memory API server: a Tenant from first sight to an
authenticated consumer with its namespaces, twin, grant and quotas (peering.controllers.provider,
tenant_handshake, tenant_namespaces, tenant_grants)."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.offloading import OffloadPodSecurity
from gpufed.apis.wire import (
    CONSUMER_CONTROL_ROLE,
    CONSUMER_LABEL,
    CONSUMER_WORKLOADS_ROLE,
    GRANT_QUOTA,
    SYSTEM_NAMESPACE,
    TWIN_OF_LABEL,
    ClusterID,
    tenant_namespace,
)
from gpufed.kube import conditions as cond
from peering import handshake, podsecurity
from peering.controllers.identity import Identity
from peering.controllers.provider import ProviderRole
from peering.controllers.tenant_grants import CapacityCache, grant_of, quota_amounts, total
from peering.controllers.tenant_namespaces import pod_security, published
from peering.grants import PodLoad
from tests.unit.fakes import FakeApiServer, serve

PROVIDER = ClusterID("prov-tenant-0001")
CONSUMER = ClusterID("cons-tenant-0001")
TNS = tenant_namespace(CONSUMER)
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def _role(api: Any) -> ProviderRole:
    return ProviderRole(api, Identity(PROVIDER, "", Ed25519PrivateKey.generate()))


def _tenant(server: FakeApiServer, key: Ed25519PrivateKey, **spec: Any) -> dict[str, Any]:
    body = {"consumerClusterId": CONSUMER, "publicKey": handshake.public_key_pem(key), **spec}
    return server.create("tenants", {"metadata": {"name": CONSUMER}, "spec": body}, api_version=API_VERSION)


def _status(server: FakeApiServer, resource: str = "tenants", namespace: str = "", name: str = CONSUMER) -> Any:
    obj = server.get(resource, namespace, name)
    assert obj is not None
    return obj.get("status") or {}


async def test_a_tenant_whose_name_is_not_its_consumer_is_refused() -> None:
    async with serve() as (server, api):
        server.create(
            "tenants",
            {"metadata": {"name": "someone-else"}, "spec": {"consumerClusterId": CONSUMER, "publicKey": "k"}},
            api_version=API_VERSION,
        )
        assert await _role(api).reconcile("someone-else") is None
        status = _status(server, name="someone-else")
        assert status["phase"] == "Refused"
        assert cond.reason_of(status["conditions"], "Authentication") == "InvalidTenant"
        assert server.items("namespaces") == []


async def test_a_new_tenant_is_challenged_after_the_admission_policy_is_applied() -> None:
    async with serve() as (server, api):
        _tenant(server, Ed25519PrivateKey.generate())
        requeue = await _role(api).reconcile(CONSUMER)
        assert requeue is not None and requeue <= handshake.DEFAULT_CHALLENGE_TTL.total_seconds()
        status = _status(server)
        assert status["phase"] == "Challenged"
        assert handshake.Challenge.from_wire(status["challenge"]).consumer == CONSUMER
        assert cond.reason_of(status["conditions"], "Authentication") == "Challenged"
        assert not cond.is_true(status["conditions"], "Ready")
        assert cond.reason_of(status["conditions"], "Ready") == "Challenged", "the first thing missing"
        assert server.get("validatingadmissionpolicies", "", podsecurity.POLICY_NAME) is not None
        assert server.get("validatingadmissionpolicybindings", "", podsecurity.POLICY_NAME) is not None


def _answer(server: FakeApiServer, key: Ed25519PrivateKey) -> None:
    """What `gpufed peer` copies into the Tenant: the consumer's answer to the current challenge."""
    challenge = handshake.Challenge.from_wire(_status(server)["challenge"])
    csr = handshake.make_csr(CONSUMER, ec.generate_private_key(ec.SECP256R1()))
    signature = handshake.sign(key, challenge, csr)
    answer = {
        "nonce": base64.b64encode(challenge.nonce).decode(),
        "csr": csr.decode(),
        "signature": base64.b64encode(signature).decode(),
    }
    server.update("tenants", "", CONSUMER, lambda t: t["spec"].update(answer=answer))


def _quota_controller(server: FakeApiServer) -> None:
    """What kube-controller-manager's quota controller does: compute the status of every quota."""
    for q in server.items("resourcequotas"):

        def computed(o: dict[str, Any]) -> None:
            o["status"] = {"hard": dict(o["spec"]["hard"])}

        server.update("resourcequotas", q["metadata"]["namespace"], q["metadata"]["name"], computed)


def _sign_csr(server: FakeApiServer, name: str) -> None:
    """What kube-controller-manager does once the CSR is approved."""
    cert = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nissued\n-----END CERTIFICATE-----\n").decode()
    server.update("certificatesigningrequests", "", name, lambda c: c["status"].update(certificate=cert))


def _signed_with_a_twin(server: FakeApiServer, csr_name: str) -> None:
    """The consumer's certificate signed, the cluster's CA published, and a twin namespace asked for."""
    _sign_csr(server, csr_name)
    server.create(
        "configmaps",
        {"metadata": {"name": "kube-root-ca.crt", "namespace": SYSTEM_NAMESPACE}, "data": {"ca.crt": "CA"}},
    )
    server.create(
        "twinnamespaces",
        {"metadata": {"name": "team-a", "namespace": TNS}, "spec": {"namespace": "team-a"}},
        api_version=API_VERSION,
    )


async def test_an_answered_challenge_ends_authenticated_with_namespaces_twins_and_quotas() -> None:
    key = Ed25519PrivateKey.generate()
    async with serve() as (server, api):
        _tenant(server, key, policy={"podSecurity": {"allowHostPath": True}, "ingressAnnotations": ["example.com/*"]})
        role = _role(api)
        await role.reconcile(CONSUMER)
        _answer(server, key)
        assert await role.reconcile(CONSUMER) == 0.5, "the CSR is submitted and approved, not yet signed"
        csr_name = _status(server)["csrName"]
        csr = server.get("certificatesigningrequests", "", csr_name)
        assert csr is not None and csr["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client"
        assert [c["type"] for c in csr["status"]["conditions"]] == ["Approved"]
        assert server.get("namespaces", "", TNS) is not None, "the tenant namespace exists before the certificate"
        _signed_with_a_twin(server, csr_name)
        assert await role.reconcile(CONSUMER) == 1.0, "the quotas are not in force yet"
        # No role is bound before its namespace's quota holds, and the twin is not Ready before either.
        assert server.items("rolebindings", TNS) == [] and server.items("rolebindings", f"team-a-{CONSUMER}") == []
        assert _status(server, "twinnamespaces", TNS, "team-a")["phase"] == "Pending"
        _quota_controller(server)
        await role.reconcile(CONSUMER)
        status = _status(server)
        assert status["phase"] == "Authenticated" and status["caData"] == "CA"
        assert cond.is_true(status["conditions"], "Authentication")
        assert cond.reason_of(status["conditions"], "PodSecurity") == "Enforced"
        assert cond.is_true(status["conditions"], "Namespaces")
        assert cond.is_true(status["conditions"], "Ready"), status["conditions"]
        assert {c["observedGeneration"] for c in status["conditions"]} == {1}
        twin = f"team-a-{CONSUMER}"
        assert status["twinNamespaces"] == [twin] and status["namespace"] == TNS
        ns = server.get("namespaces", "", twin)
        assert ns is not None
        assert ns["metadata"]["labels"][CONSUMER_LABEL] == CONSUMER
        assert ns["metadata"]["labels"][TWIN_OF_LABEL] == "team-a"
        assert {b["metadata"]["name"] for b in server.items("rolebindings", TNS)} == {
            CONSUMER_CONTROL_ROLE,
            CONSUMER_WORKLOADS_ROLE,
        }
        assert {b["metadata"]["name"] for b in server.items("rolebindings", twin)} == {CONSUMER_WORKLOADS_ROLE}
        assert server.get("limitranges", twin, GRANT_QUOTA) is not None
        tenant_quota = server.get("resourcequotas", TNS, GRANT_QUOTA)
        assert tenant_quota is not None and tenant_quota["spec"]["hard"]["pods"] == "0"
        assert tenant_quota["spec"]["hard"]["count/twinnamespaces.gpufed.io"] == "200"
        twin_quota = server.get("resourcequotas", twin, GRANT_QUOTA)
        assert twin_quota is not None
        assert {"services.nodeports": "0", "services.loadbalancers": "0"}.items() <= twin_quota["spec"]["hard"].items()
        assert "limits.ephemeral-storage" in twin_quota["spec"]["hard"]
        labels = ns["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged", "hostPath is allowed: PSA is lifted"
        assert labels["pod-security.kubernetes.io/warn"] == "baseline"
        twin_status = _status(server, "twinnamespaces", TNS, "team-a")
        assert twin_status["phase"] == "Ready" and twin_status["podSecurity"]["allowHostPath"] is True
        assert cond.is_true(twin_status["conditions"], "Ready")
        assert {c["observedGeneration"] for c in twin_status["conditions"]} == {1}
        assert twin_status["ingressAnnotations"] == ["example.com/*"], "reflection sends only what will pass"


async def test_a_twin_name_taken_by_another_namespace_is_refused() -> None:
    async with serve() as (server, api):
        server.create("namespaces", {"metadata": {"name": "taken"}})
        server.create(
            "twinnamespaces",
            {"metadata": {"name": "x", "namespace": TNS}, "spec": {"namespace": "team-a", "twinName": "taken"}},
            api_version=API_VERSION,
        )
        tenant = _tenant(server, Ed25519PrivateKey.generate())
        role = _role(api)
        assert (await role.namespaces.twins(tenant, CONSUMER, role._log)).ready == []
        status = _status(server, "twinnamespaces", TNS, "x")
        assert status["phase"] == "Refused"
        assert cond.reason_of(status["conditions"], "Ready") == "NamespaceTaken"
        taken = server.get("namespaces", "", "taken")
        assert taken is not None and CONSUMER_LABEL not in (taken["metadata"].get("labels") or {})
        assert [e["reason"] for e in server.items("events", TNS)] == ["NamespaceTaken"]


async def test_default_twin_names_of_two_consumers_never_share_a_namespace() -> None:
    """`a` of consumer `b-c` and `a-b` of consumer `c` both name `a-b-c`: the first one keeps it."""
    async with serve() as (server, api):
        first, second = ClusterID("b-c"), ClusterID("c")
        for consumer, namespace in ((first, "a"), (second, "a-b")):
            server.create(
                "twinnamespaces",
                {
                    "metadata": {"name": namespace, "namespace": tenant_namespace(consumer)},
                    "spec": {"namespace": namespace},
                },
                api_version=API_VERSION,
            )
        role = _role(api)
        tenants = {
            c: {
                "apiVersion": API_VERSION,
                "kind": "Tenant",
                "metadata": {"name": c, "uid": f"uid-{c}"},
                "spec": {"consumerClusterId": c, "publicKey": "k"},
            }
            for c in (first, second)
        }
        assert (await role.namespaces.twins(tenants[first], first, role._log)).ready == ["a-b-c"]
        assert (await role.namespaces.twins(tenants[second], second, role._log)).ready == []
        ns = server.get("namespaces", "", "a-b-c")
        assert ns is not None and ns["metadata"]["labels"][CONSUMER_LABEL] == first
        status = _status(server, "twinnamespaces", tenant_namespace(second), "a-b")
        assert status["phase"] == "Refused" and cond.reason_of(status["conditions"], "Ready") == "NamespaceTaken"


@pytest.mark.parametrize(
    "twin_name", ["default", "kube-system", "kube-anything", "gpufed", "gpufed-tenant-x-1", "gpufed-x"]
)
async def test_a_reserved_twin_name_is_refused_with_an_event(twin_name: str) -> None:
    async with serve() as (server, api):
        server.create(
            "twinnamespaces",
            {"metadata": {"name": "x", "namespace": TNS}, "spec": {"namespace": "team-a", "twinName": twin_name}},
            api_version=API_VERSION,
        )
        tenant = _tenant(server, Ed25519PrivateKey.generate())
        role = _role(api)
        assert (await role.namespaces.twins(tenant, CONSUMER, role._log)).ready == []
        status = _status(server, "twinnamespaces", TNS, "x")
        assert status["phase"] == "Refused"
        assert cond.reason_of(status["conditions"], "Ready") in ("NamespaceReserved", "InvalidRequest")
        assert server.get("namespaces", "", twin_name) is None


async def test_a_reserved_default_twin_name_is_refused() -> None:
    """The consumer namespace `kube` would twin to `kube-<consumer>`: reserved whatever spelled it."""
    async with serve() as (server, api):
        server.create(
            "twinnamespaces",
            {"metadata": {"name": "x", "namespace": TNS}, "spec": {"namespace": "kube"}},
            api_version=API_VERSION,
        )
        tenant = _tenant(server, Ed25519PrivateKey.generate())
        role = _role(api)
        assert (await role.namespaces.twins(tenant, CONSUMER, role._log)).ready == []
        status = _status(server, "twinnamespaces", TNS, "x")
        assert cond.reason_of(status["conditions"], "Ready") == "NamespaceReserved"
        assert [e["reason"] for e in server.items("events", TNS)] == ["NamespaceReserved"]


async def test_a_tenant_namespace_someone_else_holds_is_left_alone() -> None:
    async with serve() as (server, api):
        server.create("namespaces", {"metadata": {"name": TNS, "labels": {CONSUMER_LABEL: "someone-else"}}})
        tenant = _tenant(server, Ed25519PrivateKey.generate())
        role = _role(api)
        assert await role.namespaces.ensure_tenant_namespace(tenant, CONSUMER) is False
        ns = server.get("namespaces", "", TNS)
        assert ns is not None and ns["metadata"]["labels"] == {CONSUMER_LABEL: "someone-else"}
        assert server.items("rolebindings", TNS) == [] and server.items("resourcequotas", TNS) == []


async def test_endpoint_ranges_come_from_the_fabric() -> None:
    async with serve() as (server, api):
        role = _role(api)
        assert await role.namespaces._endpoint_cidrs(CONSUMER) == podsecurity.PRIVATE_CIDRS
        server.create(
            "networkconfigs",
            {"metadata": {"name": "local", "namespace": SYSTEM_NAMESPACE}, "spec": {"podCidr": "10.244.0.0/16"}},
            api_version=API_VERSION,
        )
        assert await role.namespaces._endpoint_cidrs(CONSUMER) == ("10.244.0.0/16",)
        server.create(
            "remotenetworks",
            {
                "metadata": {"name": CONSUMER, "namespace": SYSTEM_NAMESPACE},
                "spec": {"mapped": {"podCidr": "10.81.0.0/16", "externalCidr": "10.82.0.0/16"}},
            },
            api_version=API_VERSION,
        )
        assert await role.namespaces._endpoint_cidrs(CONSUMER) == ("10.244.0.0/16", "10.81.0.0/16", "10.82.0.0/16")


def test_the_global_default_priority_class_is_followed() -> None:
    role = _role(None)
    seen: list[str | None] = []
    for kind, obj in (
        ("ADDED", {"metadata": {"name": "low"}, "value": 1}),
        ("ADDED", {"metadata": {"name": "standard"}, "value": 10, "globalDefault": True}),
        ("MODIFIED", {"metadata": {"name": "standard"}, "value": 10, "globalDefault": False}),
    ):
        role._on_priority_class(kind, obj)
        seen.append(role.namespaces.default_priority_class)
    assert seen == [None, "standard", None]


def test_the_tenant_policy_is_read_strictly_and_published_without_empty_lists() -> None:
    assert pod_security({"spec": {"policy": "unreadable"}}) == OffloadPodSecurity()
    assert "allowedCapabilities" not in published(OffloadPodSecurity())


def test_usage_and_grant_shares_follow_the_cache() -> None:
    cache = CapacityCache()
    cache.ns_owner = {TNS: CONSUMER, "team-a": CONSUMER}
    cache.pods = {
        ("team-a", "p1"): ("team-a", PodLoad("n1", {"cpu": Decimal(2)})),
        ("team-a", "p2"): ("team-a", PodLoad("n1", {"cpu": Decimal(1)})),
        ("other", "p3"): ("other", PodLoad("n1", {"cpu": Decimal(5)})),
    }
    assert cache.usage(CONSUMER) == {"team-a": {"cpu": Decimal(3)}}
    cache.slices = {
        (TNS, "a"): {"spec": {"gpuProduct": "L4"}, "status": {"granted": {"cpu": "2"}}},
        (TNS, "b"): {"status": {"granted": {"cpu": "4"}}},
        (TNS, "bad"): {"status": {"granted": {"cpu": "lots"}}},
    }
    shares = cache.grant_shares()
    assert set(shares) == {(TNS, "a"), (TNS, "b")}, "an unreadable grant is skipped"
    assert shares[(TNS, "a")].used == {"cpu": Decimal(2)} and shares[(TNS, "a")].gpu_product == "L4"
    assert shares[(TNS, "b")].used == {"cpu": Decimal(1)}, "usage is attributed in slice-name order"
    assert grant_of(None) == {} and total([{"cpu": Decimal(1)}, {"cpu": Decimal(2)}]) == {"cpu": Decimal(3)}


@pytest.mark.parametrize("kind", ["ADDED", "DELETED"])
def test_a_slice_outside_tenant_namespaces_is_ignored(kind: str) -> None:
    role = _role(None)
    role._on_slice(kind, {"metadata": {"name": "s", "namespace": "default"}})
    assert role.cache.slices == {}


async def test_capacity_churn_re_decides_the_grant_alone_until_something_else_changes() -> None:
    key = Ed25519PrivateKey.generate()
    async with serve() as (server, api):
        role = _role(api)
        role._on_tenant("ADDED", _tenant(server, key))
        await role.reconcile(CONSUMER)
        _answer(server, key)
        await role.reconcile(CONSUMER)
        _signed_with_a_twin(server, _status(server)["csrName"])
        await role.reconcile(CONSUMER)
        _quota_controller(server)
        for q in server.items("resourcequotas"):
            role._on_quota("MODIFIED", q)  # what the quota watch tells the role
        await role.reconcile(CONSUMER)  # settled: namespaces opened
        twin = f"team-a-{CONSUMER}"
        assert _status(server, "twinnamespaces", TNS, "team-a")["phase"] == "Ready"

        # a pod of the consumer starts: the grant alone is re-decided, nothing else is read or written
        before = len(server.requests)
        role.cache.ns_owner[twin] = CONSUMER
        role.cache.pods[(twin, "p")] = (twin, PodLoad("n1", {"cpu": Decimal(1)}))
        role._on_pod("ADDED", {"metadata": {"namespace": twin, "name": "q"}, "spec": {}, "status": {}})
        assert CONSUMER not in role._full
        await role.reconcile(CONSUMER)
        made = [(r.method, r.path) for r in server.requests[before:]]
        quota_path = f"/api/v1/namespaces/{twin}/resourcequotas/{GRANT_QUOTA}"
        assert made == [
            ("GET", f"/apis/{API_VERSION}/tenants/{CONSUMER}"),
            ("PATCH", quota_path),  # no grant: the twin is held at its usage
            ("PATCH", f"/apis/{API_VERSION}/tenants/{CONSUMER}/status"),
        ], made
        assert _status(server)["used"]["cpu"] == "1"
        # the quota's usage follows the pod: nothing to do
        quota = server.get("resourcequotas", twin, GRANT_QUOTA)
        assert quota is not None
        role._on_quota("MODIFIED", {**quota, "status": {**quota["status"], "used": {"cpu": "1"}}})
        assert CONSUMER not in role._full
        # the same churn again: the quota the watch shows is what the grant wants, the status too
        before = len(server.requests)
        await role.reconcile(CONSUMER)
        assert [(r.method, r.path) for r in server.requests[before:]] == [
            ("GET", f"/apis/{API_VERSION}/tenants/{CONSUMER}")
        ]
        # a twin namespace changes: the next reconcile is full again (and repairs it)
        ns = server.get("namespaces", "", twin)
        assert ns is not None
        role._on_namespace("MODIFIED", ns)
        assert CONSUMER in role._full
        before = len(server.requests)
        await role.reconcile(CONSUMER)
        assert any(r.path.endswith(f"/namespaces/{twin}") for r in server.requests[before:])


def test_a_quota_is_compared_by_amount_as_the_api_server_rewrites_quantities() -> None:
    assert quota_amounts({"limits.ephemeral-storage": "20480Gi", "pods": "10"}) == quota_amounts(
        {"limits.ephemeral-storage": "20Ti", "pods": "10"}
    )
    assert quota_amounts({"pods": "10"}) != quota_amounts({"pods": "11"})
    assert quota_amounts({"odd": "x"}) == {"odd": "x"}
