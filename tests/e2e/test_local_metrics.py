"""The resource metrics API on the local clusters: the upstream metrics-server scraping kwok's simulated
kubelet metrics over verified TLS, so `kubectl top` works for pods on kwok nodes, on every cluster."""

from __future__ import annotations

import functools
import json
import subprocess
from decimal import Decimal
from typing import Any

from gpufed.apis.quantity import parse
from gpufed.localenv import kwokcfg, metricsserver
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually

#: metrics-server needs two scrapes (10 s apart) of a pod before it reports it.
METRICS_WAIT_S = 90


def admin_kubectl(clusters: Clusters, cluster: str, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl with the cluster's own admin kubeconfig (not the merged one)."""
    return subprocess.run(
        [str(clusters.env.binary("kubectl")), f"--kubeconfig={clusters.env.kubeconfig_path(cluster)}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def top_pods(clusters: Clusters, cluster: str, namespace: str) -> dict[str, tuple[Decimal, Decimal]]:
    """pod -> (CPU cores, memory bytes) as `kubectl top pod` prints them; empty until metrics exist."""
    p = admin_kubectl(clusters, cluster, "top", "pod", "-n", namespace, "--no-headers")
    if p.returncode != 0:  # "metrics not available yet" until metrics-server has two scrapes
        return {}
    out = {}
    for line in p.stdout.splitlines():
        name, cpu, memory = line.split()[:3]
        out[name] = (parse(cpu), parse(memory))
    return out


def node_metrics(clusters: Clusters, cluster: str) -> dict[str, dict[str, Any]]:
    p = admin_kubectl(clusters, cluster, "get", "--raw", f"/apis/{metricsserver.GROUP}/{metricsserver.VERSION}/nodes")
    assert p.returncode == 0, p.stderr
    return {item["metadata"]["name"]: item["usage"] for item in json.loads(p.stdout)["items"]}


def node_metrics_covering(clusters: Clusters, cluster: str, nodes: set[str]) -> dict[str, dict[str, Any]]:
    """Node metrics once they include every one of `nodes`, else empty."""
    metrics = node_metrics(clusters, cluster)
    return metrics if nodes <= set(metrics) else {}


def kwok_nodes(clusters: Clusters, cluster: str) -> set[str]:
    nodes = clusters.kubectl_json(cluster, "get", "nodes")["items"]
    return {
        n["metadata"]["name"]
        for n in nodes
        if (n["metadata"].get("annotations") or {}).get(kwokcfg.KWOK_NODE_ANNOTATION) == "fake"
    }


def near(value: Decimal, expected: str) -> bool:
    """Within 10 %: CPU is a rate over two scrapes whose timestamps are metrics-server's, not kwok's."""
    want = parse(expected)
    return abs(value - want) <= want / 10


def test_kubectl_top_pod_shows_usage_of_pods_on_kwok_nodes(clusters: Clusters, namespace: str) -> None:
    ctx = "gpu-a"
    clusters.run_pod(ctx, namespace, "plain", ready=False)
    clusters.run_pod(
        ctx,
        namespace,
        "sized",
        ready=False,
        container={"resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}},
    )
    clusters.create(
        ctx,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "annotated",
                "namespace": namespace,
                "annotations": {kwokcfg.USAGE_CPU_ANNOTATION: "250m", kwokcfg.USAGE_MEMORY_ANNOTATION: "100Mi"},
            },
            "spec": {
                "containers": [
                    {"name": "main", "image": "registry.example/app:1", "resources": {"requests": {"cpu": "4"}}}
                ]
            },
        },
    )

    def node_of(name: str) -> str | None:
        node: str | None = clusters.kubectl_json(ctx, "get", "pod", "-n", namespace, name)["spec"].get("nodeName")
        return node

    fake = kwok_nodes(clusters, ctx)
    for name in ("plain", "sized", "annotated"):
        node = eventually(f"pod {name} scheduled", functools.partial(node_of, name))
        assert node in fake, f"{node} is not a kwok node"

    names = {"plain", "sized", "annotated"}
    usage = eventually(
        "kubectl top pod to show every pod",
        lambda: (t := top_pods(clusters, ctx, namespace)) and names <= set(t) and t,
        timeout=METRICS_WAIT_S,
    )
    for name in names:
        cpu, memory = usage[name]
        assert cpu > 0 and memory > 0, (name, usage[name])
    # No request, no annotation: a small default; requests: half of them (+1m / 1Mi); the annotation wins.
    assert near(usage["plain"][0], kwokcfg.DEFAULT_CPU_USAGE), usage
    assert usage["plain"][1] == parse(kwokcfg.DEFAULT_MEMORY_USAGE), usage
    assert near(usage["sized"][0], "1001m") and usage["sized"][1] == parse("513Mi"), usage
    assert near(usage["annotated"][0], "250m") and usage["annotated"][1] == parse("100Mi"), usage


def test_node_metrics_list_every_kwok_node_with_usage(clusters: Clusters) -> None:
    for ctx in ("gpu-a", "gpu-b", "consumer"):
        fake = kwok_nodes(clusters, ctx)
        assert fake
        metrics = eventually(
            f"node metrics of every kwok node of {ctx}",
            functools.partial(node_metrics_covering, clusters, ctx, fake),
            timeout=METRICS_WAIT_S,
        )
        for node in fake:
            # Even an empty node reports its system share, or metrics-server would drop it.
            assert parse(metrics[node]["cpu"]) > 0 and parse(metrics[node]["memory"]) > 0, (ctx, node, metrics[node])


def test_metrics_api_is_available_on_the_consumer(clusters: Clusters) -> None:
    api = clusters.kubectl_json("consumer", "get", "apiservice", metricsserver.APISERVICE)
    assert metricsserver.available(api), api.get("status")
    assert api["spec"]["service"] == {
        "namespace": metricsserver.NAMESPACE,
        "name": metricsserver.SERVICE,
        "port": clusters.topology.ports("consumer").metrics_server,
    }
    assert not api["spec"].get("insecureSkipTLSVerify")


def test_metrics_server_has_exactly_the_access_it_needs(clusters: Clusters) -> None:
    def can(verb: str, resource: str, subresource: str = "") -> bool:
        sub = [f"--subresource={subresource}"] if subresource else []
        p = clusters.kubectl(
            "consumer", "auth", "can-i", verb, resource, *sub, f"--as={metricsserver.USER}", check=False
        )
        return p.stdout.strip() == "yes"

    assert can("get", "nodes", "metrics") and can("get", "nodes", "stats")
    assert can("list", "pods") and can("watch", "nodes")
    assert not can("get", "nodes", "proxy") and not can("get", "nodes", "log")
    assert not can("get", "secrets") and not can("create", "pods") and not can("update", "nodes")
