"""Helpers the e2e modules share: the gpufed CLI as a user runs it, peering, offloading, polling, workloads,
pausing a component, and the pod attacks of tests/e2e/attacks (one or more per pod rule)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from gpufed.apis.wire import CONSUMER_LABEL, PROVIDER_LABEL, ClusterID
from gpufed.kube.client import client_from_dict
from gpupool.capacity import PodShape
from gpupool.estimator.client import from_provider
from tests.e2e.conftest import REPO, Clusters

#: The GPU product of gpu-a's nodes in the local topology.
H100 = "NVIDIA-H100-80GB-HBM3"

GPUFED = (sys.executable, "-m", "gpufed.cli")
GPUFED_ENV = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}


def gpufed(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUFED, *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO, env=GPUFED_ENV
    )


def gpufed_timed(*args: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess[str], list[tuple[float, str]]]:
    """`gpufed` with stdout and stderr merged and each line stamped with the seconds since the start,
    so that a slow run shows which step the time went to. Killed after `timeout` (returncode -9, and
    a last line saying so)."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        [*GPUFED, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=GPUFED_ENV
    ) as proc:
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                lines.append((time.monotonic() - started, line.rstrip("\n")))
        finally:
            timer.cancel()
        code = proc.wait()
    if code == -9:
        lines.append((time.monotonic() - started, f"(killed after {timeout:.0f} s)"))
    text = "".join(f"{line}\n" for _, line in lines)
    return subprocess.CompletedProcess(proc.args, code, text, ""), lines


def slow_steps(lines: list[tuple[float, str]], over_s: float) -> list[str]:
    """The lines of a `gpufed_timed` run that came more than `over_s` after the line before."""
    found, last = [], 0.0
    for at, line in lines:
        if at - last > over_s:
            found.append(f"+{at - last:.1f}s at {at:.1f}s: {line.strip()}")
        last = at
    return found


def _pair_args(verb: str, clusters: Clusters, provider: str) -> tuple[str, ...]:
    """`gpufed VERB` between the consumer and `provider`, both contexts of the environment's kubeconfig."""
    kc = str(clusters.kubeconfig)
    return (verb, "--kubeconfig", kc, "--context", "consumer", "--remote-kubeconfig", kc, "--remote-context", provider)


def peer_args(clusters: Clusters, provider: str, *extra: str) -> tuple[str, ...]:
    return (*_pair_args("peer", clusters, provider), *extra)


def unpeer_args(clusters: Clusters, provider: str) -> tuple[str, ...]:
    return _pair_args("unpeer", clusters, provider)


def peer(clusters: Clusters, provider: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return gpufed(*peer_args(clusters, provider, *extra))


def unpeer(clusters: Clusters, provider: str) -> subprocess.CompletedProcess[str]:
    return gpufed(*unpeer_args(clusters, provider))


def cluster_id(clusters: Clusters, context: str) -> ClusterID:
    cm = clusters.kubectl_json(context, "get", "configmap", "-n", "gpufed", "gpufed-identity")
    return ClusterID(cm["data"]["clusterId"])


def eventually(what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def out(p: subprocess.CompletedProcess[str]) -> str:
    return p.stdout + p.stderr


def leftovers(clusters: Clusters) -> list[str]:
    """Every peering object on any cluster (installation objects such as CRDs and roles excluded)."""
    found = []
    for c in ("consumer", "gpu-a", "gpu-b"):
        for kind in (
            "tenants.gpufed.io",
            "foreignclusters.gpufed.io",
            "resourceslices.gpufed.io",
            "twinnamespaces.gpufed.io",
            "gateways.gpufed.io",
            "connections.gpufed.io",
            "remotenetworks.gpufed.io",
        ):
            items = clusters.kubectl_json(c, "get", kind, "-A")["items"]
            found += [f"{c}: {kind}/{i['metadata']['name']}" for i in items]
        for kind in ("namespaces", "certificatesigningrequests"):
            items = clusters.kubectl_json(c, "get", kind, "-l", CONSUMER_LABEL)["items"]
            found += [f"{c}: {kind}/{i['metadata']['name']}" for i in items]
        nodes = clusters.kubectl_json(c, "get", "nodes", "-l", "gpufed.io/type=virtual-node")["items"]
        found += [f"{c}: node/{i['metadata']['name']}" for i in nodes]
        secrets = clusters.kubectl_json(c, "get", "secrets", "-n", "gpufed")["items"]
        found += [
            f"{c}: secret/{i['metadata']['name']}"
            for i in secrets
            if PROVIDER_LABEL in (i["metadata"].get("labels") or {}) or i["metadata"]["name"].startswith("gpufed-wg-")
        ]
    return found


def peered_session(clusters: Clusters, providers: dict[str, tuple[str, ...]]) -> Iterator[dict[str, ClusterID]]:
    """Peer the consumer with each provider (extra `gpufed peer` flags per provider) for the
    duration of a module; unpeer afterwards and check that nothing is left. Yields context -> ClusterID."""
    for provider, extra in providers.items():
        p = peer(clusters, provider, *extra)
        assert p.returncode == 0, out(p)
    try:
        yield {c: cluster_id(clusters, c) for c in ("consumer", *providers)}
    finally:
        for provider in providers:
            p = unpeer(clusters, provider)
            assert p.returncode == 0, out(p)


def offload(clusters: Clusters, namespace: str, *flags: str) -> None:
    p = gpufed(
        "offload-namespace", namespace, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer", *flags
    )
    assert p.returncode == 0, out(p)


def deployment(name: str, namespace: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "nginx:1.27",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                    **spec,
                },
            },
        },
    }


