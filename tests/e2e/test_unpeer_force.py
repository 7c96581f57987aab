"""`gpufed unpeer --force` on the real local clusters: a provider whose API server is stopped for
good is forgotten on the consumer (virtual node, virtual kubelet, credentials, gateway gone; its pod
failed back with reason ProviderGone and a Warning Event, the Deployment's replacement Pending),
then, with gpu-b back and the consumer treated as gone, the consumer is forgotten on the provider
(tenant and twin namespaces, twins, CSRs, gateway). A plain unpeer with one side missing refuses
and names the `--force` command and what it would delete.

The test stops gpu-b's kube-apiserver and starts it again before it ends (whatever happens), and
leaves no peering behind, so later modules find the shared clusters as they were.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.apis.wire import PROVIDER_LABEL
from tests.e2e.conftest import Clusters
from tests.e2e.drills.test_control_plane import component, stop
from tests.e2e.helpers import cluster_id, eventually, gpufed, leftovers, offload, out, peer, processes, unpeer

pytestmark = pytest.mark.e2e

PROVIDER = "gpu-b"


def _deployment(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": {
                "metadata": {"labels": {"app": "trainer"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/app:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


def _pods(clusters: Clusters, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace)["items"]
    return items


def _dead_consumer_kubeconfig(clusters: Clusters, path: Path) -> Path:
    """The environment's kubeconfig with the consumer's API server at an address nothing listens on."""
    kc = yaml.safe_load(clusters.kubeconfig.read_text())
    cluster = next(c["context"]["cluster"] for c in kc["contexts"] if c["name"] == "consumer")
    for c in kc["clusters"]:
        if c["name"] == cluster:
            c["cluster"]["server"] = "https://127.0.0.1:1"
    path.write_text(yaml.safe_dump(kc))
    return path


def test_unpeer_force_on_each_side_when_the_other_is_gone(clusters: Clusters, namespace: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    kc = str(clusters.kubeconfig)
    p = peer(clusters, PROVIDER, "--gpus", "4")
    assert p.returncode == 0, out(p)
    cid, pid = cluster_id(clusters, "consumer"), cluster_id(clusters, PROVIDER)
    selector = f"gpufed.io/remote-cluster-id={pid}"

    def vnodes() -> list[str]:
        return [
            n["metadata"]["name"] for n in clusters.kubectl_json("consumer", "get", "nodes", "-l", selector)["items"]
        ]

    nodes = vnodes()
    assert nodes, "no virtual node of gpu-b"
    twin_ns = f"{namespace}-{cid}"
    stopped = False
    try:
        offload(clusters, namespace)
        clusters.create("consumer", _deployment(namespace))

        def running() -> dict[str, Any] | None:
            for pod in _pods(clusters, namespace):
                if pod["spec"].get("nodeName") in nodes and pod["status"].get("phase") == "Running":
                    return pod
            return None

        victim = eventually("the pod running on gpu-b's virtual node", running, timeout=90)
        assert clusters.kubectl_json(PROVIDER, "get", "pods", "-n", twin_ns)["items"], "no twin on gpu-b"

        stop(component(clusters, PROVIDER, "kube-apiserver"), signal.SIGKILL)  # gone for good
        stopped = True
        t_stop = time.monotonic()

        # A plain unpeer cannot reach gpu-b: it refuses and says what --force would delete.
        p = unpeer(clusters, PROVIDER)
        assert p.returncode == 1, out(p)
        hint = " ".join(p.stderr.split())
        assert f"gpufed unpeer --force --provider {pid}" in hint, hint
        assert all(f"virtual node {n}" in hint for n in nodes) and "ProviderGone" in hint, hint
        assert vnodes() == nodes, "a refused unpeer removes nothing"

        p = gpufed("unpeer", "--kubeconfig", kc, "--context", "consumer", "--force", "--provider", pid)
        assert p.returncode == 0, out(p)
        forced_s = time.monotonic() - t_stop
        assert "forgot" in p.stdout and "failed back" in p.stderr, out(p)

        # Nothing of gpu-b is left on the consumer.
        assert vnodes() == []
        assert clusters.kubectl_json("consumer", "get", "foreignclusters.gpufed.io")["items"] == []
        assert clusters.kubectl_json("consumer", "get", "gateways.gpufed.io", "-A")["items"] == []
        secrets = clusters.kubectl_json("consumer", "get", "secrets", "-n", "gpufed", "-l", f"{PROVIDER_LABEL}={pid}")
        assert secrets["items"] == []
        state = str(clusters.env.state_dir)
        eventually(
            "gpu-b's virtual kubelet to exit",
            lambda: not processes(state, "virtual-kubelet", f"--provider-cluster-id={pid}"),
            timeout=60,
        )
        # The pod failed back with a reason a user understands (until the pod garbage collector
        # removes it from the gone node), a Warning Event on it, and its replacement waits.
        name = victim["metadata"]["name"]
        left = clusters.kubectl("consumer", "get", "pod", name, "-n", namespace, "-o", "json", check=False)
        if left.returncode == 0:
            st = json.loads(left.stdout)["status"]
            assert st["phase"] == "Failed" and st["reason"] == "ProviderGone", st
            assert pid in st["message"], st
        events = clusters.kubectl_json(
            "consumer", "get", "events", "-n", namespace, "--field-selector", "reason=ProviderGone"
        )["items"]
        assert [(e["type"], e["involvedObject"]["name"]) for e in events] == [("Warning", name)], events
        eventually(
            "the Deployment's replacement, Pending with nowhere to run",
            lambda: [
                q
                for q in _pods(clusters, namespace)
                if q["metadata"]["name"] != name and q["status"].get("phase") == "Pending"
            ],
            timeout=60,
        )
        again = gpufed("unpeer", "--kubeconfig", kc, "--context", "consumer", "--force", "--provider", pid)
        assert again.returncode == 0 and "nothing to remove" in again.stderr, out(again)
    finally:
        t_up = time.monotonic()
        if stopped:
            asyncio.run(clusters.env.up())  # gpu-b's apiserver back, for the provider side and later modules
    t_back = time.monotonic()

    # gpu-b is back; the consumer is treated as gone: a plain unpeer refuses and names --force there.
    dead = _dead_consumer_kubeconfig(clusters, tmp_path / "dead-consumer.yaml")
    p = gpufed(
        "unpeer",
        "--kubeconfig",
        str(dead),
        "--context",
        "consumer",
        "--remote-kubeconfig",
        kc,
        "--remote-context",
        PROVIDER,
    )
    assert p.returncode == 1, out(p)
    hint = " ".join(p.stderr.split())
    assert f"gpufed unpeer --force --consumer {cid}" in hint and f"namespace {twin_ns}" in hint, hint

    t_force = time.monotonic()
    p = gpufed("unpeer", "--kubeconfig", kc, "--context", PROVIDER, "--force", "--consumer", cid)
    assert p.returncode == 0, out(p)
    provider_force_s = time.monotonic() - t_force
    assert clusters.kubectl(PROVIDER, "get", "namespace", twin_ns, check=False).returncode != 0
    assert leftovers(clusters) == []
    print(
        f"\n[unpeer --force] consumer side {forced_s:.1f}s after gpu-b stopped; gpu-b's restart "
        f"{t_back - t_up:.1f}s; provider side {provider_force_s:.1f}s; test {time.monotonic() - t0:.1f}s"
    )


@pytest.fixture(autouse=True)
def _nothing_left_behind(clusters: Clusters) -> Any:
    """Whatever happens above, the next module finds no peering with gpu-b."""
    yield
    if leftovers(clusters):
        unpeer(clusters, PROVIDER)
