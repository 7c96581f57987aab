"""gpufed.ops.force_unpeer: what `gpufed unpeer --force` removes given what the cluster that is left
holds (the plans, pure), the refusals (wrong side, claims), running a plan against an API server
(pods failed back with a reason and an Event, idempotent), the CLI's local checks (exit 2 before
any call), and a plain unpeer refusing, with what --force would delete, when one side is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from typer.testing import CliRunner

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    IDENTITY_CONFIGMAP,
    PROVIDER_LABEL,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
)
from gpufed.cli import app
from gpufed.ops import force_unpeer as fu
from gpufed.ops.force_unpeer import ConsumerView, ForceRequest, ProviderView
from netfabric import ops as network_ops
from peering.ops.peer import ClusterRef, PeerError
from tests.unit.fakes import FakeApiServer, Recorder, serve
from tests.unit.gpufed.ops.doctor.scenario import kubeconfig_of

CONSUMER = ClusterID("consumer-12345678")
PROVIDER = ClusterID("gpu-a-12345678")
NODE = f"gpufed-{PROVIDER}"


def _fc(peer: str, *roles: str) -> dict[str, Any]:
    return {"metadata": {"name": peer, "uid": "fc-uid"}, "spec": {"clusterId": peer, "roles": list(roles)}}


def _pod(name: str, phase: str = "Running", *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "app:1"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "main", "state": {"running": {}}}]},
    }


def _volume(claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pv-{claim}", "labels": {REMOTE_CLUSTER_LABEL: PROVIDER}},
        "spec": {"claimRef": {"namespace": "team-a", "name": claim}, "capacity": {"storage": "10Gi"}},
        "status": {"phase": "Bound"},
    }


def _consumer_view(**kw: Any) -> ConsumerView:
    base: dict[str, Any] = {
        "foreign_cluster": _fc(PROVIDER, "Provider"),
        "slices": [{"metadata": {"name": PROVIDER}, "spec": {"providerClusterId": PROVIDER}}],
        "nodes": [{"metadata": {"name": NODE}}],
        "pods": [_pod("runs"), _pod("done", "Succeeded"), _pod("going", deleting=True)],
        "credentials": [
            (
                f"/api/v1/namespaces/gpufed/secrets/gpufed-remote-{PROVIDER}",
                {"kind": "Secret", "metadata": {"name": f"gpufed-remote-{PROVIDER}"}},
            )
        ],
        "fabric": network_ops.side_objects(PROVIDER)[:2],
        "volumes": [],
    }
    base.update(kw)
    return ConsumerView(**base)


# ---- plans


def test_the_consumer_plan_removes_the_fabric_fails_pods_back_then_removes_the_peering() -> None:
    plan = fu.plan_consumer(CONSUMER, PROVIDER, _consumer_view(), delete_volumes=False)
    assert fu.refusal(plan, delete_volumes=False) is None
    assert plan.describe() == [
        f"Gateway.gpufed.io {PROVIDER}",
        f"Connection {PROVIDER}",
        "pod team-a/runs (failed back: ProviderGone)",
        "pod team-a/going (being deleted: deleted at once)",
        f"ForeignCluster {PROVIDER}",
        f"ResourceSlice.gpufed.io {PROVIDER}",
        f"virtual node {NODE}",
        f"Secret gpufed/gpufed-remote-{PROVIDER}",
    ]
    assert "team-a/done" not in " ".join(plan.describe()), "a finished pod is left as it is"


def test_the_consumer_side_refuses_a_peer_that_is_not_its_provider() -> None:
    plan = fu.plan_consumer(
        CONSUMER, PROVIDER, _consumer_view(foreign_cluster=_fc(PROVIDER, "Consumer")), delete_volumes=False
    )
    why = fu.refusal(plan, delete_volumes=True)
    assert why is not None and f"--consumer {PROVIDER}" in why and "not a provider" in why
    assert plan.describe() == [], "a refused plan deletes nothing"


def test_nothing_held_is_an_empty_plan_with_a_hint_when_the_peer_is_a_consumer() -> None:
    empty = _consumer_view(foreign_cluster=None, slices=[], nodes=[], pods=[], credentials=[], fabric=[])
    assert fu.plan_consumer(CONSUMER, PROVIDER, empty, delete_volumes=False).empty
    tenant = ConsumerView(**{**empty.__dict__, "tenant": {"metadata": {"name": PROVIDER}}})
    plan = fu.plan_consumer(CONSUMER, PROVIDER, tenant, delete_volumes=False)
    assert plan.empty and plan.notes and f"--consumer {PROVIDER}" in plan.notes[0]


def test_claims_on_a_gone_provider_need_delete_volumes_and_the_refusal_says_the_data_is_out_of_reach() -> None:
    view = _consumer_view(volumes=[_volume("data")])
    plan = fu.plan_consumer(CONSUMER, PROVIDER, view, delete_volumes=False)
    why = fu.refusal(plan, delete_volumes=False)
    assert why is not None
    assert "team-a/data (10Gi)" in why and "out of reach" in why and "--delete-volumes" in why
    forced = fu.plan_consumer(CONSUMER, PROVIDER, view, delete_volumes=True)
    assert fu.refusal(forced, delete_volumes=True) is None
    lines = forced.describe()
    assert f"claim team-a/data (its data on {PROVIDER} is out of reach)" in lines
    assert "virtual volume pv-data" in lines


def test_the_provider_plan_removes_tenant_foreign_cluster_csrs_and_namespaces() -> None:
    view = ProviderView(
        tenant={"metadata": {"name": CONSUMER}},
        foreign_cluster=_fc(CONSUMER, "Consumer"),
        namespaces=[{"metadata": {"name": f"team-a-{CONSUMER}"}}, {"metadata": {"name": f"gpufed-tenant-{CONSUMER}"}}],
        csrs=[{"metadata": {"name": "csr-1"}}],
        fabric=network_ops.side_objects(CONSUMER)[:1],
        claims=[],
    )
    plan = fu.plan_provider(PROVIDER, CONSUMER, view)
    assert fu.refusal(plan, delete_volumes=False) is None
    assert plan.describe() == [
        f"Gateway.gpufed.io {CONSUMER}",
        f"Tenant {CONSUMER}",
        f"ForeignCluster {CONSUMER}",
        "CertificateSigningRequest csr-1",
        f"namespace gpufed-tenant-{CONSUMER}",
        f"namespace team-a-{CONSUMER}",
    ]
    assert all(d.propagation == "Foreground" for d in plan.deletions if d.what.startswith("namespace"))
    claim = {
        "metadata": {"name": "data", "namespace": f"team-a-{CONSUMER}"},
        "spec": {"resources": {"requests": {"storage": "5Gi"}}},
    }
    with_claims = fu.plan_provider(PROVIDER, CONSUMER, ProviderView(**{**view.__dict__, "claims": [claim]}))
    why = fu.refusal(with_claims, delete_volumes=False)
    assert why is not None and f"team-a-{CONSUMER}/data (5Gi)" in why and "--delete-volumes" in why
    assert fu.refusal(with_claims, delete_volumes=True) is None


def test_the_provider_side_refuses_a_peer_that_is_its_provider() -> None:
    view = ProviderView(None, _fc(CONSUMER, "Provider"), [], [], [], [])
    why = fu.refusal(fu.plan_provider(PROVIDER, CONSUMER, view), delete_volumes=False)
    assert why is not None and f"--provider {CONSUMER}" in why


# ---- running a plan


class _Server(FakeApiServer):
    """The fake API server, answering /version as a reachable one does."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/version":
            return web.json_response({"major": "1", "minor": "31"})
        return await super().handle(request)


