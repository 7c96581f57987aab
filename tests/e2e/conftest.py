"""e2e fixtures: the real local clusters, brought up once per session.

By default the session starts its own environment (state in `.cache/e2e`, ports from 18000, so it
never collides with `make demo`'s clusters) and stops it at the end. `--reuse-clusters` uses an
environment that is already running (`make clusters-up`, state in $GPUFED_LOCAL_DIR) and leaves it
running. When a test fails, a diagnostics dump (nodes, pods, events, tails of the component logs)
is attached to its report.

A missing prerequisite (Go, a failed build, a component that will not start) fails the session
loudly: these tests are never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufed.kube.client import api_client
from gpufed.localenv import manifests
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import Topology, default_topology

REPO = Path(__file__).resolve().parents[2]
#: Parallel sessions (e.g. two worktrees) set GPUFED_E2E_BASE_PORT and GPUFED_E2E_DIR apart.
E2E_BASE_PORT = int(os.environ.get("GPUFED_E2E_BASE_PORT", "18000"))
#: Job pods on the e2e clusters run this long before completing.
E2E_JOB_SECONDS = 3.0


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("gpufed e2e")
    g.addoption(
        "--reuse-clusters",
        action="store_true",
        help="use the already running local clusters ($GPUFED_LOCAL_DIR) and leave them running",
    )
    g.addoption("--keep-clusters", action="store_true", help="do not stop the clusters this session started")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.stash[_failed_key] = rep.failed
    return rep


_failed_key = pytest.StashKey[bool]()


@dataclass
class Clusters:
    """The running environment plus helpers the tests share."""

    env: LocalEnvironment

    @property
    def kubeconfig(self) -> Path:
        return self.env.merged_kubeconfig

    @property
    def topology(self) -> Topology:
        return self.env.topology

    def kubectl_argv(self, context: str, *args: str) -> list[str]:
        """The command line of `kubectl --context=<context> <args>` on these clusters (for Popen)."""
        return [str(self.env.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", f"--context={context}", *args]

    def kubectl(
        self, context: str, *args: str, check: bool = True, timeout: float = 60, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.kubectl_argv(context, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def create(self, context: str, obj: dict[str, Any], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.kubectl(context, "create", "-f", "-", input_text=json.dumps(obj), check=check)

    def run_pod(
        self,
        context: str,
        namespace: str,
        name: str,
        *,
        gpus: int = 0,
        ready: bool = True,
        container: dict[str, Any] | None = None,
    ) -> None:
        """Create a long-running pod (one container named `main`) and optionally wait until Ready."""
        main: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
        if gpus:
            main["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        main.update(container or {})
        self.create(
            context,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"containers": [main]},
            },
        )
        if ready:
            self.kubectl(
                context, "wait", "-n", namespace, "--for=condition=Ready", f"pod/{name}", "--timeout=60s", timeout=70
            )

    def run_job(
        self,
        context: str,
        namespace: str,
        name: str,
        *,
        gpus: int = 0,
        annotations: dict[str, str] | None = None,
        until: str = "Complete",
    ) -> None:
        """Create a one-pod Job (backoffLimit 0) and wait for its `until` condition."""
        self.create(
            context,
            manifests.job(name, namespace, gpus=str(gpus) if gpus else None, pod_annotations=annotations or {}),
        )
        self.kubectl(
            context, "wait", "-n", namespace, f"--for=condition={until}", f"job/{name}", "--timeout=90s", timeout=100
        )

    def kubectl_json(self, context: str, *args: str) -> Any:
        return json.loads(self.kubectl(context, *args, "-o", "json").stdout)

    def diagnostics(self) -> str:
        out = []
        for c in self.topology.clusters:
            out.append(f"===== cluster {c.name}")
            for args in (
                ("get", "nodes", "-o", "wide"),
                ("get", "pods", "-A", "-o", "wide"),
                ("get", "events", "-A", "--sort-by=.lastTimestamp"),
            ):
                p = self.kubectl(c.name, *args, check=False, timeout=20)
                out.append(f"$ kubectl {' '.join(args)}\n{p.stdout}{p.stderr}")
            for comp in (
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok",
                "metrics-server",
                "etcd",
                "gpufed-controller",
                *sorted(f.stem for f in (self.env.cluster_dir(c.name) / "logs").glob("virtual-kubelet-*.log")),
            ):
                log = self.env.log_path(c.name, comp)
                try:
                    tail = "\n".join(line[:400] for line in log.read_text(errors="replace").splitlines()[-12:])
                except OSError as e:
                    tail = str(e)
                out.append(f"--- tail of {log}\n{tail}")
        return "\n".join(out)


@pytest.fixture(scope="session")
def clusters(request: pytest.FixtureRequest) -> Iterator[Clusters]:
    reuse = bool(request.config.getoption("--reuse-clusters"))
    bin_dir = Path(os.environ.get("GPUFED_BIN_DIR", REPO / ".cache" / "bin"))
    build = REPO / "deploy" / "local" / "build.sh"
    if reuse:
        state_dir = Path(os.environ.get("GPUFED_LOCAL_DIR", REPO / ".cache" / "local"))
        try:
            topo = Topology.model_validate(json.loads((state_dir / "state.json").read_text())["topology"])
        except (OSError, ValueError, KeyError) as e:
            pytest.fail(f"--reuse-clusters: no running environment in {state_dir} ({e}); run `make clusters-up`")
    else:
        state_dir = Path(os.environ.get("GPUFED_E2E_DIR", REPO / ".cache" / "e2e"))
        topo = default_topology(base_port=E2E_BASE_PORT, job_seconds=E2E_JOB_SECONDS)
    env = LocalEnvironment(LocalSettings(state_dir, bin_dir, build_script=build, manifests_dir=REPO / "deploy"), topo)
    stop = not reuse and not request.config.getoption("--keep-clusters")
    try:
        # Idempotent: with --reuse-clusters this only verifies (and completes) the running environment.
        asyncio.run(env.up(lambda m: print(f"[clusters] {m}", flush=True)))
        yield Clusters(env)
    finally:
        # also when `up` failed half-way: what it started must not outlive the session
        if stop:
            env.down(lambda m: print(f"[clusters] {m}", flush=True))


@pytest.fixture
def namespace(clusters: Clusters, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace with the same name in every cluster; diagnostics dumped on failure."""
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{secrets.token_hex(3)}"
    for c in clusters.topology.clusters:
        clusters.kubectl(c.name, "create", "namespace", name)
    # Pods are refused until the controller-manager has created the namespace's default ServiceAccount.
    for c in clusters.topology.clusters:
        deadline = time.monotonic() + 30
        while clusters.kubectl(c.name, "get", "serviceaccount", "default", "-n", name, check=False).returncode:
            if time.monotonic() > deadline:
                raise AssertionError(f"no default ServiceAccount in {c.name}/{name} after 30s")
            time.sleep(0.2)
    yield name
    if request.node.stash.get(_failed_key, False):
        print("\n######## diagnostics\n" + clusters.diagnostics())
    for c in clusters.topology.clusters:
        clusters.kubectl(c.name, "delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
async def api(clusters: Clusters) -> AsyncIterator[dict[str, Any]]:
    """kubernetes-asyncio ApiClients per cluster name."""
    async with contextlib.AsyncExitStack() as stack:
        yield {
            c.name: await stack.enter_async_context(api_client(clusters.kubeconfig, c.name))
            for c in clusters.topology.clusters
        }
