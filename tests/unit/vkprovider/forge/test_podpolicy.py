"""The offload pod-security policy: the model, the consumer's pure check (every rule against a table of
pods, allowed cases, per-tenant overrides, a local pod checked as its twin), and how the remote
provider refuses early, from the published policy (the namespace projection:
tests/unit/peering/test_podsecurity.py; the provider's admission policy: tests/unit/peering/admission/;
the API server's refusals:
tests/unit/vkprovider/remote/test_refusals.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from gpufed.apis.offloading import OffloadPodSecurity, TwinNamespaceStatus, capability_name
from gpufed.apis.peering import TenantPolicy, TenantSpec
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
    assert not DEFAULT.allow_host_ports and DEFAULT.level == "baseline"
    assert DEFAULT.allowed_capabilities == DEFAULT.allowed_volume_types == DEFAULT.allowed_tolerations == []
    assert DEFAULT.allowed_priority_classes == []


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


# ---- every rule, against a table of pods (the same table went through kube-apiserver's own
# ValidatingAdmissionPolicy code, k8s.io/apiserver v0.36.3, with the rendered policy: same refusals)

RESTRICTED = OffloadPodSecurity(level="restricted")
CONFINED = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "capabilities": {"drop": ["ALL"]},
}
#: name -> (pod, policy, the rules it breaks: podsecurity rule ids, in order)
TABLE: dict[str, tuple[dict[str, Any], OffloadPodSecurity, list[str]]] = {
    "host port 22": (pod(ports=[{"containerPort": 22, "hostPort": 22}, {"containerPort": 80}]), DEFAULT, ["hostPorts"]),
    "host port allowed": (
        pod(ports=[{"containerPort": 22, "hostPort": 22}]),
        OffloadPodSecurity(allow_host_ports=True),
        [],
    ),
    "nfs volume": (
        pod({"volumes": [{"name": "d", "nfs": {"server": "10.0.0.1", "path": "/"}}]}),
        DEFAULT,
        ["volumeTypes"],
    ),
    "nfs allowed": (
        pod({"volumes": [{"name": "d", "nfs": {"server": "10.0.0.1", "path": "/"}}]}),
        OffloadPodSecurity(allowed_volume_types=["nfs"]),
        [],
    ),
    "inline csi": (pod({"volumes": [{"name": "c", "csi": {"driver": "x"}}]}), DEFAULT, ["volumeTypes"]),
    "generic ephemeral": (pod({"volumes": [{"name": "c", "ephemeral": {}}]}), DEFAULT, ["volumeTypes"]),
    "a volume type nobody knows": (pod({"volumes": [{"name": "c", "futureThing": {}}]}), DEFAULT, ["volumeTypes"]),
    "the default volume types": (
        pod(
            {
                "volumes": [
                    {"name": "a", "configMap": {"name": "x"}},
                    {"name": "b", "secret": {"secretName": "s"}},
                    {"name": "c", "projected": {"sources": []}},
                    {"name": "d", "downwardAPI": {}},
                    {"name": "e", "emptyDir": {}},
                    {"name": "f", "persistentVolumeClaim": {"claimName": "x"}},
                ]
            }
        ),
        DEFAULT,
        [],
    ),
    "seccomp Unconfined (pod)": (
        pod({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        DEFAULT,
        ["seccomp"],
    ),
    "seccomp Unconfined (container)": (
        pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
        DEFAULT,
        ["seccomp"],
    ),
    "seccomp Localhost": (
        pod(securityContext={"seccompProfile": {"type": "Localhost", "localhostProfile": "p"}}),
        DEFAULT,
        [],
    ),
    "AppArmor unconfined (annotation)": (
        {
            **pod(),
            "metadata": {"name": "p", "annotations": {podsecurity.APPARMOR_ANNOTATION_PREFIX + "main": "unconfined"}},
        },
        DEFAULT,
        ["appArmor"],
    ),
    "AppArmor Unconfined (field)": (
        pod(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
        DEFAULT,
        ["appArmor"],
    ),
    "SELinux spc_t": (pod({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}), DEFAULT, ["seLinux"]),
    "SELinux user": (pod(securityContext={"seLinuxOptions": {"user": "system_u"}}), DEFAULT, ["seLinux"]),
    "SELinux container_t": (
        pod(securityContext={"seLinuxOptions": {"type": "container_t", "level": "s0:c1"}}),
        DEFAULT,
        [],
    ),
    "unmasked /proc": (pod(securityContext={"procMount": "Unmasked"}), DEFAULT, ["procMount"]),
    "unsafe sysctl": (
        pod({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
        DEFAULT,
        ["sysctls"],
    ),
    "safe sysctl": (
        pod({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}}),
        DEFAULT,
        [],
    ),
    "Windows hostProcess": (
        pod({"securityContext": {"windowsOptions": {"hostProcess": True}}}),
        DEFAULT,
        ["hostProcess"],
    ),
    "toleration of every taint": (pod({"tolerations": [{"operator": "Exists"}]}), DEFAULT, ["tolerations"]),
    "toleration of the control plane": (
        pod({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}),
        DEFAULT,
        ["tolerations"],
    ),
    "not-ready forever": (
        pod({"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]}),
        DEFAULT,
        ["tolerations"],
    ),
    "GPU taint and a timed not-ready": (
        pod(
            {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "tolerationSeconds": 60},
                ]
            }
        ),
        DEFAULT,
        [],
    ),
    "an allowed taint key": (
        pod({"tolerations": [{"key": "dedicated", "effect": "NoSchedule"}]}),
        OffloadPodSecurity(allowed_tolerations=["dedicated"]),
        [],
    ),
    "MIG and huge pages": (
        pod(resources={"requests": {"nvidia.com/mig-1g.10gb": "1", "cpu": "1"}, "limits": {"hugepages-2Mi": "1Gi"}}),
        DEFAULT,
        ["resources"],
    ),
    "a resource claim by name": (pod({"resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}]}), DEFAULT, []),
    "a resource claim template in a twin": (
        pod({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "x"}]}),
        DEFAULT,
        ["resources"],
    ),
    "granted resources": (
        pod(resources={"requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi", "nvidia.com/gpu": "1"}}),
        DEFAULT,
        [],
    ),
    "restricted: a confined pod": (pod(securityContext=CONFINED), RESTRICTED, []),
    "restricted: runAsUser 0": (
        pod({"securityContext": {"runAsUser": 0}}, securityContext=CONFINED),
        RESTRICTED,
        ["runAsUser"],
    ),
    "restricted: a bare pod": (
        pod(),
        RESTRICTED,
        ["privilegeEscalation", "runAsNonRoot", "seccompRequired", "dropAll"],
    ),
    "restricted: pod-level settings count": (
        pod(
            {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}},
            securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        ),
        RESTRICTED,
        [],
    ),
    "baseline: runAsUser 0 is allowed": (pod(securityContext={"runAsUser": 0}), DEFAULT, []),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_each_rule_against_the_table(name: str) -> None:
    p, policy, rules = TABLE[name]
    found = violations(p, policy, local=False)
    assert [v.rule for v in found] == rules, [v.where for v in found]
    for v in found:
        rule = next(r for r in podsecurity.RULES if r.id == v.rule)
        assert (v.what, v.allow_field, v.tail) == (rule.what, rule.allow, rule.tail)


def test_every_rule_words_its_place_and_its_remedy() -> None:
    p = pod(
        {
            "securityContext": {
                "seLinuxOptions": {"type": "spc_t"},
                "sysctls": [{"name": "kernel.msgmax", "value": "1"}],
            }
        },
        ports=[{"containerPort": 22, "hostPort": 22}],
        securityContext={"seccompProfile": {"type": "Unconfined"}, "procMount": "Unmasked"},
    )
    assert refusal("gpu-a", violations(p, DEFAULT)) == (
        "provider gpu-a refuses host ports (container main: ports.hostPort=22); ask the provider to allow it in "
        "Tenant spec.policy.podSecurity.allowHostPorts; "
        "provider gpu-a refuses Unconfined seccomp profiles (container main: "
        "securityContext.seccompProfile.type=Unconfined) (Pod Security baseline); "
        "provider gpu-a refuses SELinux options other than the container types "
        "(spec.securityContext.seLinuxOptions.type=spc_t) (Pod Security baseline); "
        "provider gpu-a refuses unmasked /proc mounts (container main: securityContext.procMount=Unmasked) "
        "(Pod Security baseline); "
        "provider gpu-a refuses unsafe sysctls (spec.securityContext.sysctls kernel.msgmax) (Pod Security baseline)"
    )


def test_a_local_pod_is_checked_as_its_twin() -> None:
    """What the forge drops (the chosen virtual node, the priority class, the virtual node's and the
    default tolerations) is not held against the local pod; the twin itself is held to all of it."""
    p = pod(
        {
            "nodeName": "gpufed-gpu-a",
            "priorityClassName": "high",
            "tolerations": [
                {"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        }
    )
    assert violations(p, DEFAULT) == []
    assert [v.rule for v in violations(p, DEFAULT, local=False)] == ["nodeName", "tolerations", "priorityClasses"]
    assert violations(
        p,
        OffloadPodSecurity(allowed_priority_classes=["high"], allowed_tolerations=["gpufed.io/virtual-node"]),
        local=False,
    ) == [Violation("pods naming their node", "spec.nodeName=gpufed-gpu-a", "")]
    # A broad toleration the user wrote is sent to the provider: it is refused early.
    broad = pod({"tolerations": [{"operator": "Exists"}]})
    assert wheres(violations(broad, DEFAULT)) == ["toleration (every taint)"]


def test_the_rules_are_one_list_in_the_order_refusals_use() -> None:
    ids = [r.id for r in podsecurity.RULES]
    assert len(ids) == len(set(ids))
    p = pod(
        {"hostPID": True, "tolerations": [{"operator": "Exists"}], "volumes": [{"name": "n", "nfs": {}}]},
        ports=[{"containerPort": 1, "hostPort": 1}],
        securityContext={"privileged": True},
    )
    found = [v.rule for v in violations(p, DEFAULT)]
    assert found == sorted(found, key=ids.index)


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


# ---- the provider side: the published copy (projection: tests/unit/peering/test_podsecurity.py)


def test_the_provider_reads_and_publishes_the_tenant_policy() -> None:
    tenant = {
        "spec": {"consumerClusterId": "c", "publicKey": "k", "policy": {"podSecurity": {"allowPrivileged": True}}}
    }
    assert pod_security(tenant) == OffloadPodSecurity(allow_privileged=True)
    assert pod_security({"spec": {"policy": {"maxResources": {"bogus": "1"}}}}) == DEFAULT  # unreadable: strictest
    # Empty lists are left out of the applied status; the booleans always say what is refused.
    assert published(DEFAULT) == {
        "level": "baseline",
        "allowPrivileged": False,
        "allowHostNamespaces": False,
        "allowHostPath": False,
        "allowHostPorts": False,
    }
    assert published(OffloadPodSecurity(allowed_capabilities=["NET_ADMIN"]))["allowedCapabilities"] == ["NET_ADMIN"]


# ---- the remote provider: early refusal, API server refusal, a policy change


def remote() -> tuple[RemoteProvider, list[tuple[str, str]]]:
    provider = RemoteProvider(None, None, RemoteSettings(consumer="consumer-1", provider="gpu-a", node="gpufed-gpu-a"))
    # The consumer's own record: namespace team is offloaded to gpu-a (the provider's claims follow it).
    entry = {"clusterId": "gpu-a", "namespace": "team-consumer-1", "phase": "Ready"}
    offloading = {"metadata": {"name": "offloading", "namespace": "team"}, "status": {"remoteNamespaces": [entry]}}
    provider.offloaded._on_event("ADDED", offloading)
    provider.offloaded._on_synced()
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
    provider.claims.on_twin_namespace("ADDED", twin_namespace({"allowPrivileged": False}))
    # No API is reachable (None): the refusal comes before any call to the provider.
    with pytest.raises(ProviderError) as e:
        await provider.create_pod(pod(securityContext={"privileged": True}))
    assert e.value.reason == REASON and not e.value.retry and not e.value.fail_back
    assert str(e.value).startswith("provider gpu-a refuses privileged containers (container main:")
    # The provider allows it now: the refused pod is woken up, once.
    provider.claims.on_twin_namespace("MODIFIED", twin_namespace({"allowPrivileged": True}))
    assert notified == [("team", "p")]
    provider.claims.on_twin_namespace("MODIFIED", twin_namespace({"allowPrivileged": True}))
    assert notified == [("team", "p")]
    assert provider.pod_security["team"] == OffloadPodSecurity(allow_privileged=True)


async def test_without_a_published_policy_the_provider_decides() -> None:
    provider, _ = remote()
    provider.claims.on_twin_namespace("ADDED", twin_namespace(None))
    assert provider.pod_security["team"] is None
    provider._check_pod_security(pod(securityContext={"privileged": True}))  # no early refusal
    provider.claims.on_twin_namespace("DELETED", twin_namespace({"allowPrivileged": False}))
    assert "team" not in provider.pod_security
