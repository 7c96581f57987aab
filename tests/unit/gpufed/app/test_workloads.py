"""Per-peering workloads: templates are checked (only a Deployment and Services), rendered per peer
(names, labels, selectors, env, owner), and the controller's reconciler applies them for peered
providers and removes them when the peering goes; plus the chart's copies of CRDs and RBAC and the
image recipe's references."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.apis.meta import API_VERSION
from gpufed.app.workloads import VIRTUAL_KUBELET, Workloads, WorkloadSettings, load
from tests.paths import REPO
from tests.unit.fakes import serve
from vkprovider.forge import workloads as forge

CHART = REPO / "deploy" / "charts" / "gpufed"

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "gpufed-virtual-kubelet", "labels": {"app.kubernetes.io/name": "gpufed"}},
    "spec": {
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "gpufed"}},
            "spec": {
                "containers": [
                    {
                        "name": "virtual-kubelet",
                        "image": "gpufed:0.1.0",
                        "env": [{"name": "GPUFED_PROVIDER", "value": "x"}],
                    }
                ]
            },
        },
    },
}
SERVICE: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpufed-vk"}, "spec": {}}
OWNER = {"apiVersion": API_VERSION, "kind": "ForeignCluster", "name": "gpu-a-1234", "uid": "u-1"}


def template(*docs: Any) -> forge.Template:
    return forge.check("virtual-kubelet", "virtual-kubelet", "GPUFED_PROVIDER", docs, source="t.yaml")


def test_render_names_labels_selects_and_owns_per_peer() -> None:
    deployment, service = forge.render(template(DEPLOYMENT, SERVICE), "gpu-a-1234", "gpufed", OWNER)
    assert deployment["metadata"]["name"] == "gpufed-virtual-kubelet-gpu-a-1234"
    assert deployment["metadata"]["namespace"] == "gpufed"
    want = {"gpufed.io/component": "virtual-kubelet", "gpufed.io/remote-cluster-id": "gpu-a-1234"}
    assert deployment["spec"]["selector"] == {"matchLabels": want}
    assert want.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufed"
    assert deployment["metadata"]["ownerReferences"] == [OWNER]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [{"name": "GPUFED_PROVIDER", "value": "gpu-a-1234"}], "the template's value replaced"
    assert service["spec"]["selector"] == want
    assert DEPLOYMENT["metadata"]["name"] == "gpufed-virtual-kubelet", "the template is not changed"


def test_long_names_are_shortened_stably() -> None:
    peer = "a-very-long-cluster-name-that-goes-on-and-on-1234abcd"
    name = forge.name_for("gpufed-virtual-kubelet", peer)
    assert len(name) <= 63
    assert name == forge.name_for("gpufed-virtual-kubelet", peer)
    assert name != forge.name_for("gpufed-virtual-kubelet", peer + "x")


@pytest.mark.parametrize(
    ("docs", "message"),
    [
        ([SERVICE], "exactly one Deployment"),
        ([DEPLOYMENT, DEPLOYMENT], "exactly one Deployment"),
        ([DEPLOYMENT, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole"}], "not allowed"),
        ([DEPLOYMENT, "text"], "not a Kubernetes object"),
        ([{**DEPLOYMENT, "metadata": {}}], "metadata.name is missing"),
        ([{**DEPLOYMENT, "spec": {"template": {"spec": {"containers": [{"name": "other"}]}}}}], "no container named"),
    ],
)
def test_bad_templates_are_refused_with_the_reason(docs: list[Any], message: str) -> None:
    with pytest.raises(forge.TemplateError, match=message):
        template(*docs)


def test_an_unreadable_template_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "vk.yaml"
    bad.write_text("a: [unclosed")
    with pytest.raises(forge.TemplateError, match=str(bad)):
        load(bad, VIRTUAL_KUBELET)
    with pytest.raises(forge.TemplateError, match="cannot read"):
        load(tmp_path / "missing.yaml", VIRTUAL_KUBELET)


def fc(name: str, *, peered: bool, roles: tuple[str, ...] = ("Provider",)) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ForeignCluster",
        "metadata": {"name": name},
        "spec": {"clusterID": name, "roles": list(roles)},
        "status": {"kubeconfigSecret": f"gpufed-remote-{name}"} if peered else {},
    }


async def test_the_reconciler_follows_peered_providers(tmp_path: Path) -> None:
    path = tmp_path / "vk.yaml"
    path.write_text(yaml.safe_dump(DEPLOYMENT))
    async with serve() as (server, api):
        server.create("foreignclusters", fc("gpu-a", peered=True), API_VERSION)
        server.create("foreignclusters", fc("gpu-b", peered=False), API_VERSION)
        server.create("foreignclusters", fc("consumer-x", peered=True, roles=("Consumer",)), API_VERSION)
        workloads = Workloads(api, WorkloadSettings(virtual_kubelet_template=path))
        await workloads.sync()
        names = {d["metadata"]["name"] for d in server.items("deployments", "gpufed")}
        assert names == {"gpufed-virtual-kubelet-gpu-a"}, "only peered providers get a virtual kubelet"
        owner = server.get("deployments", "gpufed", "gpufed-virtual-kubelet-gpu-a")
        assert owner is not None
        assert owner["metadata"]["ownerReferences"][0]["name"] == "gpu-a"
        # Peering gone: the workload goes (with a UID precondition); an unrelated Deployment stays.
        server.create(
            "deployments",
            {"metadata": {"name": "mine", "namespace": "gpufed", "labels": {"app": "x"}}},
            "apps/v1",
        )
        server.remove("foreignclusters", "", "gpu-a")
        await workloads.sync()
        assert {d["metadata"]["name"] for d in server.items("deployments", "gpufed")} == {"mine"}
        (delete,) = server.calls("DELETE", "/apis/apps/v1/namespaces/gpufed/deployments/gpufed-virtual-kubelet-gpu-a")
        assert delete.body["preconditions"]["uid"] == owner["metadata"]["uid"]


async def test_client_side_gateways_get_no_service(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    gw_deployment = {**DEPLOYMENT, "metadata": {"name": "gpufed-gateway"}}
    gw_deployment["spec"] = {"template": {"spec": {"containers": [{"name": "gateway", "image": "gpufed:0.1.0"}]}}}
    path.write_text(yaml.safe_dump_all([gw_deployment, {**SERVICE, "metadata": {"name": "gpufed-gateway"}}]))

    def gateway(name: str, role: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "gpufed"}, "spec": {"role": role}}

    async with serve() as (server, api):
        server.create("gateways", gateway("consumer-x", "Server"), API_VERSION)
        server.create("gateways", gateway("gpu-a", "Client"), API_VERSION)
        workloads = Workloads(api, WorkloadSettings(gateway_template=path))
        await workloads.sync()
        deployments = {d["metadata"]["name"] for d in server.items("deployments", "gpufed")}
        assert deployments == {"gpufed-gateway-consumer-x", "gpufed-gateway-gpu-a"}
        services = {d["metadata"]["name"] for d in server.items("services", "gpufed")}
        assert services == {"gpufed-gateway-consumer-x"}, "only the listening (Server) gateway needs a Service"


# ---- the chart's copies and the image recipe


@pytest.mark.parametrize(
    ("copy_dir", "source_dir"),
    [("crds", "deploy/crds"), ("files/rbac", "deploy/rbac"), ("files/grafana", "deploy/grafana")],
)
def test_the_chart_carries_exact_copies(copy_dir: str, source_dir: str) -> None:
    source = {p.name: p.read_bytes() for p in (REPO / source_dir).iterdir() if p.is_file()}
    copied = {p.name: p.read_bytes() for p in (CHART / copy_dir).iterdir() if p.is_file()}
    assert source, source_dir
    assert copied == source, (
        f"deploy/charts/gpufed/{copy_dir} differs from {source_dir}: cp {source_dir}/* {CHART / copy_dir}/"
    )


def test_the_image_recipe_names_what_exists() -> None:
    text = (REPO / "deploy" / "image" / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY") and "--from=" not in line:
            *sources, _dest = line.split()[1:]
            for s in sources:
                assert (REPO / s).exists(), f"the Dockerfile copies {s}, which is not in the repository"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entry = re.search(r'ENTRYPOINT \["([^"]+)"\]', text)
    assert entry is not None
    assert Path(entry.group(1)).name in scripts, "the entrypoint is gpufed's console script"
    assert re.search(r"^USER 65532:65532$", text, re.M), "runs as non-root"
    assert "golang.zx2c4.com/wireguard" in (REPO / "deploy" / "local" / "go.mod").read_text()
    froms = re.findall(r"^FROM \S+(?: AS (\S+))?$", text, re.M)
    assert len(froms) >= 3, "multi-stage"
    for stage in re.findall(r"--from=(\S+)", text):
        assert stage in froms, f"COPY --from={stage}: no such stage"


def test_virtual_kubelet_children_do_not_inherit_the_controllers_metrics_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufed.app.supervisor import child_environment

    monkeypatch.setenv("GPUFED_METRICS_PORT", "9090")
    monkeypatch.setenv("GPUFED_LOG_LEVEL", "debug")
    env = child_environment()
    assert "GPUFED_METRICS_PORT" not in env
    assert env["GPUFED_LOG_LEVEL"] == "debug", "the rest is inherited"
