"""The virtual kubelets' access to the peerings' credentials Secrets (peering.controllers.credentials_access):
a Role per peering naming its Secret alone, bound to the virtual kubelets' two identities, owned by
the ForeignCluster; written only when the watches do not show it current, repaired when someone
deletes or rewrites it; and no Secret of `gpufed` in the virtual kubelets' static Role. Against the
in-memory API server (which does not enforce RBAC: what the API server grants is the e2e RBAC
matrix's, tests/e2e/test_rbac_matrix.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    IDENTITY_CONFIGMAP,
    PROVIDER_LABEL,
    SYSTEM_NAMESPACE,
    VIRTUAL_KUBELET_SERVICE_ACCOUNT,
    VIRTUAL_KUBELET_USER,
    ClusterID,
    credentials_reader,
    remote_kubeconfig_secret,
)
from peering.controllers.credentials_access import CredentialsAccess
from tests.unit.fakes import FakeApiServer, running, serve, until

REPO = Path(__file__).resolve().parents[4]
PROVIDER = ClusterID("prov-access-0001")
NAME = credentials_reader(PROVIDER)
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def _fc(server: FakeApiServer, provider: ClusterID = PROVIDER) -> dict[str, Any]:
    return server.create(
        "foreignclusters",
        {
            "kind": "ForeignCluster",
            "metadata": {"name": provider},
            "spec": {"clusterId": provider, "roles": ["Provider"]},
        },
        api_version=API_VERSION,
    )


def _rbac_writes(server: FakeApiServer, since: int = 0) -> list[str]:
    return [f"{r.method} {r.path}" for r in server.requests[since:] if r.path.startswith(RBAC) and r.method != "GET"]


def _docs(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


def _rules(path: str, kind: str, name: str, namespace: str) -> list[dict[str, Any]]:
    for d in _docs(path):
        m = d["metadata"]
        if d["kind"] == kind and m["name"] == name and m.get("namespace", "") == namespace:
            rules: list[dict[str, Any]] = d["rules"]
            return rules
    raise AssertionError(f"no {kind} {namespace}/{name} in {path}")


async def test_the_role_names_the_peerings_secret_alone_and_binds_the_virtual_kubelets() -> None:
    async with serve() as (server, api):
        fc = _fc(server)
        await CredentialsAccess(api, lambda _p: None).grant(fc, PROVIDER)
        role = server.get("roles", SYSTEM_NAMESPACE, NAME)
        binding = server.get("rolebindings", SYSTEM_NAMESPACE, NAME)
        assert role is not None and binding is not None
        assert role["rules"] == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get"],
                "resourceNames": [remote_kubeconfig_secret(PROVIDER)],
            }
        ], "get on the one Secret: no list or watch (those cannot be narrowed to a name)"
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME}
        assert {(s["kind"], s["name"], s.get("namespace", "")) for s in binding["subjects"]} == {
            ("User", VIRTUAL_KUBELET_USER, ""),
            ("ServiceAccount", VIRTUAL_KUBELET_SERVICE_ACCOUNT, SYSTEM_NAMESPACE),
        }
        for obj in (role, binding):
            assert obj["metadata"]["labels"][PROVIDER_LABEL] == PROVIDER
            owners = obj["metadata"]["ownerReferences"]
            assert [(o["kind"], o["uid"]) for o in owners] == [("ForeignCluster", fc["metadata"]["uid"])]
        writes = _rbac_writes(server)
        assert writes == [
            f"PATCH {RBAC}/namespaces/{SYSTEM_NAMESPACE}/roles/{NAME}",
            f"PATCH {RBAC}/namespaces/{SYSTEM_NAMESPACE}/rolebindings/{NAME}",
        ], "the Role before the binding that refers to it"


async def test_a_current_grant_is_not_written_again_and_a_deleted_one_is_repaired() -> None:
    async with serve() as (server, api):
        fc = _fc(server)
        changed: list[str] = []
        access = CredentialsAccess(api, changed.append)
        async with running(access.run()):
            await until(access.synced, what="the watches to list")
            await access.grant(fc, PROVIDER)
            await until(lambda: len(access._cache) == 2, what="the watches to bring both objects")
            since = len(server.requests)
            for _ in range(3):
                await access.grant(fc, PROVIDER)
            assert _rbac_writes(server, since) == [], "a current grant costs no request"
            assert changed == [], "its own writes reconcile nothing"
            server.remove("roles", SYSTEM_NAMESPACE, NAME)
            await until(lambda: changed == [PROVIDER], what="the deletion to reconcile the provider")
            await access.grant(fc, PROVIDER)
            assert _rbac_writes(server, since) == [f"PATCH {RBAC}/namespaces/{SYSTEM_NAMESPACE}/roles/{NAME}"]
            assert server.get("roles", SYSTEM_NAMESPACE, NAME) is not None


async def test_a_role_widened_by_someone_else_is_put_back() -> None:
    async with serve() as (server, api):
        fc = _fc(server)
        changed: list[str] = []
        access = CredentialsAccess(api, changed.append)
        async with running(access.run()):
            await until(access.synced, what="the watches to list")
            await access.grant(fc, PROVIDER)
            await until(lambda: len(access._cache) == 2, what="the watches to bring both objects")

            def widen(role: dict[str, Any]) -> None:
                role["rules"] = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]

            server.update("roles", SYSTEM_NAMESPACE, NAME, widen)
            await until(lambda: changed == [PROVIDER], what="the rewrite to reconcile the provider")
            await access.grant(fc, PROVIDER)
            role = server.get("roles", SYSTEM_NAMESPACE, NAME)
            assert role is not None and role["rules"][0]["resourceNames"] == [remote_kubeconfig_secret(PROVIDER)]
            assert role["rules"][0]["verbs"] == ["get"]


async def test_a_new_foreign_cluster_of_the_same_provider_takes_the_grant_over() -> None:
    async with serve() as (server, api):
        old = _fc(server)
        access = CredentialsAccess(api, lambda _p: None)
        async with running(access.run()):
            await until(access.synced, what="the watches to list")
            await access.grant(old, PROVIDER)
            await until(lambda: len(access._cache) == 2, what="the watches to bring both objects")
            server.remove("foreignclusters", "", PROVIDER)
            new = _fc(server)
            await access.grant(new, PROVIDER)
            for plural in ("roles", "rolebindings"):
                obj = server.get(plural, SYSTEM_NAMESPACE, NAME)
                assert obj is not None
                assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [new["metadata"]["uid"]]


async def test_revoke_deletes_both_and_costs_nothing_once_they_are_gone() -> None:
    async with serve() as (server, api):
        fc = _fc(server)
        access = CredentialsAccess(api, lambda _p: None)
        async with running(access.run()):
            await until(access.synced, what="the watches to list")
            await access.grant(fc, PROVIDER)
            await until(lambda: len(access._cache) == 2, what="the watches to bring both objects")
            await access.revoke(PROVIDER)
            assert server.get("roles", SYSTEM_NAMESPACE, NAME) is None
            assert server.get("rolebindings", SYSTEM_NAMESPACE, NAME) is None
            since = len(server.requests)
            await until(lambda: not access._cache, what="the deletions to reach the cache")
            await access.revoke(PROVIDER)
            await access.revoke(ClusterID("never-peered-0001"))
            assert _rbac_writes(server, since) == [], "nothing to delete: no request"


def test_the_virtual_kubelets_static_role_grants_no_secret_of_gpufed() -> None:
    """The identity key, the WireGuard keys and the other Secrets of `gpufed` are out of reach: the
    static Role reads the identity ConfigMap by name and no Secret at all."""
    for path in ("deploy/rbac/virtual-kubelet.yaml", "deploy/charts/gpufed/files/rbac/virtual-kubelet.yaml"):
        rules = _rules(path, "Role", "gpufed-virtual-kubelet", SYSTEM_NAMESPACE)
        core = [r for r in rules if r["apiGroups"] == [""]]
        assert core == [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": [IDENTITY_CONFIGMAP]}
        ], path
        for d in _docs(path):  # nor any other object of the file, in gpufed or cluster-wide
            if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] != "gpufed-virtual-kubelet-reflection":
                assert not any("secrets" in r.get("resources", []) for r in d["rules"]), (path, d["metadata"])


def test_the_controller_may_grant_the_role_without_escalate_or_bind() -> None:
    """RBAC's escalation check: the controller writes Roles in `gpufed` and holds get on its Secrets
    itself, so it may grant that; it holds neither `escalate` nor `bind` on Roles."""
    for path in ("deploy/rbac/controller.yaml", "deploy/charts/gpufed/files/rbac/controller.yaml"):
        rules = _rules(path, "Role", "gpufed-controller", SYSTEM_NAMESPACE)
        roles = [r for r in rules if "roles" in r["resources"]]
        assert roles and {"create", "patch", "delete", "list", "watch"} <= set(roles[0]["verbs"]), path
        assert not {"escalate", "bind"} & {v for r in roles for v in r["verbs"]}, path
        assert any("secrets" in r["resources"] and "get" in r["verbs"] and not r.get("resourceNames") for r in rules)
        cluster = _rules(path, "ClusterRole", "gpufed-controller", "")
        assert any("rolebindings" in r["resources"] and "create" in r["verbs"] for r in cluster), path
        assert not any("roles" in r["resources"] for r in cluster), f"{path}: Roles in gpufed only"
