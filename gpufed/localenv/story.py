"""What each step of `gpufed local demo` does against the local clusters, and what it checks.

Owns: the actions of the story over one local environment (`Story`): start or verify the clusters
with gpufed installed; show its CRDs, cluster IDs and NetworkConfigs; peer the consumer with both
providers (network fabric included unless the data plane cannot run); show the virtual nodes; bring
the WireGuard tunnels up between gateway agents; offload a namespace; `kubectl create` a GPU Job and
a Deployment with a Service and show where their pods run (virtual nodes, twins on the providers);
`kubectl logs` of a remote pod; `gpufed pool`; requests through the Service answered by the
offloaded pods; and the clean-up (workloads, offloading, namespace, peerings with their network, the
simulated pod networks) down to checking that nothing is left. Each action raises `StepError` when
the clusters do not show what they should, `StepSkipped` when it has nothing to do.

Users' commands are run as users run them (`shell.Shell`: kubectl from the environment's bin dir,
the gpufed CLI in a subprocess, KUBECONFIG set to the environment's merged kubeconfig). The pods'
network stacks, the gateway agents and the kube-proxy stand-in come from `podnet`, because kwok's
pods have none.

Does not: order, narrate or time the steps (`demo`, `steps`), know how binaries are built or clusters
started (`clusters_up` calls `LocalEnvironment.up`, which is idempotent), stop the clusters, or
change any gpufed component: it only drives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL
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
from gpufed.localenv.launcher import LocalEnvError, LocalEnvironment
from gpufed.localenv.manifests import APP, JOB, app_manifests, job_manifest, to_yaml
from gpufed.localenv.podnet import PodNetwork, leftover_namespaces
from gpufed.localenv.shell import Shell, eventually
from gpufed.localenv.steps import Narrator, StepError, StepSkipped
from gpufed.process import CommandError

#: Width the gpufed CLI renders its tables to (rich reads COLUMNS when not on a terminal).
COLUMNS = 150
CONSUMER = "consumer"
A100 = "NVIDIA-A100-SXM4-40GB"
#: (provider context, extra `gpufed peer` flags, what it is asked for).
PROVIDERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("gpu-a", ("--gpus", "8"), "8 GPUs (its nodes have NVIDIA H100s)"),
    ("gpu-b", ("--gpus", "4", "--gpu-product", A100), f"4 GPUs of product {A100}"),
)
#: The consumer pod the Service requests come from (its network stack is simulated; any consumer pod
#: address would do: the fabric remaps it on the providers).
CLIENT_POD_IP = "10.244.1.10"
#: Requests sent through the Service, per endpoint (round-robin: every endpoint answers).
REQUESTS_PER_ENDPOINT = 2


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


class Story:
    """The actions of the story over one local environment, in the consumer namespace `namespace`.

    `gpufed` is the command line that runs the gpufed CLI; with `keep`, the demo leaves its peerings,
    namespace and workloads in place. `podnet` is set (by `demo.run_demo`) where the data plane runs."""

    def __init__(
        self, env: LocalEnvironment, narrator: Narrator, *, namespace: str, gpufed: tuple[str, ...], keep: bool
    ) -> None:
        self.env = env
        self.narrator = narrator
        self.ns = namespace
        self.keep = keep
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
            gpufed,
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
            raise StepError(f"{context} has no cluster ID yet: is its gpufed controller running?")
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
        """Pod name -> provider context; StepError when a pod is not on a virtual node."""
        vnodes = await self.virtual_nodes()
        where = {}
        for p in pods:
            node = p["spec"].get("nodeName", "")
            if node not in vnodes:
                raise StepError(f"pod {p['metadata']['name']} is on node {node or '(none)'}, not on a virtual node")
            where[p["metadata"]["name"]] = vnodes[node]
        return where

    def twin_ns(self) -> str:
        return twin_namespace(self.ns, ClusterID(self.ids[CONSUMER]))

    async def show_twins(self, selector: str) -> None:
        for provider in self.providers:
            self.narrator.note(f"the twins on {provider}, in its twin namespace {self.twin_ns()}:")
            await self.shell.kubectl(provider, "get", "pods", "-n", self.twin_ns(), "-l", selector, "-o", "wide")

    # ---- the story

    async def clusters_up(self) -> None:
        names = [c.name for c in self.env.topology.clusters]
        if not {CONSUMER, *self.providers} <= set(names):
            raise StepError(
                f"the demo needs the clusters {CONSUMER}, {', '.join(self.providers)} (the default topology); "
                f"the environment in {self.env.state_dir} has {', '.join(names)}"
            )
        try:
            await self.env.up(lambda m: self.narrator.note(m))
        except LocalEnvError as e:
            raise StepError(str(e)) from e
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
            raise StepError(f"no virtual node for {', '.join(missing)}")
        await self.shell.gpufed("info", "--context", CONSUMER)

    @property
    def network_on(self) -> bool:
        return self.podnet is not None

    async def tunnels(self) -> None:
        net = self.podnet
        assert net is not None
        topo = self.env.topology
        reaped = await net.prepare()
        if reaped:
            self.narrator.note("removed what a killed earlier run left (nothing living held it): " + "; ".join(reaped))
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
                        raise StepError(f"gateway agent {key} exited ({rc}):\n{net.log_tail(key)}")
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
            raise StepError(f"job/{JOB} has no pods")
        where = await self.on_virtual_nodes(pods)
        pod = sorted(where)[0]
        node = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] == pod)
        self.narrator.note(f"{pod} ran on virtual node {node}, i.e. as {self.twin_ns()}/{pod} on {where[pod]}")
        text = await self.shell.kubectl(CONSUMER, "logs", "-n", self.ns, pod, "--timestamps")
        if not text.strip():
            raise StepError(f"kubectl logs {pod} returned nothing")

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
            raise StepError(f"service {APP} has no ready endpoints")
        pods = {p["metadata"]["name"]: p for p in await self.pods(f"app={APP}")}
        where = await self.on_virtual_nodes([pods[name] for _, name in endpoints if name in pods])
        for address, name in endpoints:
            provider = where.get(name)
            if provider is None:
                raise StepError(f"endpoint {address} names pod {name!r}, which is not a pod of {APP}")
            twin = await self.shell.kubectl_json(provider, "get", "pod", name, "-n", self.twin_ns())
            real = twin["status"].get("podIP")
            if not real:
                raise StepError(f"the twin {self.twin_ns()}/{name} on {provider} has no pod IP")
            mapped = IPv4Network(self.mapped[provider])
            if IPv4Address(address) not in mapped:
                raise StepError(f"the consumer lists {name} at {address}, outside {provider}'s remapped range {mapped}")
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
            with contextlib.suppress(CommandError):
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
            raise StepError(f"answers from something that is not a pod of {APP}: {strangers}")
        silent = sorted(names - {a["answeredBy"] for a in answers})
        if silent:
            raise StepError(f"no answer from {', '.join(silent)}")
        for ans in answers[: len(endpoints)]:
            self.narrator.note(
                f"answered by pod {ans['answeredBy']} on {ans['runsOn']} (twin {ans['twin']} at {ans['podIP']}), "
                f"which saw the consumer pod {CLIENT_POD_IP} as {ans['clientSeenAs']}"
            )

    # ---- clean-up

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
        if not self.keep and net.agents:
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
            raise StepError("left behind: " + "; ".join(left))
        self.narrator.note(
            "nothing of the demo is left: no ForeignCluster, ResourceSlice, Tenant, Gateway, Connection, "
            "RemoteNetwork, twin namespace or virtual node on " + ", ".join(c.name for c in self.env.topology.clusters)
        )
