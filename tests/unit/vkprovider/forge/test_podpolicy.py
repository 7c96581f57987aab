"""The offload pod-security policy: the model, the consumer's pure check (every refused field,
allowed cases, per-tenant overrides), the provider's admission policy and namespace projection,
and how the remote provider refuses early, from the published policy (the API server's refusals:
tests/unit/vkprovider/remote/test_refusals.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from gpufed.apis.offloading import OffloadPodSecurity, TwinNamespaceStatus, capability_name
from gpufed.apis.peering import TenantPolicy, TenantSpec
from gpufed.apis.wire import CONSUMER_LABEL
from peering import podsecurity
from peering.controllers.tenant_namespaces import pod_security, published
from vkprovider.forge.podpolicy import REASON, Violation, refusal, violations
from vkprovider.node.provider import ProviderError
from vkprovider.remote.provider import RemoteProvider, RemoteSettings

DEFAULT = OffloadPodSecurity()


def pod(spec: dict[str, Any] | None = None, **main: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team", "uid": "u1"},
        "spec": {"containers": [{"name": "main", "image": "x", **main}], **(spec or {})},
    }


def wheres(found: list[Violation]) -> list[str]:
    return [v.where for v in found]


# ---- the model


def test_the_default_policy_allows_nothing_and_is_the_tenant_default() -> None:
    assert TenantPolicy().pod_security == DEFAULT
    assert TenantSpec.model_validate({"consumerClusterId": "c", "publicKey": "k"}).policy.pod_security == DEFAULT
    assert not (DEFAULT.allow_privileged or DEFAULT.allow_host_namespaces or DEFAULT.allow_host_path)
    assert DEFAULT.allowed_capabilities == []


def test_capability_names_are_canonical() -> None:
    assert capability_name("cap_net_admin") == "NET_ADMIN"
    assert capability_name("Sys_Time") == "SYS_TIME"
    policy = OffloadPodSecurity.model_validate({"allowedCapabilities": ["net_admin", "CAP_NET_ADMIN", "SYS_TIME"]})
    assert policy.allowed_capabilities == ["NET_ADMIN", "SYS_TIME"]
    with pytest.raises(ValidationError):
        OffloadPodSecurity.model_validate({"allowedCapabilities": ["NET ADMIN"]})


def test_the_twin_namespace_status_carries_the_policy() -> None:
    st = TwinNamespaceStatus.model_validate({"phase": "Ready", "podSecurity": {"allowHostPath": True}})
    assert st.pod_security == OffloadPodSecurity(allow_host_path=True)
    assert TwinNamespaceStatus().pod_security is None  # an older provider publishes nothing


# ---- the consumer's check: every refused field


def test_a_plain_pod_passes() -> None:
    assert violations(pod(), DEFAULT) == []
    quiet = pod(
        {"volumes": [{"name": "v", "emptyDir": {}}], "hostNetwork": False},
        securityContext={"privileged": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True},
    )
    assert violations(quiet, DEFAULT) == []


@pytest.mark.parametrize(
    "field,noun",
    [("containers", "container"), ("initContainers", "init container"), ("ephemeralContainers", "ephemeral container")],
)
def test_privileged_is_refused_in_every_kind_of_container(field: str, noun: str) -> None:
    p = pod()
    p["spec"][field] = [{"name": "x", "image": "i", "securityContext": {"privileged": True}}]
    if field == "containers":
        p["spec"]["containers"].insert(0, {"name": "main", "image": "i"})
    found = violations(p, DEFAULT)
    assert found == [
        Violation("privileged containers", f"{noun} x: securityContext.privileged=true", "allowPrivileged")
    ]


@pytest.mark.parametrize("field", ["hostNetwork", "hostPID", "hostIPC"])
def test_each_host_namespace_is_refused(field: str) -> None:
    found = violations(pod({field: True}), DEFAULT)
    assert found == [Violation("host namespaces", f"spec.{field}=true", "allowHostNamespaces")]


def test_host_path_volumes_are_refused() -> None:
    p = pod({"volumes": [{"name": "ok", "emptyDir": {}}, {"name": "root", "hostPath": {"path": "/", "type": ""}}]})
    assert violations(p, DEFAULT) == [Violation("hostPath volumes", "volume root: hostPath /", "allowHostPath")]


def test_added_capabilities_are_refused_whatever_their_spelling() -> None:
    p = pod(securityContext={"capabilities": {"add": ["net_admin", "CAP_SYS_TIME"], "drop": ["ALL"]}})
    assert wheres(violations(p, DEFAULT)) == ["container main: securityContext.capabilities.add=net_admin,CAP_SYS_TIME"]


def test_every_violation_is_reported_in_a_stable_order() -> None:
    p = pod(
        {"hostPID": True, "hostIPC": True, "volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]},
        securityContext={"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
    )
    assert [v.allow_field for v in violations(p, DEFAULT)] == [
        "allowPrivileged",
        "allowedCapabilities",
        "allowHostNamespaces",
        "allowHostNamespaces",
        "allowHostPath",
    ]


# ---- per-tenant overrides


def test_each_allowance_lifts_only_its_rule() -> None:
    everything = pod(
        {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/dev"}}]},
        securityContext={"privileged": True, "capabilities": {"add": ["NET_ADMIN"]}},
    )
    rules = {v.allow_field for v in violations(everything, DEFAULT)}
    assert rules == {"allowPrivileged", "allowHostNamespaces", "allowHostPath", "allowedCapabilities"}
    for policy, lifted in [
        (OffloadPodSecurity(allow_privileged=True), "allowPrivileged"),
        (OffloadPodSecurity(allow_host_namespaces=True), "allowHostNamespaces"),
        (OffloadPodSecurity(allow_host_path=True), "allowHostPath"),
        (OffloadPodSecurity(allowed_capabilities=["NET_ADMIN"]), "allowedCapabilities"),
    ]:
        assert {v.allow_field for v in violations(everything, policy)} == rules - {lifted}


def test_allowed_capabilities_are_an_allow_list() -> None:
    policy = OffloadPodSecurity.model_validate({"allowedCapabilities": ["cap_net_admin"]})
    assert violations(pod(securityContext={"capabilities": {"add": ["NET_ADMIN", "net_admin"]}}), policy) == []
    found = violations(pod(securityContext={"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}}), policy)
    assert wheres(found) == ["container main: securityContext.capabilities.add=SYS_ADMIN"]
    anything = OffloadPodSecurity(allowed_capabilities=["ALL"])
    assert violations(pod(securityContext={"capabilities": {"add": ["SYS_ADMIN", "ALL"]}}), anything) == []


def test_the_refusal_names_the_provider_the_fields_and_what_would_allow_it() -> None:
    p = pod({"hostNetwork": True}, securityContext={"privileged": True})
    p["spec"]["containers"].append({"name": "side", "image": "x", "securityContext": {"privileged": True}})
    assert refusal("gpu-a", violations(p, DEFAULT)) == (
        "provider gpu-a refuses privileged containers (container main: securityContext.privileged=true, "
        "container side: securityContext.privileged=true); ask the provider to allow it in "
        "Tenant spec.policy.podSecurity.allowPrivileged; provider gpu-a refuses host namespaces "
        "(spec.hostNetwork=true); ask the provider to allow it in Tenant spec.policy.podSecurity.allowHostNamespaces"
    )


def test_the_pod_is_not_mutated() -> None:
    p = pod({"hostPID": True}, securityContext={"privileged": True, "capabilities": {"add": ["x"]}})
    before = copy.deepcopy(p)
    violations(p, DEFAULT)
    assert p == before


# ---- the provider side: projection, admission policy, published copy


def test_the_policy_is_projected_onto_the_consumer_namespaces() -> None:
    labels, annotations = podsecurity.namespace_metadata(DEFAULT)
    assert labels == {
        "gpufed.io/allow-privileged": "false",
        "gpufed.io/allow-host-namespaces": "false",
        "gpufed.io/allow-host-path": "false",
    }
    assert annotations == {"gpufed.io/allowed-capabilities": ""}
    policy = OffloadPodSecurity(allow_privileged=True, allowed_capabilities=["SYS_TIME", "NET_ADMIN"])
    labels, annotations = podsecurity.namespace_metadata(policy)
    assert labels["gpufed.io/allow-privileged"] == "true"
    assert annotations == {"gpufed.io/allowed-capabilities": "NET_ADMIN,SYS_TIME"}


def test_the_admission_policy_checks_every_rule_in_every_consumer_namespace() -> None:
    policy = podsecurity.admission_policy()
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {r["resources"][0]: r["operations"] for r in rules} == {
        "pods": ["CREATE"],
        "pods/ephemeralcontainers": ["UPDATE"],
    }
    validations = policy["spec"]["validations"]
    text = " ".join(v["expression"] for v in validations)
    for needle in (
        "privileged",
        "capabilities.?add",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostPath",
        "initContainers",
        "ephemeralContainers",
    ):
        assert needle in text, needle
    for v in validations:
        assert v["reason"] == "Forbidden"
        assert "ask the provider to allow it in Tenant spec.policy.podSecurity." in v["message"]
    names = {v["name"] for v in policy["spec"]["variables"]}
    assert {"allowPrivileged", "allowHostNamespaces", "allowHostPath", "allowedCapabilities"} <= names
    binding = podsecurity.admission_binding()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == podsecurity.POLICY_NAME
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchExpressions": [{"key": CONSUMER_LABEL, "operator": "Exists"}]
    }


def test_describe_says_what_is_refused_and_allowed() -> None:
    assert podsecurity.describe(DEFAULT) == (
        "refused: privileged containers, host namespaces, hostPath volumes, added capabilities"
    )
    assert podsecurity.describe(OffloadPodSecurity(allow_host_path=True, allowed_capabilities=["NET_ADMIN"])) == (
        "refused: privileged containers, host namespaces, added capabilities other than NET_ADMIN; "
        "allowed: hostPath volumes"
    )


def test_the_provider_reads_and_publishes_the_tenant_policy() -> None:
    tenant = {
        "spec": {"consumerClusterId": "c", "publicKey": "k", "policy": {"podSecurity": {"allowPrivileged": True}}}
    }
    assert pod_security(tenant) == OffloadPodSecurity(allow_privileged=True)
    assert pod_security({"spec": {"policy": {"maxResources": {"bogus": "1"}}}}) == DEFAULT  # unreadable: strictest
    # Empty lists are left out of the applied status; the booleans always say what is refused.
    assert published(DEFAULT) == {"allowPrivileged": False, "allowHostNamespaces": False, "allowHostPath": False}
    assert published(OffloadPodSecurity(allowed_capabilities=["NET_ADMIN"]))["allowedCapabilities"] == ["NET_ADMIN"]


# ---- the remote provider: early refusal, API server refusal, a policy change


def remote() -> tuple[RemoteProvider, list[tuple[str, str]]]:
    provider = RemoteProvider(None, None, RemoteSettings(consumer="consumer-1", provider="gpu-a", node="gpufed-gpu-a"))
    notified: list[tuple[str, str]] = []
    provider.subscribe(lambda ns, name: notified.append((ns, name)))
    return provider, notified


def twin_namespace(policy: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Ready", "twin": "team-consumer-1"}
    if policy is not None:
        status["podSecurity"] = policy
    return {
        "metadata": {"name": "team", "namespace": "gpufed-tenant-consumer-1"},
        "spec": {"namespace": "team"},
        "status": status,
    }


async def test_a_refused_pod_gets_no_twin_and_is_not_retried() -> None:
    provider, notified = remote()
    provider._on_twin_namespace("ADDED", twin_namespace({"allowPrivileged": False}))
    # No API is reachable (None): the refusal comes before any call to the provider.
    with pytest.raises(ProviderError) as e:
        await provider.create_pod(pod(securityContext={"privileged": True}))
    assert e.value.reason == REASON and not e.value.retry and not e.value.fail_back
    assert str(e.value).startswith("provider gpu-a refuses privileged containers (container main:")
    # The provider allows it now: the refused pod is woken up, once.
    provider._on_twin_namespace("MODIFIED", twin_namespace({"allowPrivileged": True}))
    assert notified == [("team", "p")]
    provider._on_twin_namespace("MODIFIED", twin_namespace({"allowPrivileged": True}))
    assert notified == [("team", "p")]
    assert provider.pod_security["team"] == OffloadPodSecurity(allow_privileged=True)


async def test_without_a_published_policy_the_provider_decides() -> None:
    provider, _ = remote()
    provider._on_twin_namespace("ADDED", twin_namespace(None))
    assert provider.pod_security["team"] is None
    provider._check_pod_security(pod(securityContext={"privileged": True}))  # no early refusal
    provider._on_twin_namespace("DELETED", twin_namespace({"allowPrivileged": False}))
    assert "team" not in provider.pod_security
