"""The pod attacks of the attack suite: at least one pod per rule of `peering.podsecurity.RULES`, each
with the words gpufed's policy and Pod Security Admission refuse it in (shared by the tenant user's
and the consumer's positions, tests/e2e/attacks/test_tenant_user.py and test_consumer_admission.py)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from peering import podsecurity

#: What an attack pod's one container (`main`) requests.
ATTACK_REQUESTS = {"cpu": "10m", "memory": "16Mi"}
#: A container securityContext that meets Pod Security restricted: each restricted attack breaks one part of it.
CONFINED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "capabilities": {"drop": ["ALL"]},
}


def _confined_without(key: str) -> dict[str, Any]:
    return {"securityContext": {k: v for k, v in CONFINED.items() if k != key}}


@dataclass(frozen=True)
class PodAttack:
    """A pod that breaks one rule of `peering.podsecurity.RULES`: what each attacker position sends
    (tests/e2e/attacks), and the words its refusals must use."""

    rule: podsecurity.Rule
    #: Tells two attacks on one rule apart ("" for a rule's only attack).
    variant: str = ""
    #: Fields of the pod's spec and of its one container (`main`) beyond a plain small pod (one that
    #: meets Pod Security restricted too when the rule is a restricted one).
    spec: Mapping[str, Any] = field(default_factory=dict)
    main: Mapping[str, Any] = field(default_factory=dict)
    #: Where gpufed's refusal says the pod breaks the rule (the provider's admission policy and the
    #: consumer's early check use the same words); `{node}` stands for the node the pod names.
    ours: str = ""
    #: What Pod Security Admission's refusal names at the rule's level; "" where PSA admits the pod
    #: (gpufed's policy alone refuses it).
    psa: str = ""
    #: Rules the pod cannot help breaking too (a Windows host process needs hostNetwork).
    besides: tuple[podsecurity.Rule, ...] = ()
    #: The pod names its node (spec.nodeName): a node of the cluster it is created in.
    names_node: bool = False
    #: No scheduler places it (it requests what no node offers): a user who wants it run names a node.
    unschedulable: bool = False

    @property
    def id(self) -> str:
        return f"{self.rule.id}-{self.variant}" if self.variant else self.rule.id

    def pod(self, name: str, namespace: str, node: str = "") -> dict[str, Any]:
        """The attack pod; `node`: the node it names (names_node, or an unschedulable pod placed by hand)."""
        obj = self.control(name, namespace)
        obj["spec"]["containers"][0].update(copy.deepcopy(dict(self.main)))
        obj["spec"].update(copy.deepcopy(dict(self.spec)))
        if node:
            obj["spec"]["nodeName"] = node
        return obj

    def control(self, name: str, namespace: str) -> dict[str, Any]:
        """The same pod without the attack: admitted where the attack is refused."""
        main: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
        main["resources"] = {"requests": dict(ATTACK_REQUESTS)}
        if self.rule.level == "restricted":
            main["securityContext"] = copy.deepcopy(CONFINED)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [main]},
        }

    def where(self, node: str = "") -> str:
        return self.ours.replace("{node}", node)


_MIG = "nvidia.com/mig-1g.10gb"
_NOT_GRANTED_PRODUCT = "NVIDIA-A100-SXM4-80GB"
_CONTROL_PLANE = "node-role.kubernetes.io/control-plane"

#: At least one attack per rule of `peering.podsecurity.RULES`, in its order.
POD_ATTACKS: tuple[PodAttack, ...] = (
    PodAttack(
        podsecurity.PRIVILEGED,
        main={"securityContext": {"privileged": True}},
        ours="container main: securityContext.privileged=true",
        psa="securityContext.privileged=true",
    ),
    PodAttack(
        podsecurity.CAPABILITIES,
        "SYS_ADMIN",
        main={"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
        ours="container main: securityContext.capabilities.add=SYS_ADMIN",
        psa='"SYS_ADMIN" in securityContext.capabilities.add',
    ),
    # One of the capabilities Pod Security baseline lets a container add: gpufed's policy alone refuses it.
    PodAttack(
        podsecurity.CAPABILITIES,
        "CHOWN",
        main={"securityContext": {"capabilities": {"add": ["CHOWN"]}}},
        ours="container main: securityContext.capabilities.add=CHOWN",
    ),
    PodAttack(podsecurity.HOST_NAMESPACES, spec={"hostPID": True}, ours="spec.hostPID=true", psa="hostPID=true"),
    PodAttack(
        podsecurity.HOST_PATH_VOLUMES,
        spec={"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
        main={"volumeMounts": [{"name": "root", "mountPath": "/host"}]},
        ours="volume root: hostPath /",
        psa='hostPath volumes (volume "root")',
    ),
    PodAttack(
        podsecurity.HOST_PORTS,
        main={"ports": [{"containerPort": 22, "hostPort": 22}]},
        ours="container main: ports.hostPort=22",
        psa="hostPort 22",
    ),
    PodAttack(
        podsecurity.VOLUME_TYPES,
        "nfs",
        spec={"volumes": [{"name": "data", "nfs": {"server": "10.0.0.1", "path": "/exports"}}]},
        main={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        ours="volume data: nfs",
    ),
    PodAttack(
        podsecurity.VOLUME_TYPES,
        "csi",
        spec={"volumes": [{"name": "secrets", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}}]},
        main={"volumeMounts": [{"name": "secrets", "mountPath": "/mnt"}]},
        ours="volume secrets: csi",
    ),
    PodAttack(
        podsecurity.HOST_PROCESS,
        spec={"hostNetwork": True, "securityContext": {"windowsOptions": {"hostProcess": True}}},
        ours="spec.securityContext.windowsOptions.hostProcess=true",
        psa="windowsOptions.hostProcess=true",
        besides=(podsecurity.HOST_NAMESPACES,),
    ),
    PodAttack(
        podsecurity.SECCOMP,
        "pod",
        spec={"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        ours="spec.securityContext.seccompProfile.type=Unconfined",
        psa='seccompProfile.type to "Unconfined"',
    ),
    PodAttack(
        podsecurity.SECCOMP,
        "container",
        main={"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        ours="container main: securityContext.seccompProfile.type=Unconfined",
        psa='seccompProfile.type to "Unconfined"',
    ),
    PodAttack(
        podsecurity.APPARMOR,
        spec={"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
        ours="spec.securityContext.appArmorProfile.type=Unconfined",
        psa='AppArmor profile type to "Unconfined"',
    ),
    PodAttack(
        podsecurity.SELINUX,
        "pod",
        spec={"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
        ours="spec.securityContext.seLinuxOptions.type=spc_t",
        psa='type "spc_t"',
    ),
    PodAttack(
        podsecurity.SELINUX,
        "container",
        main={"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
        ours="container main: securityContext.seLinuxOptions.type=spc_t",
        psa='type "spc_t"',
    ),
    # The API server allows an unmasked /proc only in a user namespace (hostUsers: false), where Pod
    # Security baseline allows it too: gpufed's policy alone refuses it.
    PodAttack(
        podsecurity.PROC_MOUNT,
        spec={"hostUsers": False},
        main={"securityContext": {"procMount": "Unmasked"}},
        ours="container main: securityContext.procMount=Unmasked",
    ),
    PodAttack(
        podsecurity.SYSCTLS,
        spec={"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
        ours="spec.securityContext.sysctls kernel.msgmax",
        psa="kernel.msgmax",
    ),
    PodAttack(podsecurity.NODE_NAME, ours="spec.nodeName={node}", names_node=True),
    PodAttack(
        podsecurity.TOLERATIONS,
        "every-taint",
        spec={"tolerations": [{"operator": "Exists"}]},
        ours="toleration (every taint)",
    ),
    PodAttack(
        podsecurity.TOLERATIONS,
        "control-plane",
        spec={"tolerations": [{"key": _CONTROL_PLANE, "operator": "Exists", "effect": "NoSchedule"}]},
        ours="toleration node-role.kubernetes.io/control-plane:NoSchedule",
    ),
    PodAttack(
        podsecurity.PRIORITY_CLASSES,
        spec={"priorityClassName": "system-node-critical"},
        ours="spec.priorityClassName=system-node-critical",
    ),
    PodAttack(
        podsecurity.RESOURCES,
        main={"resources": {"requests": {**ATTACK_REQUESTS, _MIG: "1"}, "limits": {_MIG: "1"}}},
        ours=f"container main: resources {_MIG}",
        unschedulable=True,
    ),
    # Refused once the provider limits the products a consumer may pin (a Tenant allows any by default).
    PodAttack(
        podsecurity.GPU_PRODUCTS,
        spec={"nodeSelector": {GPU_PRODUCT_LABEL: _NOT_GRANTED_PRODUCT}},
        ours=f"spec.nodeSelector {GPU_PRODUCT_LABEL}={_NOT_GRANTED_PRODUCT}",
    ),
    PodAttack(
        podsecurity.PRIVILEGE_ESCALATION,
        main={"securityContext": {**CONFINED, "allowPrivilegeEscalation": True}},
        ours="container main: securityContext.allowPrivilegeEscalation is not false",
        psa="allowPrivilegeEscalation=false",
    ),
    PodAttack(
        podsecurity.RUN_AS_NON_ROOT,
        main=_confined_without("runAsNonRoot"),
        ours="container main: securityContext.runAsNonRoot is not true",
        psa="runAsNonRoot=true",
    ),
    PodAttack(
        podsecurity.RUN_AS_ROOT,
        spec={"securityContext": {"runAsUser": 0}},
        ours="spec.securityContext.runAsUser=0",
        psa="runAsUser=0",
    ),
    PodAttack(
        podsecurity.SECCOMP_REQUIRED,
        main=_confined_without("seccompProfile"),
        ours="container main: no RuntimeDefault or Localhost seccomp profile",
        psa='"RuntimeDefault" or "Localhost"',
    ),
    PodAttack(
        podsecurity.DROP_ALL,
        main=_confined_without("capabilities"),
        ours="container main: securityContext.capabilities.drop lacks ALL",
        psa='capabilities.drop=["ALL"]',
    ),
)


def pod_attacks(exempt: Mapping[str, str] | None = None) -> list[Any]:
    """pytest parameters (ids: the rule's id, and the variant's) of every attack in `POD_ATTACKS`, rule
    by rule as `peering.podsecurity.RULES` lists them, but for the rules `exempt` names (id -> why the
    position cannot break it). A rule with no attack, or an exemption of no rule, fails the collection."""
    exempt = exempt or {}
    unknown = set(exempt) - {r.id for r in podsecurity.RULES}
    assert not unknown, f"exempt rules that peering.podsecurity.RULES does not have: {sorted(unknown)}"
    params = []
    for rule in podsecurity.RULES:
        if rule.id in exempt:
            continue
        attacks = [a for a in POD_ATTACKS if a.rule is rule]
        assert attacks, f"rule {rule.id} of peering.podsecurity.RULES has no attack in tests.e2e.helpers.POD_ATTACKS"
        params += [pytest.param(a, id=a.id) for a in attacks]
    return params
