"""`gpufed local demo`: the whole story of gpufed on the local clusters, narrated step by step and timed.

Owns:
- the story: start (or verify) the local clusters with gpufed installed; peer the consumer with both
  providers, network fabric included; bring the WireGuard tunnels up; offload a namespace; `kubectl
  create` a GPU Job and a Deployment with a Service; show the pods on virtual nodes, their twins,
  `kubectl logs` of a remote pod and `gpufed pool`; send requests through the Service to the
  offloaded pods; then clean up (workloads, offloading, namespace, peerings with their network,
  the simulated pod networks) and check that nothing is left. The clusters keep running.
- the step machinery, pure apart from the clock and the output stream: a header per step saying what
  it shows and why, its duration, a summary table with every step's seconds and the total, and the
  exit status (non-zero when any step failed, naming the step and the reason). After a failed story
  step the rest of the story is not run, but every clean-up step still is. Network steps are skipped,
  loudly, where the data plane cannot run (no root, no TUN, ...) or with `--no-network`.

Users' commands are run as users run them (kubectl from the environment's bin dir, the gpufed CLI in
a subprocess, KUBECONFIG set to the environment's merged kubeconfig) and shown with their output. The
pods' network stacks, the gateway agents and the kube-proxy stand-in come from
`gpufed.localenv.podnet`, because kwok's pods have none.

Does not: know how binaries are built or clusters started (its first step calls `LocalEnvironment.up`,
which is idempotent), stop the clusters, or change any gpufed component: it only drives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any, Literal, TextIO

import yaml

from gpufed.apis.models import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    IDENTITY_CONFIGMAP,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    TYPE_LABEL,
    VIRTUAL_NODE_TYPE,
    ClusterID,
    twin_namespace,
)
from gpufed.errors import GpufedError
from gpufed.localenv.launcher import LocalEnvError, LocalEnvironment
from gpufed.localenv.podnet import PodNetwork, PodNetworkError, leftover_namespaces, missing_requirements
from vkprovider import defaults

#: Seconds one step may take before it counts as failed.
DEFAULT_STEP_TIMEOUT_S = 300.0
#: Seconds one command may take.
COMMAND_TIMEOUT_S = 180.0
#: Width the gpufed CLI renders its tables to (rich reads COLUMNS when not on a terminal).
COLUMNS = 150
#: The namespace the demo offloads.
DEFAULT_NAMESPACE = defaults.DEMO_NAMESPACE
CONSUMER = "consumer"
A100 = "NVIDIA-A100-SXM4-40GB"
#: (provider context, extra `gpufed peer` flags, what it is asked for).
PROVIDERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("gpu-a", ("--gpus", "8"), "8 GPUs (its nodes have NVIDIA H100s)"),
    ("gpu-b", ("--gpus", "4", "--gpu-product", A100), f"4 GPUs of product {A100}"),
)
JOB = "train"
APP = "inference"
HTTP_PORT = 8080
SERVICE_PORT = 80
#: The consumer pod the Service requests come from (its network stack is simulated; any consumer pod
#: address would do: the fabric remaps it on the providers).
CLIENT_POD_IP = "10.244.1.10"
#: Requests sent through the Service, per endpoint (round-robin: every endpoint answers).
REQUESTS_PER_ENDPOINT = 2

Outcome = Literal["ok", "failed", "skipped", "not run"]


class DemoError(GpufedError):
    """A step did not show what it should; the message says what happened instead."""


class StepSkipped(Exception):  # noqa: N818 -- not an error: a step that has nothing to do here
    """Raised by a step that cannot or need not run here; the message says why."""


# ------------------------------------------------------------------------------------ steps and timing


@dataclass(frozen=True)
class Step:
    """One step of the story: a title, why it matters (printed under the header), the work."""

    title: str
    why: str
    run: Callable[[], Awaitable[None]]
    #: Clean-up steps run even after a failed story step.
    cleanup: bool = False
    #: Needs the data plane (root, TUN, ...); skipped where it cannot run.
    network: bool = False
    timeout_s: float = DEFAULT_STEP_TIMEOUT_S


@dataclass(frozen=True)
class StepResult:
    number: int
    title: str
    outcome: Outcome
    #: Wall-clock seconds the step ran (0 when it did not run).
    seconds: float
    #: Why it failed or was skipped ("" when it passed).
    detail: str = ""
    cleanup: bool = False


class Narrator:
    """Everything the demo prints: headers, commands and their output, outcomes, the summary.

    Plain text; ANSI colours only when `out` is a terminal."""

    WIDTH = 100

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.color = bool(getattr(out, "isatty", lambda: False)())

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def banner(self, lines: Sequence[str], code: str = "1") -> None:
        rule = "═" * self.WIDTH
        self.print(self._style(rule, code))
        for line in lines:
            self.print(self._style(f" {line}", code))
        self.print(self._style(rule, code))

    def header(self, number: int, total: int, step: Step) -> None:
        label = f"━━━ Step {number}/{total} · {step.title} "
        self.print()
        self.print(self._style(label + "━" * max(3, self.WIDTH - len(label)), "1;36"))
        for line in step.why.strip().splitlines():
            self.print(self._style(line.strip(), "2"))

    def note(self, text: str) -> None:
        self.print(f"  {text}")

    def command(self, display: str) -> None:
        self.print(self._style(f"$ {display}", "1"))

    def output(self, line: str) -> None:
        self.print(f"  │ {line}")

    def outcome(self, number: int, total: int, result: StepResult) -> None:
        where = f"Step {number}/{total}"
        if result.outcome == "ok":
            self.print(self._style(f"✓ {where} ok in {result.seconds:.1f} s", "32"))
        elif result.outcome == "failed":
            self.print(self._style(f"✗ {where} FAILED after {result.seconds:.1f} s: {result.detail}", "1;31"))
        elif result.outcome == "skipped":
            self.print(self._style(f"– {where} ({result.title}) skipped: {result.detail}", "33"))
        else:
            self.print(self._style(f"· {where} ({result.title}) not run: {result.detail}", "33"))


async def run_steps(
    steps: Sequence[Step],
    narrator: Narrator,
    *,
    network_skip: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run the steps in order, each under its timeout, timing each one.

    A story step that fails stops the story: later story steps are "not run". Clean-up steps always
    run. With `network_skip` set, network steps are "skipped" with that reason. A step raising
    StepSkipped is "skipped" with its message."""
    results: list[StepResult] = []
    failed: str | None = None
    total = len(steps)
    for number, step in enumerate(steps, start=1):
        if step.network and network_skip is not None:
            result = StepResult(number, step.title, "skipped", 0.0, network_skip, step.cleanup)
        elif failed is not None and not step.cleanup:
            result = StepResult(number, step.title, "not run", 0.0, f"step {failed} failed", step.cleanup)
        else:
            narrator.header(number, total, step)
            start = clock()
            outcome: Outcome = "ok"
            detail = ""
            try:
                async with asyncio.timeout(step.timeout_s):
                    await step.run()
            except StepSkipped as e:
                outcome, detail = "skipped", str(e)
            except TimeoutError:
                outcome, detail = "failed", f"did not finish within {step.timeout_s:g} s"
            except Exception as e:
                outcome, detail = "failed", str(e) if isinstance(e, DemoError) else f"{type(e).__name__}: {e}"
            result = StepResult(number, step.title, outcome, clock() - start, detail, step.cleanup)
            if outcome == "failed" and not step.cleanup and failed is None:
                failed = str(number)
        narrator.outcome(number, total, result)
        results.append(result)
    return results