def processes(*needles: str) -> dict[int, str]:
    """pid -> command line (arguments joined by spaces) of the live processes whose command line
    contains every needle."""
    found: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd and all(n in cmd for n in needles):
            found[int(d.name)] = cmd
    return found


@contextlib.contextmanager
def component_paused(clusters: Clusters, cluster: str, component: str) -> Iterator[None]:
    """`component` of `cluster` (e.g. gpu-a's `gpufed-controller`) stopped with SIGSTOP, so that what a
    test writes stays as written (its reconcilers would put it back); resumed (SIGCONT) whatever happens."""
    statuses = {s.name: s for s in asyncio.run(clusters.env.status())}
    pid = next(c.pid for c in statuses[cluster].components if c.name == component)
    assert pid is not None, f"{component} of {cluster} is not running"
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------------------- pod attacks (tests/e2e/attacks)


def gpu_load(name: str, namespace: str, node: str, gpus: int) -> dict[str, Any]:
    """A provider's own pod, pinned to one of its nodes, that takes `gpus` GPUs there."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "local/load:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def vk_log_lines(clusters: Clusters, provider: str, *needles: str) -> list[str]:
    """Lines of the consumer's virtual-kubelet log(s) for `provider` holding every needle, in order."""
    lines: list[str] = []
    for log in sorted((clusters.env.cluster_dir("consumer") / "logs").glob(f"virtual-kubelet-{provider}*")):
        with contextlib.suppress(OSError):
            lines += [line for line in log.read_text(errors="replace").splitlines() if all(n in line for n in needles)]
    return lines


def consumer_credentials(clusters: Clusters, provider: str) -> dict[str, Any]:
    """The kubeconfig the consumer's virtual kubelet uses at `provider` (its Secret on the consumer)."""
    secret = clusters.kubectl_json("consumer", "get", "secret", "-n", "gpufed", f"gpufed-remote-{provider}")
    cfg: dict[str, Any] = yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"]))
    return cfg


def estimator_max_replicas(clusters: Clusters, provider: str, shape: PodShape) -> int:
    """How many pods of `shape` `provider`'s capacity estimator says fit now, asked as the consumer."""
    cfg = consumer_credentials(clusters, provider)

    async def ask() -> int:
        remote = await client_from_dict(cfg)
        try:
            estimator = await from_provider(remote, cfg)
            assert estimator is not None, f"{provider} publishes no estimator endpoint"
            try:
                replicas, _ = await estimator.max_replicas(shape)
            finally:
                await estimator.close()
            return replicas
        finally:
            await remote.close()

    return asyncio.run(ask())
