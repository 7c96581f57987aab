"""Attacks from the TENANT USER position on the real local clusters: a user of the consumer cluster
with rights in an offloaded namespace only, creating pods there that ask the provider's nodes for
more than the provider's policy gives the consumer.

The consumer refuses each one before anything reaches the provider: its virtual kubelet checks the
pod, as the forge would send it, against the policy gpu-a publishes in the TwinNamespace status
(vkprovider.forge.podpolicy, the same rules as gpu-a's admission policy); the pod's status reason
is ProviderFailed and a Warning Event `OffloadPolicyRefused` on the pod names the rule and the
Tenant field that would allow it. Should the early check be skipped, gpu-a's own API server refuses
with the same words (tests/e2e/attacks/test_consumer_admission.py).

One test, parametrized over the rule table (`peering.podsecurity.RULES`, one or more attacks per rule
from `tests.e2e.helpers.POD_ATTACKS`, ids: the rule's id and the variant), but for the rules a tenant's
pod cannot break on the provider (`NOT_FOR_THE_TENANT`); each case is one attack and asserts the
refusal (the rule, where the pod breaks it, and the Tenant field or standard its tail names), the
Event, and that no twin exists on gpu-a. A restricted rule's case holds the Tenant to restricted
first. The module peers the consumer with gpu-a; each case offloads its own namespace.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ClusterID, tenant_namespace, twin_namespace
from peering import podsecurity
from tests.e2e.attacks.podattacks import PodAttack, pod_attacks
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

PROVIDER = "gpu-a"
REASON = "OffloadPolicyRefused"
#: Seconds a refused pod is watched for a twin appearing on gpu-a after its refusal.
LEAK_WAIT_S = 5.0


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {PROVIDER: ("--gpus", "8")})


def published(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> dict[str, Any] | None:
    """The policy gpu-a publishes for `namespace` (None until its TwinNamespace is Ready)."""
    items = clusters.kubectl_json(PROVIDER, "get", "twinnamespaces", "-n", tenant_namespace(ids["consumer"]))["items"]
    for t in items:
        if t["spec"]["namespace"] == namespace and (t.get("status") or {}).get("phase") == "Ready":
            found: dict[str, Any] = t["status"].get("podSecurity") or {}
            return found
    return None


def offloaded(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, level: str = "baseline") -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}"
    )
    eventually(
        f"gpu-a's policy ({level}) published for {namespace}",
        lambda: (published(clusters, ids, namespace) or {}).get("level") == level,
        timeout=90,
    )


def refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, obj: dict[str, Any], rule: podsecurity.Rule
) -> str:
    """The user's pod is refused on the consumer with ProviderFailed and an Event naming `rule`; no twin."""
    clusters.create("consumer", obj)
    name = obj["metadata"]["name"]

    def refused() -> dict[str, Any] | None:
        p: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", name, "-n", namespace)
        return p if (p.get("status") or {}).get("reason") == "ProviderFailed" else None

    p = eventually(f"{name}: status.reason ProviderFailed", refused, timeout=90)
    assert p["status"]["phase"] == "Pending", p["status"]
    assert f"refuses {rule.what} (" in p["status"]["message"], p["status"]["message"]

    def warned() -> dict[str, Any] | None:
        evs = clusters.kubectl_json(
            "consumer",
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},reason={REASON}",
        )["items"]
        return next((e for e in evs if e["type"] == "Warning"), None)

    event = eventually(f"{name}: a Warning Event {REASON}", warned)
    assert f"{rule.what} (" in event["message"], event["message"]
    # No twin on gpu-a, and none retried into existence a moment later either.
    never_created(clusters, twin_namespace(namespace, ids["consumer"]), name)
    return str(event["message"])


def never_created(clusters: Clusters, twin: str, name: str) -> None:
    deadline = time.monotonic() + LEAK_WAIT_S
    while time.monotonic() < deadline:
        p = clusters.kubectl(PROVIDER, "get", "pod", name, "-n", twin, check=False)
        assert p.returncode != 0, f"twin {twin}/{name} appeared on gpu-a"
        time.sleep(0.5)


#: The rules a tenant user's pod cannot break on the provider, and why.
NOT_FOR_THE_TENANT = {
    podsecurity.NODE_NAME.id: "the forge never sends the node name the consumer's scheduler chose",
    podsecurity.PRIORITY_CLASSES.id: "the forge never sends a priority class",
    podsecurity.GPU_PRODUCTS.id: (
        "the consumer's virtual nodes offer the granted products only; a pin outside them is the provider's to "
        "refuse (test_consumer_admission)"
    ),
}


@contextlib.contextmanager
def tenant_level(clusters: Clusters, ids: dict[str, ClusterID], level: str) -> Iterator[None]:
    """gpu-a's admin holds the consumer's Tenant to `level` (nothing to do for the default, baseline);
    the default is restored afterwards."""
    if level == "baseline":
        yield
        return
    patch = {"spec": {"policy": {"podSecurity": {"level": level}}}}
    clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(patch))
    try:
        yield
    finally:
        reset = {"spec": {"policy": {"podSecurity": None}}}
        clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(reset))


def virtual_node(clusters: Clusters, ids: dict[str, ClusterID]) -> str:
    nodes = clusters.kubectl_json("consumer", "get", "nodes", "-l", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}")
    assert nodes["items"], "the consumer has a virtual node of gpu-a"
    return str(nodes["items"][0]["metadata"]["name"])


@pytest.mark.parametrize("attack", pod_attacks(exempt=NOT_FOR_THE_TENANT))
def test_tenant_pod_breaking_a_rule_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, attack: PodAttack
) -> None:
    rule = attack.rule
    with tenant_level(clusters, ids, rule.level):
        offloaded(clusters, ids, namespace, level=rule.level)
        # A pod no scheduler would place on the virtual node is placed there by the user.
        node = virtual_node(clusters, ids) if attack.unschedulable else ""
        message = refused_before_offload(clusters, ids, namespace, attack.pod("attack", namespace, node), rule)
        assert attack.where() in message and rule.tail in message, message