def summary_table(results: Sequence[StepResult]) -> str:
    """One row per step (number, title, result, seconds), the clean-up steps set apart, and the total."""
    width = max([len("step"), *(len(r.title) for r in results)])
    rule = "-" * (width + 27)
    lines = [f"{'#':>3}  {'step':<{width}}  {'result':<8}  {'seconds':>8}", rule]
    for i, r in enumerate(results):
        if r.cleanup and (i == 0 or not results[i - 1].cleanup):
            lines.append(f"{'':>3}  {'(clean-up)':<{width}}")
        seconds = f"{r.seconds:8.1f}" if r.outcome in ("ok", "failed") else f"{'-':>8}"
        lines.append(f"{r.number:>3}  {r.title:<{width}}  {r.outcome:<8}  {seconds}")
    lines += [rule, f"{'':>3}  {'total':<{width}}  {'':<8}  {sum(r.seconds for r in results):8.1f}"]
    return "\n".join(lines)


def failures(results: Sequence[StepResult]) -> list[str]:
    return [f"step {r.number} ({r.title}) failed: {r.detail}" for r in results if r.outcome == "failed"]


def exit_code(results: Sequence[StepResult]) -> int:
    return 1 if failures(results) else 0


# ------------------------------------------------------------------------------------ commands


@dataclass(frozen=True)
class DemoSettings:
    #: The consumer namespace the demo offloads and fills.
    namespace: str = DEFAULT_NAMESPACE
    #: Leave the peerings, the namespace and its workloads in place (no clean-up steps).
    keep: bool = False
    #: Run the network steps (the fabric's data plane) where the machine allows.
    network: bool = True
    #: How to run the gpufed CLI.
    gpufed: tuple[str, ...] = (sys.executable, "-m", "gpufed.cli")
    #: Awaited once the story has run, before the first clean-up step (even after a failed story
    #: step): a test reads what the story created (its Secrets, the Events of namespaces the
    #: clean-up deletes) while it exists. Not narrated; an exception fails that clean-up step.
    before_cleanup: Callable[[], Awaitable[None]] | None = None


def display(argv: Sequence[str], prefix: Sequence[str], replacements: Sequence[tuple[str, str]]) -> str:
    """A command line as the user would type it: the gpufed command line `prefix` shown as `gpufed`,
    long paths replaced by their short forms, words with spaces or shell characters quoted."""
    n = len(prefix)
    if n and tuple(argv[:n]) == tuple(prefix):
        argv = ["gpufed", *argv[n:]]
    words = []
    for word in argv:
        for long, short in replacements:
            word = word.replace(long, short)
        quote = any(c in word for c in " ()|&;<>*?!'\"{}") and not word.startswith("$")
        words.append(f"'{word}'" if quote else word)
    return " ".join(words)


def failure_reason(lines: Sequence[str]) -> str:
    """What a failed command said: from its last `error:` line on (gpufed's and kubectl's own message,
    which rich may have wrapped over several lines), else its last three lines."""
    text = [line.strip() for line in lines if line.strip()]
    starts = [i for i, line in enumerate(text) if line.lower().startswith(("error:", "error from server"))]
    picked = text[starts[-1] :] if starts else text[-3:]
    return " ".join(picked) if starts else " / ".join(picked) or "(no output)"


