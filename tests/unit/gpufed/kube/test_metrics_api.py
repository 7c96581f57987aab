"""The two metrics every gpufed process serves: `gpufed_build_info` (gpufed.kube.metrics: which gpufed
and Python run) and `gpufed_api_requests_total` (gpufed.kube.rest: every request to an API server by
method, resource and status code, the resource named by `resource_of`), driven through the fake API
server. The registry is global (other tests move the same series), so every check of the counter
compares a sample before and after."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufed.kube import metrics, rest
from gpufed.kube.client import KubeError
from tests.unit.fakes import serve

REPO = Path(__file__).resolve().parents[4]
NS = "team-a"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def requests_of(method: str, resource: str, code: str) -> Callable[[], float]:
    """The increase of gpufed_api_requests_total{method, resource, code} since this call."""
    labels = {"method": method, "resource": resource, "code": code}
    start = value("gpufed_api_requests_total", **labels)
    return lambda: value("gpufed_api_requests_total", **labels) - start


def pod(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": {}}


# ---- gpufed_build_info


def test_build_info_is_one_series_naming_the_installed_gpufed_and_the_running_python() -> None:
    text = generate_latest(REGISTRY).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "gpufed_build_info"]
    (sample,) = family.samples
    assert sample.value == 1.0
    assert sample.labels == {"version": importlib.metadata.version("gpufed"), "python": platform.python_version()}
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert sample.labels["version"] == declared


def test_build_info_says_unknown_when_gpufed_is_not_installed_as_a_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert metrics._version() == "unknown"


# ---- resource_of


@pytest.mark.parametrize(
    ("url_path", "resource"),
    [
        ("/api/v1/namespaces/team-a/pods", "pods"),
        ("/api/v1/namespaces/team-a/pods/web", "pods"),
        ("/api/v1/namespaces/team-a/pods/web/status", "pods/status"),
        ("/api/v1/namespaces/team-a/pods/web/log?container=main&follow=true", "pods/log"),
        ("/api/v1/namespaces/team-a/pods/web/exec?command=ls", "pods/exec"),
        ("/api/v1/namespaces/team-a/serviceaccounts/default/token", "serviceaccounts/token"),
        ("/api/v1/namespaces", "namespaces"),
        ("/api/v1/namespaces/team-a", "namespaces"),
        ("/api/v1/nodes/gpu-a", "nodes"),
        ("/api/v1/nodes/gpu-a/status", "nodes/status"),
        ("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-a", "leases"),
        ("/apis/gpufed.io/v1alpha1/namespaces/gpufed/gateways/gpu-a-1/status", "gateways/status"),
        ("/apis/gpufed.io/v1alpha1/tenants/consumer-1/status", "tenants/status"),
        ("/apis/gpufed.io/v1alpha1/foreignclusters?watch=true&resourceVersion=7", "foreignclusters"),
        ("/api", "-"),
        ("/api/v1", "-"),
        ("/apis", "-"),
        ("/apis/resource.k8s.io/v1", "-"),
        ("/version", "-"),
        ("/healthz", "-"),
        ("/", "-"),
    ],
)
def test_resource_of_names_the_resource_never_an_object_or_a_namespace(url_path: str, resource: str) -> None:
    assert rest.resource_of(url_path) == resource


# ---- gpufed_api_requests_total, through the client


async def test_each_request_counts_once_with_its_method_resource_and_code() -> None:
    created = requests_of("POST", "pods", "201")
    read = requests_of("GET", "pods", "200")
    missing = requests_of("GET", "pods", "404")
    status = requests_of("PATCH", "pods/status", "200")
    conflict = requests_of("POST", "pods", "409")
    deleted = requests_of("DELETE", "pods", "200")
    async with serve() as (server, api):
        collection = rest.path("v1", "pods", namespace=NS)
        await rest.create(api, collection, pod("web"))
        assert created() == 1
        assert (await rest.get(api, rest.path("v1", "pods", "web", namespace=NS)) or {})["metadata"]["name"] == "web"
        assert await rest.get(api, rest.path("v1", "pods", "gone", namespace=NS)) is None
        assert (read(), missing()) == (1, 1)
        await rest.merge_patch(api, rest.path("v1", "pods", "web", namespace=NS, sub="status"), {"status": {}})
        assert status() == 1
        with pytest.raises(KubeError) as refused:
            await rest.create(api, collection, pod("web"))
        assert refused.value.conflict and conflict() == 1
        await rest.delete(api, rest.path("v1", "pods", "web", namespace=NS))
        assert deleted() == 1
        # a list is a GET of the collection, counted under the same resource (the pod terminates)
        assert [p["metadata"]["name"] for p in await rest.list_items(api, collection)] == ["web"]
        assert read() == 2
        assert created() == 1  # the refused create counted under its own code only
        assert len(server.requests) == 7


async def test_a_request_that_gets_no_answer_counts_with_code_0() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    unanswered = requests_of("GET", "secrets", "0")
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        with pytest.raises(KubeError) as failed:
            await rest.get(api, rest.path("v1", "secrets", "gpufed-identity", namespace="gpufed"))
    finally:
        await api.close()
    assert failed.value.status == 0 and failed.value.transient
    assert unanswered() == 1
