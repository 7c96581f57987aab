"""Starting, checking and stopping N real Kubernetes control planes on loopback.

Owns: the lifecycle of every local cluster (embedded etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok, metrics-server, and Kueue and JobSet where the topology says so): their state
directory and state file, their PKI and kubeconfigs, and the waits until everything is healthy — including
`metrics.k8s.io` being Available, because an unavailable aggregated API stalls namespace deletion
and garbage collection in the controller-manager. `up` is idempotent: components that are already
running (same pid, same process start time) are kept; missing ones are started; the topology of a
running environment cannot change underneath it. `down` stops every process it started, by process group,
even when the state file was lost (it also finds processes whose command line points into the
state directory), then removes the state. `status` reports each cluster's components, version,
nodes and GPUs.

Kueue (clusters whose topology sets `kueue`): its manifests are read from the module it is built from
(`go list -m` in deploy/local/kueue, next to the build script) while the control planes start; once a
cluster's apiserver is ready its namespace, CRDs (server-side, waited for until Established) and
RBAC go in, Kueue starts, and once its `/readyz` answers its webhook configurations are applied. All
of that runs beside the rest of the cluster's start (controller-manager, nodes, metrics-server,
gpufed), so its waits overlap theirs; what it still costs is mostly the apiserver's CPU for Kueue's
large CRDs (docs/local-clusters.md measures it). JobSet (clusters whose topology sets `jobset`) comes up
the same way, beside Kueue: its CRD and RBAC, the process, its webhooks once its `/readyz` answers; its
manifests are read from deploy/local/jobset.

DRA (clusters with DRA-managed nodes, `topology.NodePool.dra_nodes`): the `dra-publisher` applet
starts with the controller-manager, once the apiserver is ready (it waits for its nodes itself); once
the nodes are Ready the DeviceClass of `dra` is applied and `up` waits until the ResourceSlices hold
every DRA node's devices, so tests start with the devices published. The controller-manager runs
the resource-claim controller (it is on by default; the launcher sets no --controllers).

With `audit` set (off by default), every kube-apiserver also writes an audit log (level Metadata, JSON
lines, rotated) into its cluster's state directory, for counting what each client asks of it.

Invariants: every listener binds 127.0.0.1, but the virtual kubelets, which bind the node address
(`nodeaddr`: an address on this machine's loopback interface, so reachable from here only); a
component that exits while we wait for it is reported with the tail of its log; private keys live
only in the state directory (0700/0600). etcd speaks plain HTTP on loopback without fsync: this is
a disposable test environment.

With `manifests_dir` set, each cluster also gets gpufed installed the way an operator would:
the CRDs and RBAC of deploy/ applied with the admin identity, and `gpufed controller` started as
one more process of the cluster, with its own least-privilege identity (user gpufed:controller).

Does not: know what gpufed's components do; it only installs and runs them. The command line of
each component is `components`'s, the objects written into each cluster `install`'s, the process
handling (start, identity, stop) `supervise`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from gpufed import process
from gpufed.apis.wire import IDENTITY_CONFIGMAP, SYSTEM_NAMESPACE
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client
from gpufed.kube.times import rfc3339
from gpufed.localenv import (
    components,
    dra,
    install,
    jobset,
    kubeconfig,
    kueue,
    kwokcfg,
    metricsserver,
    nodeaddr,
    storage,
    supervise,
)
from gpufed.localenv import status as cluster_status
from gpufed.localenv.components import CONTROLLER, DRA_PUBLISHER, JOBSET, KUEUE
from gpufed.localenv.pki import ClusterPKI, ensure_pki
from gpufed.localenv.status import ClusterStatus
from gpufed.localenv.topology import ClusterSpec, Topology

#: Seconds to wait for a cluster to become healthy before giving up.
DEFAULT_START_TIMEOUT_S = 240.0
#: Seconds the build script may take (a cold build compiles Kubernetes from source).
BUILD_TIMEOUT_S = 3600.0
#: Seconds between SIGTERM and SIGKILL on `down`.
STOP_GRACE_S = 10.0
#: Seconds `go list -m` may take to name a module's directory (Kueue's, JobSet's: in the cache once built).
MODULE_SOURCE_TIMEOUT_S = 60.0
T = TypeVar("T")
#: The directory of Kueue's Go module, relative to the build script's.
KUEUE_MODULE_SUBDIR = "kueue"
#: The directory of JobSet's Go module, relative to the build script's.
JOBSET_MODULE_SUBDIR = "jobset"

Progress = Callable[[str], None]


class LocalEnvError(GpufedError):
    """Something the operator must fix; the message says what."""


@dataclass(frozen=True)
class LocalSettings:
    """Where the environment lives and how long to wait for it."""

    #: State directory: PKI, kubeconfigs, etcd data, logs, pids (removed by `down`).
    state_dir: Path
    #: Directory holding the built binaries (gpufed-k8s applet links and wireguard-go).
    bin_dir: Path
    #: Script that builds the binaries when they are missing or stale (None: never build).
    build_script: Path | None = None
    #: Seconds to wait for the whole environment to become healthy.
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    #: gpufed's deploy/ directory (crds/, rbac/): when set, gpufed is installed and its controller runs.
    manifests_dir: Path | None = None
    #: Audit every request each kube-apiserver serves (level Metadata, JSON lines at `audit_log_path`):
    #: what the API-cost benchmark counts. Off by default; takes effect when an apiserver starts.
    audit: bool = False
    #: Kueue's Go module (deploy/local/kueue), where its manifests are found (None: next to
    #: `build_script`, else deploy/local/kueue of this checkout).
    kueue_module: Path | None = None
    #: JobSet's Go module (deploy/local/jobset), where its manifests are found (None: next to
    #: `build_script`, else deploy/local/jobset of this checkout).
    jobset_module: Path | None = None


class LocalEnvironment:
    """The local clusters described by a topology, rooted in `settings.state_dir`."""

    def __init__(self, settings: LocalSettings, topology: Topology) -> None:
        self.settings = settings
        self.topology = topology
        self.state_dir = settings.state_dir.resolve()
        self._kueue_sources: asyncio.Task[kueue.Sources] | None = None
        self._jobset_sources: asyncio.Task[jobset.Sources] | None = None

    # ---- paths

    def cluster_dir(self, name: str) -> Path:
        return self.state_dir / "clusters" / name

    def pki(self, name: str) -> ClusterPKI:
        return ClusterPKI(self.cluster_dir(name) / "pki")

    def kubeconfig_path(self, name: str, identity: str = "admin") -> Path:
        return self.cluster_dir(name) / f"{identity}.kubeconfig"

    @property
    def merged_kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def exec_root(self) -> Path:
        """Scratch space for `kubectl exec` on fake pods: outside the owner-only state directory."""
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"gpufed-local-exec-{digest}"

    def exec_dir(self, cluster: str) -> Path:
        return self.exec_root / cluster

    def log_path(self, cluster: str, component: str) -> Path:
        return self.cluster_dir(cluster) / "logs" / f"{component}.log"

    def audit_log_path(self, cluster: str) -> Path:
        """The cluster's kube-apiserver audit log (JSON lines; written only with `LocalSettings.audit`)."""
        return self.cluster_dir(cluster) / "audit" / "audit.log"

    def server(self, name: str) -> str:
        return f"https://127.0.0.1:{self.topology.ports(name).apiserver}"

    def binary(self, name: str) -> Path:
        return self.settings.bin_dir / name

    @property
    def kueue_module(self) -> Path:
        """Kueue's Go module directory (deploy/local/kueue)."""
        if self.settings.kueue_module is not None:
            return self.settings.kueue_module
        if self.settings.build_script is not None:
            return self.settings.build_script.parent / KUEUE_MODULE_SUBDIR
        return Path(__file__).resolve().parents[2] / "deploy" / "local" / KUEUE_MODULE_SUBDIR

    @property
    def jobset_module(self) -> Path:
        """JobSet's Go module directory (deploy/local/jobset)."""
        if self.settings.jobset_module is not None:
            return self.settings.jobset_module
        if self.settings.build_script is not None:
            return self.settings.build_script.parent / JOBSET_MODULE_SUBDIR
        return Path(__file__).resolve().parents[2] / "deploy" / "local" / JOBSET_MODULE_SUBDIR

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "state.json"

    # ---- state

    def _load_state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self._state_file.read_text())
            return data
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise LocalEnvError(f"state file {self._state_file} is unreadable ({e}); run `gpufed local down`") from e

    def _save_state(self, state: dict[str, Any]) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        tmp.replace(self._state_file)

    def node_address(self) -> str:
        """The address this environment's virtual nodes publish (chosen by `up`)."""
        return str(self._load_state().get("node_address", nodeaddr.LOOPBACK))

    def _topology_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.topology.model_dump(mode="json", by_alias=True)
        return data

    # ---- prerequisites

    async def ensure_binaries(self, progress: Progress) -> None:
        """Build (cached) when a build script is known, then insist every binary is present.

        The build's output is streamed line by line as progress: a cold build takes minutes.
        """
        script = self.settings.build_script
        if script is not None and script.exists():
            progress(f"checking local binaries ({script.name})")

            def show(line: str) -> None:
                line = line.rstrip()
                if line and not line.startswith("go: downloading"):
                    progress(line)

            try:
                built = await process.run(
                    ["bash", str(script), str(self.settings.bin_dir)],
                    timeout_s=BUILD_TIMEOUT_S,
                    merge_stderr=True,
                    on_line=show,
                    check=False,
                )
            except process.CommandError as e:
                raise LocalEnvError(f"building the local binaries failed: {e}") from e
            if built.returncode != 0:
                raise LocalEnvError(f"building the local binaries failed (exit {built.returncode}); see above")
        missing = [b for b in components.BINARIES if not os.access(self.binary(b), os.X_OK)]
        if missing:
            raise LocalEnvError(
                f"missing binaries in {self.settings.bin_dir}: {', '.join(missing)}; build them with "
                "`make binaries` (needs Go, see deploy/local/build.sh)"
            )

    # ---- up

    async def up(self, progress: Progress = lambda _m: None) -> None:
        state = self._load_state()
        if state and state.get("topology") != self._topology_json():
            running = self._running_components(state)
            if running:
                raise LocalEnvError(
                    "a local environment with a different topology is running in "
                    f"{self.state_dir} ({len(running)} processes); run `gpufed local down` first"
                )
            # Nothing of it runs: its etcd data would bring back nodes of the old shape.
            progress("the topology changed and the old environment is stopped; discarding its state")
            shutil.rmtree(self.state_dir / "clusters", ignore_errors=True)
            state = {}
        state = {"topology": self._topology_json(), "clusters": state.get("clusters", {})}
        await self.ensure_binaries(progress)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)

        for spec in self.topology.clusters:
            await asyncio.to_thread(self._prepare_cluster, spec)
        kubeconfig.write(
            self.merged_kubeconfig,
            kubeconfig.merge(
                kubeconfig.build(c.name, self.server(c.name), self.pki(c.name), "admin", user_name=f"{c.name}-admin")
                for c in self.topology.clusters
            ),
        )
        self._check_ports(state)
        state["node_address"], warning = await asyncio.to_thread(nodeaddr.choose, self.topology.node_address)
        if warning:
            progress(warning)
        self._save_state(state)

        deadline = time.monotonic() + self.settings.start_timeout_s
        if any(spec.kueue for spec in self.topology.clusters):
            # Read while the control planes start: they need Kueue's manifests only once ready.
            self._kueue_sources = asyncio.create_task(self._read_kueue_sources())
        if any(spec.jobset for spec in self.topology.clusters):
            self._jobset_sources = asyncio.create_task(self._read_jobset_sources())
        try:
            await asyncio.gather(
                *(self._up_cluster(spec, state, deadline, progress) for spec in self.topology.clusters)
            )
        finally:
            self._save_state(state)
            if self._kueue_sources is not None:
                # done by now unless a cluster failed first; its own failure was raised in `_up_kueue`
                self._kueue_sources.cancel()
                await asyncio.gather(self._kueue_sources, return_exceptions=True)
                self._kueue_sources = None
            if self._jobset_sources is not None:
                self._jobset_sources.cancel()
                await asyncio.gather(self._jobset_sources, return_exceptions=True)
                self._jobset_sources = None
        progress(f"all {len(self.topology.clusters)} clusters healthy; kubeconfig: {self.merged_kubeconfig}")

    def _prepare_cluster(self, spec: ClusterSpec) -> None:
        d = self.cluster_dir(spec.name)
        for sub in ("logs", "etcd"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        if self.settings.audit:
            self.audit_log_path(spec.name).parent.mkdir(exist_ok=True)
            (d / components.AUDIT_POLICY_FILE).write_text(components.AUDIT_POLICY)
        exec_dir = self.exec_dir(spec.name)
        exec_dir.mkdir(parents=True, exist_ok=True)
        exec_dir.chmod(0o1777)  # kwok exec runs as nobody, who cannot enter the 0700 state directory
        pki = ensure_pki(d / "pki", cluster=spec.name, service_cidr=spec.service_cidr)
        for identity in components.IDENTITIES:
            kubeconfig.write(
                self.kubeconfig_path(spec.name, identity),
                kubeconfig.build(spec.name, self.server(spec.name), pki, identity),
            )
        logs_file = d / "pod.log"
        if not logs_file.exists():
            # kwok serves the file as a container log, so it is written in the CRI log format. kwok
            # reads its stamps as Go's RFC3339Nano, whose fraction is optional: whole seconds will do.
            stamp = rfc3339()
            logs_file.write_text(
                "".join(
                    f"{stamp} stdout F gpufed local cluster {spec.name}: line {i}/3 served by kwok's kubelet API\n"
                    for i in (1, 2, 3)
                )
            )
        kwokcfg.attach_file(logs_file).touch()
        (d / "kwok.yaml").write_text(
            kwokcfg.render(self.topology.job_seconds, logs_file, exec_dir, run_as_nobody=os.geteuid() == 0)
        )
        if components.has_dra(spec):
            (d / components.DRA_CONFIG_FILE).write_text(json.dumps(dra.publisher_config(spec), indent=2))
        if spec.kueue:
            self._prepare_kueue(spec, pki)
        if spec.jobset:
            self._prepare_jobset(spec, pki)

    def _prepare_kueue(self, spec: ClusterSpec, pki: ClusterPKI) -> None:
        """Kueue's configuration file and its certificate directory (copies of its serving certificate)."""
        d = self.cluster_dir(spec.name)
        cert_dir = d / components.KUEUE_CERT_DIR
        cert_dir.mkdir(mode=0o700, exist_ok=True)
        for name, source in kueue.cert_files(pki.cert(kueue.SERVING_STEM), pki.key(kueue.SERVING_STEM)).items():
            tmp = cert_dir / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(source.read_bytes())
            tmp.replace(cert_dir / name)
        config = components.kueue_config(self, spec, self.topology.ports(spec.name))
        (d / components.KUEUE_CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))

    def _prepare_jobset(self, spec: ClusterSpec, pki: ClusterPKI) -> None:
        """JobSet's configuration file and its certificate directory (copies of its serving certificate)."""
        d = self.cluster_dir(spec.name)
        cert_dir = d / components.JOBSET_CERT_DIR
        cert_dir.mkdir(mode=0o700, exist_ok=True)
        for name, source in jobset.cert_files(pki.cert(jobset.SERVING_STEM), pki.key(jobset.SERVING_STEM)).items():
            tmp = cert_dir / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(source.read_bytes())
            tmp.replace(cert_dir / name)
        config = components.jobset_config(self, spec, self.topology.ports(spec.name))
        (d / components.JOBSET_CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))

    @staticmethod
    def _running_components(state: dict[str, Any]) -> list[tuple[str, str, int]]:
        """(cluster, component, pid) of every recorded component that is still running."""
        out = []
        for cname, cstate in state.get("clusters", {}).items():
            for comp, info in cstate.get("components", {}).items():
                if supervise.alive(info.get("pid"), info.get("start_time")):
                    out.append((cname, comp, int(info["pid"])))
        return out

    def _check_ports(self, state: dict[str, Any]) -> None:
        running = {(c, comp) for c, comp, _pid in self._running_components(state)}
        busy = []
        for spec in self.topology.clusters:
            ports = self.topology.ports(spec.name)
            listening = components.ports_of(ports, kueue=spec.kueue, jobset=spec.jobset)
            for comp in components.components_of(spec):
                if (spec.name, comp) in running:
                    continue
                for p in [listening[comp], *components.other_ports(ports, comp)]:
                    if not supervise.port_free(p):
                        busy.append(f"127.0.0.1:{p} ({spec.name} {comp})")
        if busy:
            raise LocalEnvError(
                "ports in use by another process: "
                + ", ".join(busy)
                + "; stop that process or choose other ports with --base-port"
            )

    def _command(self, spec: ClusterSpec, component: str) -> list[str]:
        return components.command(self, spec, self.topology.ports(spec.name), component, audit=self.settings.audit)

    def _start(self, spec: ClusterSpec, component: str, state: dict[str, Any]) -> bool:
        """Start `component` unless it is already running; True when it was started."""
        cstate = state["clusters"].setdefault(spec.name, {"components": {}})
        info = cstate["components"].get(component, {})
        if supervise.alive(info.get("pid"), info.get("start_time")):
            return False
        pid, started = supervise.spawn(
            self._command(spec, component), self.log_path(spec.name, component), self.cluster_dir(spec.name), component
        )
        cstate["components"][component] = {"pid": pid, "start_time": started}
        self._save_state(state)
        return True

    def _check_alive(self, spec: ClusterSpec, component: str, state: dict[str, Any]) -> None:
        info = state["clusters"][spec.name]["components"][component]
        if not supervise.alive(info.get("pid"), info.get("start_time")):
            log = self.log_path(spec.name, component)
            tail = supervise.tail(log)
            raise LocalEnvError(f"{component} of cluster {spec.name} exited; last lines of {log}:\n{tail}")

    async def _wait(
        self,
        what: str,
        deadline: float,
        check: Callable[[], Awaitable[bool]],
        alive: Callable[[], None],
        interval: float = 0.5,
    ) -> None:
        last = ""
        while True:
            alive()
            try:
                if await check():
                    return
            except (aiohttp.ClientError, OSError, KubeError, TimeoutError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise LocalEnvError(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))
            await asyncio.sleep(interval)

    def _ssl(self, name: str, *, verify: bool = True) -> ssl.SSLContext:
        """TLS for health probes: the apiserver and metrics-server are verified against the cluster
        CA and get the admin client cert; kcm and the scheduler serve a self-signed loopback cert,
        so they get no credentials at all (their /healthz is open to anonymous callers)."""
        pki = self.pki(name)
        if not verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
        return ctx

    async def _http_ok(self, url: str, ctx: ssl.SSLContext | None) -> bool:
        timeout = aiohttp.ClientTimeout(total=3)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url, ssl=ctx if ctx else False) as r:
            return r.status == 200

    async def _up_cluster(self, spec: ClusterSpec, state: dict[str, Any], deadline: float, progress: Progress) -> None:
        ports = self.topology.ports(spec.name)
        name = spec.name

        def alive(component: str) -> Callable[[], None]:
            return lambda: self._check_alive(spec, component, state)

        started: list[str] = ["etcd"] if self._start(spec, "etcd", state) else []
        await self._wait(
            f"etcd of {name}",
            deadline,
            lambda: self._http_ok(f"http://127.0.0.1:{ports.etcd_client}/health", None),
            alive("etcd"),
        )
        if self._start(spec, "kube-apiserver", state):
            started.append("kube-apiserver")
            progress(f"{name}: etcd up, starting kube-apiserver on :{ports.apiserver}")
        api_tls = self._ssl(name)
        await self._wait(
            f"kube-apiserver of {name}",
            deadline,
            lambda: self._http_ok(f"{self.server(name)}/readyz", api_tls),
            alive("kube-apiserver"),
        )
        # Kueue and JobSet come up beside the rest of the cluster; the first failure of any ends all.
        tasks = [asyncio.create_task(self._up_rest(spec, state, deadline, progress, started))]
        if spec.kueue:
            tasks.append(asyncio.create_task(self._up_kueue(spec, state, deadline, progress)))
        if spec.jobset:
            tasks.append(asyncio.create_task(self._up_jobset(spec, state, deadline, progress)))
        try:
            done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _up_rest(
        self, spec: ClusterSpec, state: dict[str, Any], deadline: float, progress: Progress, started: list[str]
    ) -> None:
        """Everything of a cluster after its apiserver is ready, but Kueue: controller-manager,
        scheduler, nodes, metrics-server and `metrics.k8s.io`, then gpufed."""
        ports = self.topology.ports(spec.name)
        name = spec.name

        def alive(component: str) -> Callable[[], None]:
            return lambda: self._check_alive(spec, component, state)

        async with api_client(self.kubeconfig_path(name)) as api:
            # metrics-server reads the authentication ConfigMap as it starts: its RBAC comes first.
            await install.apply(api, [*metricsserver.rbac(), metricsserver.service(ports.metrics_server)])
            # gpufed's kinds exist before the controller-manager starts, so its quota controller counts
            # them from its first discovery (a kind it discovers later is counted in a quota made
            # before that only at its next full resync, 5 minutes: a peering made meanwhile waits)
            await self._install_crds(api)
            started += [
                c
                for c in (
                    "kube-controller-manager",
                    "kube-scheduler",
                    "kwok",
                    "metrics-server",
                    *((DRA_PUBLISHER,) if components.has_dra(spec) else ()),
                )
                if self._start(spec, c, state)
            ]
            if started:
                progress(f"{name}: kube-apiserver ready; started {', '.join(started)}")
            probe_tls = self._ssl(name, verify=False)
            for comp, port in (
                ("kube-controller-manager", ports.controller_manager),
                ("kube-scheduler", ports.scheduler),
            ):
                await self._wait(
                    f"{comp} of {name}",
                    deadline,
                    functools.partial(self._http_ok, f"https://127.0.0.1:{port}/healthz", probe_tls),
                    alive(comp),
                )
            await install.ensure_nodes(spec, api)
            await install.apply(api, storage.manifests(spec))  # static local volumes for claims
            await self._wait(
                f"nodes of {name} to be Ready", deadline, lambda: install.nodes_ready(spec, api), alive("kwok")
            )
            await self._serve_metrics_api(spec, api, state, deadline)
            if components.has_dra(spec):
                await self._publish_devices(spec, api, state, deadline)
        dra_gpus = spec.dra_gpu_total()
        progress(
            f"{name}: {spec.node_count()} nodes Ready ({spec.gpu_total()} GPUs"
            + (f", {dra_gpus} of them DRA devices of {dra.DRIVER}" if dra_gpus else "")
            + "), metrics.k8s.io Available"
            + ("" if started else "; was already running")
        )
        if self.settings.manifests_dir is not None:
            await self._install_gpufed(spec, state, deadline, progress)

    async def _publish_devices(self, spec: ClusterSpec, api: Any, state: dict[str, Any], deadline: float) -> None:
        """Apply the DeviceClass, then wait until the publisher's ResourceSlices hold every DRA node's devices."""
        await install.apply(api, [dra.device_class()])
        url = rest.path("resource.k8s.io/v1", "resourceslices")

        async def published() -> bool:
            return dra.slices_published(await rest.list_items(api, url), spec)

        await self._wait(
            f"ResourceSlices of {spec.name}'s DRA nodes ({', '.join(dra.dra_nodes(spec))})",
            deadline,
            published,
            lambda: self._check_alive(spec, DRA_PUBLISHER, state),
            interval=0.2,
        )

    async def _read_sources(self, module: Path, argv: Sequence[str], parse: Callable[[Path], T], what: str) -> T:
        """Upstream's manifests of `what` from the Go module it is built from (`argv`, run in `module`,
        prints the module's directory; `parse` reads the manifests there)."""
        try:
            found = await process.run(
                argv,
                timeout_s=MODULE_SOURCE_TIMEOUT_S,
                cwd=module,
                env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
            )
            return await asyncio.to_thread(parse, Path(found.stdout.strip()))
        except (process.CommandError, OSError, ValueError, KeyError, yaml.YAMLError) as e:
            raise LocalEnvError(
                f"cannot read {what}'s manifests from its Go module {module} ({e}); build it with `make binaries`"
            ) from e

    async def _read_kueue_sources(self) -> kueue.Sources:
        return await self._read_sources(self.kueue_module, kueue.SOURCE_DIR_ARGV, kueue.sources, "Kueue")

    async def _up_kueue(self, spec: ClusterSpec, state: dict[str, Any], deadline: float, progress: Progress) -> None:
        """Kueue's namespace, CRDs and RBAC, then Kueue itself, then (once it serves) its webhooks."""
        if self._kueue_sources is None:
            self._kueue_sources = asyncio.create_task(self._read_kueue_sources())
        src = await asyncio.shield(self._kueue_sources)  # shared by every cluster running Kueue
        began = time.monotonic()
        name = spec.name
        ports = self.topology.ports(name)
        ca = self.pki(name).ca_cert.read_bytes()
        async with api_client(self.kubeconfig_path(name)) as api:
            await install.apply_kueue(
                api, kueue.namespace(), kueue.crds(src, webhook_port=ports.kueue_webhook, ca_pem=ca), kueue.rbac(src)
            )
            crds_s = time.monotonic() - began
            started = self._start(spec, KUEUE, state)
            await self._wait(
                f"Kueue of {name} (readyz on :{ports.kueue_health})",
                deadline,
                lambda: self._http_ok(kueue.health_url(ports.kueue_health), None),
                lambda: self._check_alive(spec, KUEUE, state),
                interval=0.1,
            )
            await install.apply(api, kueue.webhooks(src, port=ports.kueue_webhook, ca_pem=ca))
        progress(
            f"{name}: Kueue {'started' if started else 'already running'}, ready, webhooks on :{ports.kueue_webhook} "
            f"({time.monotonic() - began:.1f} s: CRDs and RBAC {crds_s:.1f} s)"
        )

    async def _read_jobset_sources(self) -> jobset.Sources:
        return await self._read_sources(self.jobset_module, jobset.SOURCE_DIR_ARGV, jobset.sources, "JobSet")

    async def _up_jobset(self, spec: ClusterSpec, state: dict[str, Any], deadline: float, progress: Progress) -> None:
        """JobSet's CRD and RBAC, then JobSet itself, then (once it serves) its webhooks."""
        if self._jobset_sources is None:
            self._jobset_sources = asyncio.create_task(self._read_jobset_sources())
        src = await asyncio.shield(self._jobset_sources)  # shared by every cluster running JobSet
        began = time.monotonic()
        name = spec.name
        ports = self.topology.ports(name)
        async with api_client(self.kubeconfig_path(name)) as api:
            await install.apply_crds_and_rbac(api, jobset.crds(src), jobset.rbac(src))
            started = self._start(spec, JOBSET, state)
            await self._wait(
                f"JobSet of {name} (readyz on :{ports.jobset_health})",
                deadline,
                lambda: self._http_ok(jobset.health_url(ports.jobset_health), None),
                lambda: self._check_alive(spec, JOBSET, state),
                interval=0.1,
            )
            ca = self.pki(name).ca_cert.read_bytes()
            await install.apply(api, jobset.webhooks(src, port=ports.jobset_webhook, ca_pem=ca))
        progress(
            f"{name}: JobSet {'started' if started else 'already running'}, ready, webhooks on "
            f":{ports.jobset_webhook} ({time.monotonic() - began:.1f} s)"
        )

    async def _load_gpufed(self) -> list[dict[str, Any]]:
        assert self.settings.manifests_dir is not None
        try:
            return await install.load_gpufed(self.settings.manifests_dir)
        except (OSError, ValueError) as e:
            raise LocalEnvError(f"cannot read gpufed's manifests in {self.settings.manifests_dir}: {e}") from e

    async def _install_crds(self, api: Any) -> None:
        """gpufed's CustomResourceDefinitions alone, Established (nothing when gpufed is not installed)."""
        if self.settings.manifests_dir is None:
            return
        crds = [d for d in await self._load_gpufed() if d["kind"] == "CustomResourceDefinition"]
        await install.apply_gpufed(api, crds)

    async def _install_gpufed(
        self, spec: ClusterSpec, state: dict[str, Any], deadline: float, progress: Progress
    ) -> None:
        """Apply gpufed's CRDs and RBAC, start its controller, wait for the cluster identity."""
        docs = await self._load_gpufed()
        async with api_client(self.kubeconfig_path(spec.name)) as api:
            await install.apply_gpufed(api, docs)
            started = self._start(spec, CONTROLLER, state)
            cm = rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE)

            async def identity() -> bool:
                return await rest.get(api, cm) is not None

            await self._wait(
                f"gpufed controller of {spec.name}",
                deadline,
                identity,
                lambda: self._check_alive(spec, CONTROLLER, state),
            )
            await install.apply_network_config(api, spec, self.topology.gateway_endpoint(spec.name))
        progress(f"{spec.name}: gpufed installed; controller {'started' if started else 'already running'}")

    async def _serve_metrics_api(self, spec: ClusterSpec, api: Any, state: dict[str, Any], deadline: float) -> None:
        """Register `metrics.k8s.io` once metrics-server serves, then wait until the aggregator calls it Available.

        Registering only after metrics-server answers spares the aggregator's failure backoff (up to 30 s).
        """
        port = self.topology.ports(spec.name).metrics_server
        tls = self._ssl(spec.name)  # verifies metrics-server's certificate for 127.0.0.1 against the cluster CA
        await self._wait(
            f"metrics-server of {spec.name}",
            deadline,
            lambda: self._http_ok(f"https://{metricsserver.HOST}:{port}/livez", tls),
            lambda: self._check_alive(spec, "metrics-server", state),
            interval=0.1,
        )
        await install.apply(api, [metricsserver.apiservice(port, self.pki(spec.name).ca_cert.read_bytes())])
        url = rest.path("apiregistration.k8s.io/v1", "apiservices", metricsserver.APISERVICE)

        async def available() -> bool:
            return metricsserver.available(await rest.get(api, url))

        await self._wait(
            f"APIService {metricsserver.APISERVICE} of {spec.name} to be Available",
            deadline,
            available,
            lambda: self._check_alive(spec, "metrics-server", state),
            interval=0.1,  # the aggregator decides within milliseconds of seeing the APIService
        )

    # ---- status

    async def status(self) -> list[ClusterStatus]:
        state = self._load_state()
        out = []
        for spec in self.topology.clusters:
            listening = components.ports_of(self.topology.ports(spec.name), kueue=spec.kueue, jobset=spec.jobset)
            procs = [(comp, listening[comp]) for comp in components.components_of(spec)]
            procs += [(DRA_PUBLISHER, 0)] if components.has_dra(spec) else []
            procs += [(CONTROLLER, 0)] if self.settings.manifests_dir is not None else []
            cstate = state.get("clusters", {}).get(spec.name, {}).get("components", {})
            comps = cluster_status.components_status(cstate, procs)
            st = ClusterStatus(spec.name, self.server(spec.name), False, "-", 0, spec.node_count(), 0, comps)
            kubeconfig = self.kubeconfig_path(spec.name)
            if all(c.running for c in comps) and kubeconfig.exists():
                with contextlib.suppress(KubeError, OSError, aiohttp.ClientError, TimeoutError):
                    await cluster_status.fill(spec, st, kubeconfig)
            out.append(st)
        return out

    # ---- down

    def down(self, progress: Progress = lambda _m: None) -> int:
        """Stop every process of the environment and remove its state; returns how many were stopped.

        Clients go first (kwok, metrics-server, Kueue, JobSet, the DRA publisher, scheduler, controller-manager,
        gpufed), then the
        apiservers, then etcd, so nobody spends its shutdown grace waiting on a dependency that is
        already gone. Processes found without a state file are stopped last.
        """
        state = self._load_state() if self._state_file.exists() else {}
        tiers: list[set[int]] = [set(), set(), set(), set()]
        tier_of = {
            CONTROLLER: 0,
            "metrics-server": 0,
            KUEUE: 0,
            JOBSET: 0,
            DRA_PUBLISHER: 0,
            "kwok": 0,
            "kube-scheduler": 0,
            "kube-controller-manager": 0,
            "kube-apiserver": 1,
            "etcd": 2,
        }
        for _cluster, comp, pid in self._running_components(state):
            tiers[tier_of.get(comp, 3)].add(pid)
        known = set().union(*tiers)
        if self.state_dir.exists():
            tiers[3].update(set(supervise.orphans(self.state_dir, self.settings.bin_dir)) - known)
        for tier in tiers:
            supervise.stop(tier, progress, STOP_GRACE_S)
        pids = set().union(*tiers)
        if self.state_dir.exists():
            try:
                shutil.rmtree(self.state_dir)
            except OSError as e:
                raise LocalEnvError(f"stopped {len(pids)} processes but cannot remove {self.state_dir}: {e}") from e
        shutil.rmtree(self.exec_root, ignore_errors=True)
        progress(f"stopped {len(pids)} processes; removed {self.state_dir}")
        return len(pids)