@dataclass
class Shell:
    """Runs commands with KUBECONFIG set, shows them (and their output) through the narrator."""

    narrator: Narrator
    kubectl_bin: str
    gpufed_argv: tuple[str, ...]
    env: dict[str, str]
    replacements: list[tuple[str, str]] = field(default_factory=list)

    async def run(
        self,
        argv: Sequence[str],
        *,
        show: bool = True,
        check: bool = True,
        input_text: str | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> tuple[int, str]:
        shown = display(argv, self.gpufed_argv, self.replacements)
        if show:
            self.narrator.command(shown)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input_text is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if show else asyncio.subprocess.PIPE,
            env=self.env,
        )
        lines: list[str] = []

        async def stream() -> None:
            """Shown commands: output line by line as it comes (stderr merged)."""
            if input_text is not None and proc.stdin is not None:
                proc.stdin.write(input_text.encode())
                await proc.stdin.drain()
                proc.stdin.close()
            assert proc.stdout is not None
            async for raw in proc.stdout:
                lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.narrator.output(lines[-1])
            await proc.wait()

        async def quiet() -> None:
            out, err = await proc.communicate(input_text.encode() if input_text is not None else None)
            lines.extend(out.decode(errors="replace").splitlines())
            if proc.returncode != 0:
                lines.extend(err.decode(errors="replace").splitlines())

        try:
            async with asyncio.timeout(timeout_s):
                await (stream() if show else quiet())
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise DemoError(f"`{shown}` did not finish within {timeout_s:g} s") from None
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        rc = proc.returncode if proc.returncode is not None else -1
        text = "\n".join(lines)
        if check and rc != 0:
            raise DemoError(f"`{shown}` exited with {rc}: {failure_reason(lines)}")
        return rc, text

    async def kubectl(self, context: str, *args: str, **kw: Any) -> str:
        return (await self.run([self.kubectl_bin, "--context", context, *args], **kw))[1]

    async def kubectl_json(self, context: str, *args: str) -> Any:
        return json.loads(await self.kubectl(context, *args, "-o", "json", show=False))

    async def found(self, context: str, *args: str) -> bool:
        """Whether `kubectl get <args>` finds the object (NotFound: False; other errors raise)."""
        rc, text = await self.run([self.kubectl_bin, "--context", context, "get", *args], show=False, check=False)
        if rc != 0 and "NotFound" not in text and "not found" not in text:
            raise DemoError(f"kubectl get {' '.join(args)} on {context}: {text.strip()[-300:]}")
        return rc == 0

    async def gpufed(self, *args: str, **kw: Any) -> str:
        return (await self.run([*self.gpufed_argv, *args], **kw))[1]


async def eventually(what: str, probe: Callable[[], Awaitable[Any]], timeout_s: float, interval_s: float = 0.5) -> Any:
    """The first truthy answer of `probe`, or DemoError naming `what` and the last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    while True:
        last = await probe()
        if last:
            return last
        if loop.time() > deadline:
            raise DemoError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval_s)


# ------------------------------------------------------------------------------------ manifests


def job_manifest(namespace: str) -> dict[str, Any]:
    """deploy/examples/gpu-job.yaml: a plain GPU Job, nothing gpufed-specific (3 completions x 2 GPUs)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {
            "completions": 3,
            "parallelism": 3,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                            "command": ["python", "train.py"],
                            "resources": {"limits": {GPU_RESOURCE: 2}},
                        }
                    ],
                }
            },
        },
    }


def app_manifests(namespace: str) -> list[dict[str, Any]]:
    """A plain Deployment (2 inference servers, 1 GPU each, port 8080) and its ClusterIP Service (port 80)."""
    labels = {"app": APP}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "containers": [
                            {
                                "name": "server",
                                "image": "nvcr.io/nvidia/tritonserver:24.01-py3",
                                "ports": [{"name": "http", "containerPort": HTTP_PORT}],
                                "resources": {"limits": {GPU_RESOURCE: 1}},
                            }
                        ]
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "selector": dict(labels),
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": HTTP_PORT}],
            },
        },
    ]


