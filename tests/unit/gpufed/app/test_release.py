"""The controller's cluster-wide objects get an ownerReference to the ClusterRole `gpufed-controller`
(so `helm uninstall` removes them through the garbage collector): only gpufed's own, once, other
owners kept, a stale reference to an earlier ClusterRole replaced, nothing without the ClusterRole."""

from __future__ import annotations

from typing import Any

from gpufed.app.release import ANCHOR, OWNED, ReleaseOwner, owned_refs
from tests.unit.fakes import serve

ADMISSION = "admissionregistration.k8s.io/v1"


def ours(kind: str, name: str, **meta: Any) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "gpufed"}
    return {"apiVersion": ADMISSION, "kind": kind, "metadata": {"name": name, "labels": labels, **meta}}


async def test_every_object_of_the_controller_is_owned_by_its_cluster_role() -> None:
    async with serve() as (server, api):
        role = server.create(
            "clusterroles",
            {"kind": "ClusterRole", "metadata": {"name": ANCHOR[2]}},
            "rbac.authorization.k8s.io/v1",
        )
        server.create("mutatingwebhookconfigurations", ours("MutatingWebhookConfiguration", "gpufed-offloading"))
        other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "other-owner"}
        stale = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": ANCHOR[2], "uid": "old"}
        server.create(
            "validatingadmissionpolicies",
            ours("ValidatingAdmissionPolicy", "gpufed-offload-policy", ownerReferences=[other, stale]),
        )
        # Someone else's object of the same name is never changed.
        server.create(
            "validatingadmissionpolicybindings",
            {"kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "gpufed-offload-policy"}},
        )
        owner = ReleaseOwner(api)
        assert await owner.sync() == 2
        want = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": ANCHOR[2]}
        want["uid"] = role["metadata"]["uid"]
        webhook = server.get("mutatingwebhookconfigurations", "", "gpufed-offloading")
        policy = server.get("validatingadmissionpolicies", "", "gpufed-offload-policy")
        binding = server.get("validatingadmissionpolicybindings", "", "gpufed-offload-policy")
        assert webhook is not None and policy is not None and binding is not None
        assert webhook["metadata"]["ownerReferences"] == [want]
        assert policy["metadata"]["ownerReferences"] == [other, want], "other owners kept, the stale one replaced"
        assert "ownerReferences" not in binding["metadata"]
        patches = [r for r in server.requests if r.method == "PATCH"]
        assert all(r.content_type == "application/merge-patch+json" for r in patches)
        assert all("resourceVersion" in r.body["metadata"] for r in patches), "guarded by what was read"
        assert await owner.sync() == 0, "once"


async def test_nothing_changes_without_the_cluster_role() -> None:
    async with serve() as (server, api):
        server.create("mutatingwebhookconfigurations", ours("MutatingWebhookConfiguration", "gpufed-offloading"))
        assert await ReleaseOwner(api).sync() == 0
        assert not [r for r in server.requests if r.method == "PATCH"]


def test_owned_names_are_the_ones_the_controller_creates() -> None:
    names = {(plural, name) for _, plural, name in OWNED}
    assert ("mutatingwebhookconfigurations", "gpufed-offloading") in names
    for policy in (
        "gpufed-offload-policy",
        "gpufed-consumer-objects",
        "gpufed-consumer-claims",
        "gpufed-consumer-device-claims",
    ):
        assert ("validatingadmissionpolicies", policy) in names
        assert ("validatingadmissionpolicybindings", policy) in names
    assert owned_refs({"metadata": {"ownerReferences": [{"uid": "u"}]}}, {**_role("u")}) is None


def _role(uid: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r", "uid": uid}}