def _identity(server: FakeApiServer, cid: str) -> None:
    server.create(
        "configmaps",
        {
            "metadata": {"name": IDENTITY_CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
            "data": {"clusterId": cid, "publicKey": "key"},
        },
    )


def _kubeconfig(tmp_path: Path, api: Any, name: str = "kc") -> Path:
    kc = tmp_path / name
    kc.write_text(yaml.safe_dump(kubeconfig_of(str(api.configuration.host), {"token": "x"})))
    return kc


def _populate_consumer(server: FakeApiServer) -> None:
    _identity(server, CONSUMER)
    server.create("foreignclusters", _fc(PROVIDER, "Provider"), API_VERSION)
    server.create(
        "resourceslices",
        {"metadata": {"name": PROVIDER, "namespace": SYSTEM_NAMESPACE}, "spec": {"providerClusterId": PROVIDER}},
        API_VERSION,
    )
    server.create("nodes", {"metadata": {"name": NODE, "labels": {REMOTE_CLUSTER_LABEL: PROVIDER}}})
    server.create("nodes", {"metadata": {"name": "real-node"}})
    server.create("pods", {**_pod("runs"), "kind": "Pod"})
    server.create("pods", {**_pod("done", "Succeeded"), "kind": "Pod"})
    elsewhere = _pod("elsewhere")
    elsewhere["spec"]["nodeName"] = "real-node"
    server.create("pods", elsewhere)
    for name in (f"gpufed-remote-{PROVIDER}", f"gpufed-csr-key-{PROVIDER}"):
        server.create(
            "secrets", {"metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "labels": {PROVIDER_LABEL: PROVIDER}}}
        )
    server.create("secrets", {"metadata": {"name": "gpufed-remote-other", "namespace": SYSTEM_NAMESPACE}})
    server.create("gateways", {"metadata": {"name": PROVIDER, "namespace": SYSTEM_NAMESPACE}}, API_VERSION)


async def test_forgetting_a_provider_fails_its_pods_back_and_leaves_nothing_of_it(tmp_path: Path) -> None:
    async with serve(_Server()) as (server, api):
        _populate_consumer(server)
        req = ForceRequest(ClusterRef(_kubeconfig(tmp_path, api), None, "consumer"), "consumer", PROVIDER, timeout_s=10)
        report = Recorder()
        assert await fu.force_unpeer(req, report) == 7  # Gateway, 1 pod, FC, slice, node, 2 Secrets
        assert server.get("foreignclusters", "", PROVIDER) is None
        assert server.get("nodes", "", NODE) is None and server.get("nodes", "", "real-node") is not None
        assert server.calls("PATCH", f"/api/v1/nodes/{NODE}"), "cordoned before its pods were failed back"
        assert server.get("gateways", SYSTEM_NAMESPACE, PROVIDER) is None
        assert {n for (r, _ns, n) in server.objects if r == "secrets"} == {"gpufed-remote-other"}
        failed = server.get("pods", "team-a", "runs")
        assert failed is not None
        assert failed["status"]["phase"] == "Failed" and failed["status"]["reason"] == fu.PROVIDER_GONE
        assert PROVIDER in failed["status"]["message"] and "replacement" in failed["status"]["message"]
        assert any(c["type"] == "DisruptionTarget" for c in failed["status"]["conditions"])
        untouched = [server.get("pods", "team-a", n) for n in ("done", "elsewhere")]
        assert [(p or {})["status"]["phase"] for p in untouched] == ["Succeeded", "Running"]
        evs = [e for e in server.items("events", "team-a") if e["reason"] == fu.PROVIDER_GONE]
        assert len(evs) == 1 and evs[0]["type"] == "Warning" and evs[0]["involvedObject"]["name"] == "runs"
        assert f"done {PROVIDER} forgotten on {CONSUMER}: nothing of the peering is left on this side" in report.lines

        again = Recorder()
        assert await fu.force_unpeer(req, again) == 0, "idempotent: a second run finds nothing"
        assert any("nothing to remove" in line for line in again.lines)


async def test_a_refused_plan_changes_nothing(tmp_path: Path) -> None:
    async with serve(_Server()) as (server, api):
        _populate_consumer(server)
        server.create("persistentvolumes", _volume("data"))
        before = len(server.objects)
        req = ForceRequest(ClusterRef(_kubeconfig(tmp_path, api), None, "consumer"), "consumer", PROVIDER, timeout_s=5)
        with pytest.raises(PeerError, match="out of reach"):
            await fu.force_unpeer(req, Recorder())
        assert len(server.objects) == before
        assert not [r for r in server.requests if r.method in ("DELETE", "PATCH", "PUT")]
        with pytest.raises(PeerError, match="own ClusterID"):
            await fu.force_unpeer(ForceRequest(req.local, "consumer", CONSUMER), Recorder())


async def test_forgetting_a_consumer_removes_its_tenant_and_namespaces(tmp_path: Path) -> None:
    async with serve(_Server()) as (server, api):
        _identity(server, PROVIDER)
        server.create("tenants", {"metadata": {"name": CONSUMER}}, API_VERSION)
        server.create("foreignclusters", _fc(CONSUMER, "Consumer"), API_VERSION)
        for ns in (f"gpufed-tenant-{CONSUMER}", f"team-a-{CONSUMER}"):
            server.create("namespaces", {"metadata": {"name": ns, "labels": {CONSUMER_LABEL: CONSUMER}}})
        server.create("namespaces", {"metadata": {"name": "team-a"}})
        server.create(
            "certificatesigningrequests", {"metadata": {"name": "csr-1", "labels": {CONSUMER_LABEL: CONSUMER}}}
        )
        req = ForceRequest(ClusterRef(_kubeconfig(tmp_path, api), None, "provider"), "provider", CONSUMER, timeout_s=10)
        assert await fu.force_unpeer(req, Recorder()) == 5
        assert {n for (r, _ns, n) in server.objects if r == "namespaces"} == {"team-a"}
        left = [k for k in server.objects if k[0] in ("tenants", "foreignclusters", "certificatesigningrequests")]
        assert left == []


# ---- a plain unpeer with one side gone


async def test_a_plain_unpeer_with_the_provider_gone_says_what_force_would_delete(tmp_path: Path) -> None:
    async with serve(_Server()) as (server, api):
        _populate_consumer(server)
        gone = tmp_path / "gone"
        gone.write_text(yaml.safe_dump(kubeconfig_of("http://127.0.0.1:1", {"token": "x"})))

        def url(fc: dict[str, Any]) -> None:
            fc["spec"]["apiServerUrl"] = "http://127.0.0.1:1"

        server.update("foreignclusters", "", PROVIDER, url)
        consumer = ClusterRef(_kubeconfig(tmp_path, api), None, "consumer")
        with pytest.raises(PeerError) as e:
            await fu.unreachable_hint(consumer, ClusterRef(gone, None, "provider"))
        text = str(e.value)
        assert "does not answer" in text and f"gpufed unpeer --force --provider {PROVIDER}" in text
        assert f"virtual node {NODE}" in text and "pod team-a/runs (failed back: ProviderGone)" in text
        assert not [r for r in server.requests if r.method in ("DELETE", "PATCH", "PUT", "POST")]
        await fu.unreachable_hint(consumer, consumer)  # both answer: nothing to say


# ---- the CLI's local checks


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["unpeer", *args])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--force"], "name it with --provider ID"),
        (["--force", "--provider", PROVIDER, "--consumer", CONSUMER], "not both"),
        (["--provider", PROVIDER], "with --force only"),
        (["--force", "--provider", PROVIDER, "--remote-context", "gpu-a"], "one cluster"),
        (["--force", "--provider", "Not_An_ID"], "invalid cluster ID"),
    ],
)
def test_force_usage_errors_exit_2_before_any_call(tmp_path: Path, args: list[str], expected: str) -> None:
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump(kubeconfig_of("http://127.0.0.1:1", {"token": "x"})))
    res = _cli("--kubeconfig", str(kc), *args)
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.stderr.split())


def test_force_runs_against_the_named_cluster_only(tmp_path: Path) -> None:
    res = _cli("--kubeconfig", str(tmp_path / "missing"), "--force", "--provider", PROVIDER)
    assert res.exit_code == 2 and "does not exist" in res.stderr
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump(kubeconfig_of("http://127.0.0.1:1", {"token": "x"})))
    res = _cli("--kubeconfig", str(kc), "--force", "--consumer", CONSUMER)
    assert res.exit_code == 1 and "cannot reach the provider API server" in res.stderr, res.output