def to_yaml(objects: Sequence[dict[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects)


def ready_endpoints(slices: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(address, pod name) of every ready endpoint of a Service's EndpointSlices, sorted."""
    out = []
    for s in slices:
        for e in s.get("endpoints") or []:
            if (e.get("conditions") or {}).get("ready") is False:
                continue
            pod = (e.get("targetRef") or {}).get("name", "")
            out += [(a, pod) for a in e.get("addresses") or []]
    return sorted(out)


def _first(hook: Callable[[], Awaitable[None]], run: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    async def both() -> None:
        await hook()
        await run()

    return both


# ------------------------------------------------------------------------------------ the story


class Demo:
    """The steps of the story over one local environment."""

    def __init__(self, env: LocalEnvironment, settings: DemoSettings, narrator: Narrator) -> None:
        self.env = env
        self.settings = settings
        self.narrator = narrator
        self.ns = settings.namespace
        self.kubeconfig = env.merged_kubeconfig
        environ = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "GPUFED_LOCAL_DIR": str(env.state_dir),
            "GPUFED_BIN_DIR": str(env.settings.bin_dir),
            "COLUMNS": str(COLUMNS),
        }
        self.shell = Shell(
            narrator,
            str(env.binary("kubectl")),
            settings.gpufed,
            environ,
            [
                (str(env.binary("kubectl")), "kubectl"),
                (str(self.kubeconfig), "$KUBECONFIG"),
            ],
        )
        self.ids: dict[str, str] = {}
        self.podnet: PodNetwork | None = None
        #: provider context -> the range the consumer reaches that provider's pods at.
        self.mapped: dict[str, str] = {}

    # ---- helpers

    @property
    def providers(self) -> list[str]:
        return [p for p, _, _ in PROVIDERS]

    def remote(self, context: str) -> list[str]:
        return ["--remote-kubeconfig", str(self.kubeconfig), "--remote-context", context]

    async def cluster_id(self, context: str) -> str:
        got = await self.shell.kubectl(
            context,
            "get",
            "configmap",
            IDENTITY_CONFIGMAP,
            "-n",
            SYSTEM_NAMESPACE,
            "-o",
            "jsonpath={.data.clusterId}",
            show=False,
        )
        if not got.strip():
            raise DemoError(f"{context} has no cluster ID yet: is its gpufed controller running?")
        return got.strip()

    async def virtual_nodes(self) -> dict[str, str]:
        """Virtual node name -> provider context."""
        by_id = {v: k for k, v in self.ids.items()}
        nodes = await self.shell.kubectl_json(CONSUMER, "get", "nodes", "-l", f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}")
        return {
            n["metadata"]["name"]: by_id.get(n["metadata"]["labels"].get(REMOTE_CLUSTER_LABEL, ""), "?")
            for n in nodes["items"]
        }

    async def pods(self, selector: str) -> list[dict[str, Any]]:
        got = await self.shell.kubectl_json(CONSUMER, "get", "pods", "-n", self.ns, "-l", selector)
        items: list[dict[str, Any]] = got["items"]
        return items

    async def on_virtual_nodes(self, pods: Sequence[dict[str, Any]]) -> dict[str, str]:
        """Pod name -> provider context; DemoError when a pod is not on a virtual node."""
        vnodes = await self.virtual_nodes()
        where = {}
        for p in pods:
            node = p["spec"].get("nodeName", "")
            if node not in vnodes:
                raise DemoError(f"pod {p['metadata']['name']} is on node {node or '(none)'}, not on a virtual node")
            where[p["metadata"]["name"]] = vnodes[node]
        return where

    def twin_ns(self) -> str:
        return twin_namespace(self.ns, ClusterID(self.ids[CONSUMER]))

    async def show_twins(self, selector: str) -> None:
        for provider in self.providers:
            self.narrator.note(f"the twins on {provider}, in its twin namespace {self.twin_ns()}:")
            await self.shell.kubectl(provider, "get", "pods", "-n", self.twin_ns(), "-l", selector, "-o", "wide")

    # ---- the steps

    def steps(self) -> list[Step]:
        s = self.settings
        a, b = PROVIDERS[0], PROVIDERS[1]
        story = [
            Step(
                "Start the local clusters",
                "Three real Kubernetes control planes on loopback (kube-apiserver, controller-manager, scheduler,\n"
                "etcd, built from source), kwok simulating the nodes: `consumer` has CPU nodes only, `gpu-a`\n"
                "and `gpu-b` have GPU nodes. Idempotent: a running environment is only verified.",
                self.clusters_up,
            ),
            Step(
                "gpufed is installed in every cluster",
                "`gpufed local up` installed gpufed's CRDs and RBAC into each cluster and runs its\n"
                "`gpufed controller` as a process of the cluster; each cluster has a ClusterID and a\n"
                "NetworkConfig (all three use the same pod CIDR on purpose: the fabric must remap).",
                self.installed,
            ),
            Step(
                f"Peer the consumer with {a[0]}: {a[2]}",
                "Mutual authentication (challenge signed with the consumer's identity key, a CSR signed by the\n"
                "provider), the network fabric's control plane (IPAM, WireGuard keys, Gateways), then a\n"
                "ResourceSlice the provider grants; `peer` returns when the virtual node is Ready.",
                lambda: self.peer(a[0], a[1]),
            ),
            Step(
                f"Peer the consumer with {b[0]}: {b[2]}",
                "The same with the second provider, asking only for one GPU product.",
                lambda: self.peer(b[0], b[1]),
            ),
            Step(
                "One virtual node per provider",
                "The consumer now has a node per provider, carrying the granted GPUs and the providers'\n"
                "GPU labels; `gpufed info` shows requested vs granted vs used per peering.",
                self.virtual_nodes_step,
            ),
            Step(
                "WireGuard tunnels between the clusters",
                "One `gpufed gateway` agent per peering per side, each in a network namespace standing for\n"
                "its cluster's gateway pod: WireGuard (wireguard-go), prefix NAT in nftables, policy routing.\n"
                f"A consumer pod stand-in ({CLIENT_POD_IP}) is wired to the consumer's gateways.",
                self.tunnels,
                network=True,
            ),
            Step(
                f"Offload namespace {self.ns}",
                "`gpufed offload-namespace` extends the namespace to the providers: a twin namespace on each,\n"
                "and the admission webhook lets the namespace's pods tolerate the virtual nodes.",
                self.offload,
            ),
            Step(
                "kubectl create a GPU Job",
                "A plain Job (deploy/examples/gpu-job.yaml: 3 completions x 2 GPUs), nothing gpufed-specific.\n"
                "The consumer's own kube-scheduler places its pods on the virtual nodes; they run as twins\n"
                "on the providers, and the Job completes on the consumer.",
                self.job,
            ),
            Step(
                "kubectl logs of a remote pod",
                "The virtual node's kubelet API serves `kubectl logs`, read from the twin on the provider.",
                self.logs,
            ),
            Step(
                "kubectl create a Deployment and a Service",
                "Two inference servers (1 GPU each) behind a ClusterIP Service: the pods run on the providers,\n"
                "and the consumer's EndpointSlices list them at addresses the consumer can route to.",
                self.deployment,
            ),
            Step(
                "gpufed pool",
                "The GPUs of every provider and product: total, granted, in use, free, largest placeable.",
                self.pool,
            ),
            Step(
                "A request through the Service reaches an offloaded pod",
                "Each twin gets a real network stack at its provider pod IP with an HTTP server on 8080; a\n"
                "kube-proxy stand-in in the consumer pod DNATs the Service's ClusterIP to its endpoints. The\n"
                "requests cross the tunnels; each answer says which pod answered and where it saw us.",
                self.request,
                network=True,
            ),
        ]
        teardown = Step(
            "Stop the gateways and remove the simulated pod networks",
            "The gateway agents exit on their own once unpeering deleted their Gateways (they remove\n"
            "their WireGuard links and nftables tables); then the network namespaces go."
            if not s.keep
            else "--keep: the peerings stay, but the simulated data plane lives only as long as this demo: its\n"
            "Gateways stay and report Down until `gpufed unpeer` (or a later `gpufed local demo`) removes them.",
            self.remove_podnet,
            cleanup=True,
            network=True,
        )
        if s.keep:
            return [*story, teardown]
        cleanup: list[Step] = [
            Step(
                "Delete the demo's workloads",
                "The Job, the Deployment and the Service; their pods go on both sides.",
                self.delete_workloads,
                cleanup=True,
            ),
            Step(
                f"Unoffload namespace {self.ns} and delete it",
                "`gpufed unoffload-namespace` removes the twin namespaces on the providers.",
                self.unoffload,
                cleanup=True,
            ),
            Step(
                "Unpeer the providers (network included)",
                "`gpufed unpeer` removes the fabric's objects on both sides, then everything of the peering.",
                self.unpeer,
                cleanup=True,
            ),
            teardown,
            Step(
                "Nothing is left behind",
                "No ForeignCluster, ResourceSlice, Tenant, Gateway, twin namespace or virtual node on any\n"
                "cluster, no network namespace of this demo. The clusters themselves keep running.",
                self.nothing_left,
                cleanup=True,
            ),
        ]
        if s.before_cleanup is not None:
            cleanup[0] = dataclasses.replace(cleanup[0], run=_first(s.before_cleanup, cleanup[0].run))
        return [*story, *cleanup]

    # -- story

    async def clusters_up(self) -> None:
        names = [c.name for c in self.env.topology.clusters]
        if not {CONSUMER, *self.providers} <= set(names):
            raise DemoError(
                f"the demo needs the clusters {CONSUMER}, {', '.join(self.providers)} (the default topology); "
                f"the environment in {self.env.state_dir} has {', '.join(names)}"
            )
        try:
            await self.env.up(lambda m: self.narrator.note(m))
        except LocalEnvError as e:
            raise DemoError(str(e)) from e
        await self.shell.gpufed("local", "status", "--state-dir", str(self.env.state_dir))
        for c in self.env.topology.clusters:
            await self.shell.kubectl(
                c.name,
                "get",
                "nodes",
                "-L",
                GPU_PRODUCT_LABEL,
                "-L",
                "nvidia.com/gpu.count",
                "-L",
                "nvidia.com/gpu.memory",
            )

    async def installed(self) -> None:
        await self.shell.kubectl(CONSUMER, "api-resources", "--api-group=gpufed.io")
        for c in self.env.topology.clusters:
            self.ids[c.name] = await self.cluster_id(c.name)
            self.narrator.note(
                f"{c.name}: ClusterID {self.ids[c.name]}; "
                f"gpufed controller log {self.env.log_path(c.name, 'gpufed-controller')}"
            )
            await self.shell.kubectl(c.name, "get", "networkconfig", "-n", SYSTEM_NAMESPACE)

    async def peer(self, provider: str, flags: Sequence[str]) -> None:
        network = [] if self.network_on else ["--no-network"]
        await self.shell.gpufed("peer", "--context", CONSUMER, *self.remote(provider), *flags, *network)

    async def virtual_nodes_step(self) -> None:
        await self.shell.kubectl(
            CONSUMER,
            "wait",
            "--for=condition=Ready",
            "node",
            "-l",
            f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}",
            "--timeout=60s",
            show=False,
        )
        await self.shell.kubectl(
            CONSUMER, "get", "nodes", "-L", REMOTE_CLUSTER_LABEL, "-L", GPU_PRODUCT_LABEL, "-L", "nvidia.com/gpu.count"
        )
        vnodes = await self.virtual_nodes()
        missing = [p for p in self.providers if p not in vnodes.values()]
        if missing:
            raise DemoError(f"no virtual node for {', '.join(missing)}")
        await self.shell.gpufed("info", "--context", CONSUMER)

    @property
    def network_on(self) -> bool:
        return self.podnet is not None

    async def tunnels(self) -> None:
        net = self.podnet
        assert net is not None
        topo = self.env.topology
        gateways = []
        for i, provider in enumerate(self.providers):
            gateways.append(await net.add_peering(i, topo.gateway_endpoint(CONSUMER), topo.gateway_endpoint(provider)))
            self.narrator.note(
                f"{provider}: gateway namespaces {gateways[i][0]} ({topo.gateway_endpoint(CONSUMER)}) and "
                f"{gateways[i][1]} ({topo.gateway_endpoint(provider)}) joined by an underlay veth"
            )
        loop = asyncio.get_running_loop()
        started = loop.time()
        for provider, (cgw, pgw) in zip(self.providers, gateways, strict=True):
            # the provider's (server) side first: the client's first packet starts the handshake
            await net.start_agent(f"{provider}-side", self.ids[CONSUMER], provider, pgw)
            await net.start_agent(f"consumer-{provider}", self.ids[provider], CONSUMER, cgw)
        self.narrator.note(f"started {2 * len(self.providers)} `gpufed gateway` agents (logs in {net.logs})")
        routes = []
        for i, provider in enumerate(self.providers):
            rnet = await self.shell.kubectl_json(
                CONSUMER, "get", "remotenetwork", "-n", SYSTEM_NAMESPACE, self.ids[provider]
            )
            self.mapped[provider] = rnet["spec"]["mapped"]["podCidr"]
            routes.append((i, self.mapped[provider]))
            self.narrator.note(
                f"{provider}'s pods ({rnet['spec']['real']['podCidr']}) are reached from the consumer at "
                f"{self.mapped[provider]} (its RemoteNetwork)"
            )
        await net.add_client(CLIENT_POD_IP, routes)

        # each side's agent probes its peer every second and reports Connected once a probe answered;
        # on a loaded machine a late probe flips it to Degraded for a moment, so each is counted once seen
        seen: set[tuple[str, str]] = set()

        async def connected() -> bool:
            for provider in self.providers:
                for key in (f"{provider}-side", f"consumer-{provider}"):
                    rc = net.agent_exited(key)
                    if rc is not None:
                        raise DemoError(f"gateway agent {key} exited ({rc}):\n{net.log_tail(key)}")
                for side in ((CONSUMER, self.ids[provider]), (provider, self.ids[CONSUMER])):
                    if side in seen:
                        continue
                    conn = await self.shell.kubectl_json(side[0], "get", "connection", "-n", SYSTEM_NAMESPACE, side[1])
                    if (conn.get("status") or {}).get("phase") == "Connected":
                        seen.add(side)
            return len(seen) == 2 * len(self.providers)

        await eventually("every Connection to be Connected", connected, timeout_s=90)
        self.narrator.note(
            f"all {2 * len(self.providers)} Connections Connected "
            f"{loop.time() - started:.1f} s after the agents started"
        )
        await self.shell.gpufed("network", "status", "--context", CONSUMER)

    async def offload(self) -> None:
        async def gone_or_active() -> bool:
            got = await self.shell.run(
                [self.shell.kubectl_bin, "--context", CONSUMER, "get", "namespace", self.ns, "-o", "json"],
                show=False,
                check=False,
            )
            return got[0] != 0 or json.loads(got[1])["status"].get("phase") == "Active"

        await eventually(f"an earlier namespace {self.ns} to finish terminating", gone_or_active, timeout_s=120)
        if not await self.shell.found(CONSUMER, "namespace", self.ns):
            await self.shell.kubectl(CONSUMER, "create", "namespace", self.ns)
        await eventually(
            f"the default ServiceAccount of {self.ns}",
            lambda: self.shell.found(CONSUMER, "serviceaccount", "default", "-n", self.ns),
            timeout_s=30,
        )
        await self.shell.gpufed("offload-namespace", self.ns, "--context", CONSUMER)

    async def create(self, objects: Sequence[dict[str, Any]]) -> None:
        """`kubectl create -f -` of the manifests, shown; an object left by an earlier run is deleted first."""
        for o in objects:
            kind, name = o["kind"].lower(), o["metadata"]["name"]
            if await self.shell.found(CONSUMER, kind, name, "-n", self.ns):
                self.narrator.note(f"deleting {kind}/{name} left by an earlier run")
                await self.shell.kubectl(CONSUMER, "delete", kind, name, "-n", self.ns, "--wait=true", show=False)
        text = to_yaml(objects)
        for line in text.splitlines():
            self.narrator.output(line)
        await self.shell.kubectl(CONSUMER, "create", "-f", "-", input_text=text)

    async def job(self) -> None:
        await self.create([job_manifest(self.ns)])
        await self.shell.kubectl(
            CONSUMER, "wait", "--for=condition=Complete", f"job/{JOB}", "-n", self.ns, "--timeout=150s", timeout_s=160
        )
        await self.shell.kubectl(CONSUMER, "get", "pods", "-n", self.ns, "-l", f"job-name={JOB}", "-o", "wide")
        where = await self.on_virtual_nodes(await self.pods(f"job-name={JOB}"))
        self.narrator.note(
            "every Job pod ran on a virtual node: "
            + ", ".join(f"{pod} on {provider}" for pod, provider in sorted(where.items()))
        )
        await self.show_twins(f"job-name={JOB}")

    async def logs(self) -> None:
        pods = await self.pods(f"job-name={JOB}")
        if not pods:
            raise DemoError(f"job/{JOB} has no pods")
        where = await self.on_virtual_nodes(pods)
        pod = sorted(where)[0]
        node = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] == pod)
        self.narrator.note(f"{pod} ran on virtual node {node}, i.e. as {self.twin_ns()}/{pod} on {where[pod]}")
        text = await self.shell.kubectl(CONSUMER, "logs", "-n", self.ns, pod, "--timestamps")
        if not text.strip():
            raise DemoError(f"kubectl logs {pod} returned nothing")

    async def deployment(self) -> None:
        await self.create(app_manifests(self.ns))
        await self.shell.kubectl(
            CONSUMER, "rollout", "status", f"deployment/{APP}", "-n", self.ns, "--timeout=150s", timeout_s=160
        )
        await self.shell.kubectl(CONSUMER, "get", "pods", "-n", self.ns, "-l", f"app={APP}", "-o", "wide")
        pods = [p for p in await self.pods(f"app={APP}") if not p["metadata"].get("deletionTimestamp")]
        where = await self.on_virtual_nodes(pods)
        ips = {p["status"].get("podIP") for p in pods}

        async def listed() -> bool:
            got = await self.shell.kubectl_json(
                CONSUMER, "get", "endpointslices", "-n", self.ns, "-l", f"kubernetes.io/service-name={APP}"
            )
            return {a for a, _ in ready_endpoints(got["items"])} == ips

        await eventually(f"the Service's EndpointSlice to list the pods' IPs {sorted(map(str, ips))}", listed, 60)
        await self.shell.kubectl(CONSUMER, "get", "service", APP, "-n", self.ns, "-o", "wide")
        await self.shell.kubectl(
            CONSUMER, "get", "endpointslices", "-n", self.ns, "-l", f"kubernetes.io/service-name={APP}"
        )
        self.narrator.note(
            "the inference pods run on: " + ", ".join(f"{pod} on {p}" for pod, p in sorted(where.items()))
        )
        await self.show_twins(f"app={APP}")

    async def pool(self) -> None:
        await self.shell.gpufed("pool", "--context", CONSUMER)

    async def request(self) -> None:
        net = self.podnet
        assert net is not None
        svc = await self.shell.kubectl_json(CONSUMER, "get", "service", APP, "-n", self.ns)
        cluster_ip, port = svc["spec"]["clusterIP"], int(svc["spec"]["ports"][0]["port"])
        target = int(svc["spec"]["ports"][0]["targetPort"])
        slices = await self.shell.kubectl_json(
            CONSUMER, "get", "endpointslices", "-n", self.ns, "-l", f"kubernetes.io/service-name={APP}"
        )
        endpoints = ready_endpoints(slices["items"])
        if not endpoints:
            raise DemoError(f"service {APP} has no ready endpoints")
        pods = {p["metadata"]["name"]: p for p in await self.pods(f"app={APP}")}
        where = await self.on_virtual_nodes([pods[name] for _, name in endpoints if name in pods])
        for address, name in endpoints:
            provider = where.get(name)
            if provider is None:
                raise DemoError(f"endpoint {address} names pod {name!r}, which is not a pod of {APP}")
            twin = await self.shell.kubectl_json(provider, "get", "pod", name, "-n", self.twin_ns())
            real = twin["status"].get("podIP")
            if not real:
                raise DemoError(f"the twin {self.twin_ns()}/{name} on {provider} has no pod IP")
            mapped = IPv4Network(self.mapped[provider])
            if IPv4Address(address) not in mapped:
                raise DemoError(f"the consumer lists {name} at {address}, outside {provider}'s remapped range {mapped}")
            ns = await net.add_server(
                self.providers.index(provider),
                name,
                real,
                target,
                {
                    "answeredBy": f"{self.ns}/{name}",
                    "runsOn": provider,
                    "twin": f"{self.twin_ns()}/{name}",
                    "podIP": real,
                },
            )
            self.narrator.note(
                f"{name}: the consumer sees it at {address}; on {provider} it is {real}: HTTP server on "
                f"{real}:{target} in netns {ns}"
            )
        ruleset = await net.add_service(cluster_ip, port, [(a, target) for a, _ in endpoints])
        self.narrator.note(f"kube-proxy stand-in in the consumer pod (netns {net.client}): nft -f -")
        for line in ruleset.splitlines():
            self.narrator.output(line)
        url = f"http://{cluster_ip}:{port}/"

        async def first() -> str:
            with contextlib.suppress(PodNetworkError):
                return await net.get(url, timeout_s=2)
            return ""

        self.narrator.command(
            f"curl {url}    # from the consumer pod {CLIENT_POD_IP}, {REQUESTS_PER_ENDPOINT} per endpoint"
        )
        answers = [json.loads(await eventually("a first answer across the tunnel", first, timeout_s=30))]
        for _ in range(REQUESTS_PER_ENDPOINT * len(endpoints) - 1):
            answers.append(json.loads(await net.get(url)))
        for ans in answers:
            self.narrator.output(json.dumps(ans))
        names = {f"{self.ns}/{name}" for _, name in endpoints}
        strangers = [a for a in answers if a.get("answeredBy") not in names]
        if strangers:
            raise DemoError(f"answers from something that is not a pod of {APP}: {strangers}")
        silent = sorted(names - {a["answeredBy"] for a in answers})
        if silent:
            raise DemoError(f"no answer from {', '.join(silent)}")
        for ans in answers[: len(endpoints)]:
            self.narrator.note(
                f"answered by pod {ans['answeredBy']} on {ans['runsOn']} (twin {ans['twin']} at {ans['podIP']}), "
                f"which saw the consumer pod {CLIENT_POD_IP} as {ans['clientSeenAs']}"
            )

    # -- clean-up

    async def delete_workloads(self) -> None:
        if not await self.shell.found(CONSUMER, "namespace", self.ns):
            raise StepSkipped(f"namespace {self.ns} does not exist")
        await self.shell.kubectl(
            CONSUMER,
            "delete",
            "-n",
            self.ns,
            f"job/{JOB}",
            f"deployment/{APP}",
            f"service/{APP}",
            "--ignore-not-found",
            "--wait=true",
        )

        async def no_pods() -> bool:
            return not (await self.shell.kubectl_json(CONSUMER, "get", "pods", "-n", self.ns))["items"]

        await eventually(f"the pods of {self.ns} to go", no_pods, timeout_s=120)
        self.narrator.note(f"no pods left in {self.ns}")

    async def unoffload(self) -> None:
        if not await self.shell.found(CONSUMER, "namespace", self.ns):
            raise StepSkipped(f"namespace {self.ns} does not exist")
        await self.shell.gpufed("unoffload-namespace", self.ns, "--context", CONSUMER)
        await self.shell.kubectl(CONSUMER, "delete", "namespace", self.ns, "--wait=true", "--timeout=120s")

    async def unpeer(self) -> None:
        for provider in self.providers:
            await self.shell.gpufed("unpeer", "--context", CONSUMER, *self.remote(provider))

    async def remove_podnet(self) -> None:
        net = self.podnet
        if net is None or not (net.namespaces or net.agents):
            raise StepSkipped("no simulated pod network was built")
        if not self.settings.keep and net.agents:
            running = await net.wait_agents_exit(timeout_s=30)
            for key, agent in sorted(net.agents.items()):
                if key not in running:
                    self.narrator.note(f"gateway agent {key} exited on its own ({agent.proc.returncode})")
            if running:
                self.narrator.note(f"still running after 30 s, stopping them: {', '.join(running)}")
        for line in await net.teardown():
            self.narrator.note(line)

    async def nothing_left(self) -> None:
        left: list[str] = []
        kinds = ",".join(
            f"{k}.gpufed.io"
            for k in (
                "foreignclusters",
                "resourceslices",
                "tenants",
                "twinnamespaces",
                "namespaceoffloadings",
                "gateways",
                "connections",
                "remotenetworks",
            )
        )
        for c in self.env.topology.clusters:
            for i in (await self.shell.kubectl_json(c.name, "get", kinds, "-A"))["items"]:
                meta = i["metadata"]
                left.append(f"{c.name}: {i['kind']} {meta.get('namespace', '')}/{meta['name']}".replace(" /", " "))
            nss = (await self.shell.kubectl_json(c.name, "get", "namespaces", "-l", CONSUMER_LABEL))["items"]
            left += [f"{c.name}: namespace {n['metadata']['name']}" for n in nss]
            vnodes = f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}"
            nodes = (await self.shell.kubectl_json(c.name, "get", "nodes", "-l", vnodes))["items"]
            left += [f"{c.name}: virtual node {n['metadata']['name']}" for n in nodes]
        if await self.shell.found(CONSUMER, "namespace", self.ns):
            left.append(f"{CONSUMER}: namespace {self.ns}")
        if self.podnet is not None:
            left += [f"network namespace {n}" for n in await leftover_namespaces(self.podnet.tag)]
        if left:
            raise DemoError("left behind: " + "; ".join(left))
        self.narrator.note(
            "nothing of the demo is left: no ForeignCluster, ResourceSlice, Tenant, Gateway, Connection, "
            "RemoteNetwork, twin namespace or virtual node on " + ", ".join(c.name for c in self.env.topology.clusters)
        )


