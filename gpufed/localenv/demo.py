"""`gpufed local demo`: the whole story of gpufed on the local clusters, told step by step and timed.

Owns: the story's 17 steps in their order, each with its title and why it matters (what the user
reads under its header): start (or verify) the local clusters with gpufed installed; peer the
consumer with both providers, network fabric included; bring the WireGuard tunnels up; offload a
namespace; `kubectl create` a GPU Job and a Deployment with a Service; show the pods on virtual
nodes, their twins, `kubectl logs` of a remote pod and `gpufed pool`; send requests through the
Service to the offloaded pods; then clean up (workloads, offloading, namespace, peerings with their
network, the simulated pod networks) and check that nothing is left. The clusters keep running.
Also owns the demo's settings, its opening banners (where the network steps are skipped, and why:
no root, no TUN, ... or `--no-network`), its summary and its exit status.

Does not: run, time or narrate steps (`steps`), do what a step does (`story`), or define the
workloads it creates (`manifests`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO

from gpufed import defaults
from gpufed.localenv.launcher import LocalEnvironment
from gpufed.localenv.podnet import PodNetwork, PodNetworkError, missing_requirements
from gpufed.localenv.steps import Narrator, Step, exit_code, failures, run_steps, summary_table
from gpufed.localenv.story import CLIENT_POD_IP, PROVIDERS, Story

#: The namespace the demo offloads.
DEFAULT_NAMESPACE = defaults.DEMO_NAMESPACE


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


def _first(hook: Callable[[], Awaitable[None]], run: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    async def both() -> None:
        await hook()
        await run()

    return both


class Demo:
    """The steps of the story over one local environment."""

    def __init__(self, env: LocalEnvironment, settings: DemoSettings, narrator: Narrator) -> None:
        self.env = env
        self.settings = settings
        self.narrator = narrator
        self.story = Story(env, narrator, namespace=settings.namespace, gpufed=settings.gpufed, keep=settings.keep)

    # ---- the steps

    def steps(self) -> list[Step]:
        s, st = self.settings, self.story
        a, b = PROVIDERS[0], PROVIDERS[1]
        story = [
            Step(
                "Start the local clusters",
                "Three real Kubernetes control planes on loopback (kube-apiserver, controller-manager, scheduler,\n"
                "etcd, built from source), kwok simulating the nodes: `consumer` has CPU nodes only, `gpu-a`\n"
                "and `gpu-b` have GPU nodes. Idempotent: a running environment is only verified.",
                st.clusters_up,
            ),
            Step(
                "gpufed is installed in every cluster",
                "`gpufed local up` installed gpufed's CRDs and RBAC into each cluster and runs its\n"
                "`gpufed controller` as a process of the cluster; each cluster has a ClusterID and a\n"
                "NetworkConfig (all three use the same pod CIDR on purpose: the fabric must remap).",
                st.installed,
            ),
            Step(
                f"Peer the consumer with {a[0]}: {a[2]}",
                "Mutual authentication (challenge signed with the consumer's identity key, a CSR signed by the\n"
                "provider), the network fabric's control plane (IPAM, WireGuard keys, Gateways), then a\n"
                "ResourceSlice the provider grants; `peer` returns when the virtual node is Ready.",
                lambda: st.peer(a[0], a[1]),
            ),
            Step(
                f"Peer the consumer with {b[0]}: {b[2]}",
                "The same with the second provider, asking only for one GPU product.",
                lambda: st.peer(b[0], b[1]),
            ),
            Step(
                "One virtual node per provider",
                "The consumer now has a node per provider, carrying the granted GPUs and the providers'\n"
                "GPU labels; `gpufed info` shows requested vs granted vs used per peering.",
                st.virtual_nodes_step,
            ),
            Step(
                "WireGuard tunnels between the clusters",
                "One `gpufed gateway` agent per peering per side, each in a network namespace standing for\n"
                "its cluster's gateway pod: WireGuard (wireguard-go), prefix NAT in nftables, policy routing.\n"
                f"A consumer pod stand-in ({CLIENT_POD_IP}) is wired to the consumer's gateways.",
                st.tunnels,
                network=True,
            ),
            Step(
                f"Offload namespace {st.ns}",
                "`gpufed offload-namespace` extends the namespace to the providers: a twin namespace on each,\n"
                "and the admission webhook lets the namespace's pods tolerate the virtual nodes.",
                st.offload,
            ),
            Step(
                "kubectl create a GPU Job",
                "A plain Job (deploy/examples/gpu-job.yaml: 3 completions x 2 GPUs), nothing gpufed-specific.\n"
                "The consumer's own kube-scheduler places its pods on the virtual nodes; they run as twins\n"
                "on the providers, and the Job completes on the consumer.",
                st.job,
            ),
            Step(
                "kubectl logs of a remote pod",
                "The virtual node's kubelet API serves `kubectl logs`, read from the twin on the provider.",
                st.logs,
            ),
            Step(
                "kubectl create a Deployment and a Service",
                "Two inference servers (1 GPU each) behind a ClusterIP Service: the pods run on the providers,\n"
                "and the consumer's EndpointSlices list them at addresses the consumer can route to.",
                st.deployment,
            ),
            Step(
                "gpufed pool",
                "The GPUs of every provider and product: total, granted, in use, free, largest placeable.",
                st.pool,
            ),
            Step(
                "A request through the Service reaches an offloaded pod",
                "Each twin gets a real network stack at its provider pod IP with an HTTP server on 8080; a\n"
                "kube-proxy stand-in in the consumer pod DNATs the Service's ClusterIP to its endpoints. The\n"
                "requests cross the tunnels; each answer says which pod answered and where it saw us.",
                st.request,
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
            st.remove_podnet,
            cleanup=True,
            network=True,
        )
        if s.keep:
            return [*story, teardown]
        cleanup: list[Step] = [
            Step(
                "Delete the demo's workloads",
                "The Job, the Deployment and the Service; their pods go on both sides.",
                st.delete_workloads,
                cleanup=True,
            ),
            Step(
                f"Unoffload namespace {st.ns} and delete it",
                "`gpufed unoffload-namespace` removes the twin namespaces on the providers.",
                st.unoffload,
                cleanup=True,
            ),
            Step(
                "Unpeer the providers (network included)",
                "`gpufed unpeer` removes the fabric's objects on both sides, then everything of the peering.",
                st.unpeer,
                cleanup=True,
            ),
            teardown,
            Step(
                "Nothing is left behind",
                "No ForeignCluster, ResourceSlice, Tenant, Gateway, twin namespace or virtual node on any\n"
                "cluster, no network namespace of this demo. The clusters themselves keep running.",
                st.nothing_left,
                cleanup=True,
            ),
        ]
        if s.before_cleanup is not None:
            cleanup[0] = dataclasses.replace(cleanup[0], run=_first(s.before_cleanup, cleanup[0].run))
        return [*story, *cleanup]


async def run_demo(env: LocalEnvironment, settings: DemoSettings, out: TextIO) -> int:
    """The whole demo; returns the process exit status (0: every step that ran passed)."""
    narrator = Narrator(out)
    demo = Demo(env, settings, narrator)
    wireguard_go = env.binary("wireguard-go")
    why_not = ["--no-network was given"] if not settings.network else missing_requirements(wireguard_go)
    network_skip = None
    podnet = None
    if why_not:
        network_skip = "network steps skipped: " + "; ".join(why_not)
    else:
        podnet = demo.story.podnet = PodNetwork(
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
        if podnet is not None and (podnet.namespaces or podnet.agents):
            # interrupted, or a step failed before its clean-up: nothing outlives the demo's own processes
            with contextlib.suppress(PodNetworkError):
                await asyncio.shield(podnet.teardown())
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