async def run_demo(env: LocalEnvironment, settings: DemoSettings, out: TextIO) -> int:
    """The whole demo; returns the process exit status (0: every step that ran passed)."""
    narrator = Narrator(out)
    demo = Demo(env, settings, narrator)
    wireguard_go = env.binary("wireguard-go")
    why_not = ["--no-network was given"] if not settings.network else missing_requirements(wireguard_go)
    network_skip = None
    if why_not:
        network_skip = "network steps skipped: " + "; ".join(why_not)
    else:
        demo.podnet = PodNetwork(
            wireguard_go=wireguard_go,
            kubeconfig=env.merged_kubeconfig,
            gpufed=settings.gpufed,
            logs=env.state_dir / "demo",
        )
    narrator.banner(
        [
            "gpufed demo: a consumer cluster borrows GPUs from two provider clusters",
            f"state {env.state_dir}; binaries {env.settings.bin_dir}",
            f"export KUBECONFIG={env.merged_kubeconfig}   # contexts: "
            + ", ".join(c.name for c in env.topology.clusters),
        ]
    )
    if network_skip and not settings.network:
        narrator.banner(["NETWORK STEPS SKIPPED (--no-network): peerings without tunnels, no request through them"])
    elif network_skip:
        narrator.banner(
            [
                "!!! NETWORK STEPS SKIPPED: the fabric's data plane cannot run on this machine !!!",
                *(f"    - {w}" for w in why_not),
                "The clusters are peered with --no-network (no tunnel); the WireGuard tunnels and the request",
                "through the Service to an offloaded pod are skipped. Run as root with /dev/net/tun for them.",
            ],
            code="1;33",
        )
    steps = demo.steps()
    try:
        results = await run_steps(steps, narrator, network_skip=network_skip)
    finally:
        if demo.podnet is not None and (demo.podnet.namespaces or demo.podnet.agents):
            # interrupted, or a step failed before its clean-up: nothing outlives the demo's own processes
            with contextlib.suppress(PodNetworkError):
                await asyncio.shield(demo.podnet.teardown())
    narrator.print()
    narrator.print("━━━ Summary " + "━" * (Narrator.WIDTH - 12))
    narrator.print(summary_table(results))
    if network_skip:
        narrator.print(f"NOTE: {network_skip}")
    failed = failures(results)
    total = sum(r.seconds for r in results)
    if failed:
        narrator.print()
        for f in failed:
            narrator.print(f"DEMO FAILED: {f}")
    else:
        narrator.print(f"demo OK: {sum(r.outcome == 'ok' for r in results)} steps in {total:.1f} s")
    kept = "with the demo's peerings, namespace and workloads (--keep)" if settings.keep else "(the demo cleaned up)"
    narrator.print(
        f"The clusters keep running {kept}: export KUBECONFIG={env.merged_kubeconfig}; "
        f"`gpufed local down --state-dir {env.state_dir}` (or `make clusters-down`) stops them."
    )
    return exit_code(results)
