"""`gpufed controller`: the per-cluster control-plane process.

Owns: wiring — one API client, the preflight checks (CRDs and the consumer ClusterRoles installed),
the cluster identity (created at first start), and, side by side under one TaskGroup until
cancelled: the provider and consumer peering roles, the namespace offloading controller, the
offloading webhook (when a port is set; ready only once it serves) and with it the gang controller
(`vkprovider.gangs`: releases the groups of pods the webhook gates) and the Events on pods it keeps
local for their claims, the virtual StorageClass and the binding of its claims whose first pod stays
local (`vkprovider.storage`, `vkprovider.localstorage`), Kueue's flavors and GPU quotas
kept within the grants (`vkprovider.kueue`, once Kueue's API is served), the approver of the virtual
nodes' kubelet-serving certificates (`vkprovider.kubelet.csrapprove`) and the virtual kubelets'
supervisor, the ownerReferences that let uninstalling remove the webhook configuration and admission
policies created here (`gpufed.app.release`), and the capacity estimator (`gpupool.estimator.server`,
when a port is set; ready only once it serves and has published its ConfigMap). Roles communicate
only through the API server.

High availability (`leader_election`): every replica serves the webhook, the estimator and its
metrics (stateless servers behind Services; they share their certificates through Secrets); only
the replica holding the Lease `gpufed/gpufed-controller` runs the reconcilers. A replica that loses
the Lease exits (LostLeadershipError) and is restarted as a candidate; a clean stop hands the Lease over.
In a cluster, the per-peering virtual kubelets and gateways run as Deployments made from the
chart's templates (`gpufed.app.workloads`) instead of child processes.

Does not: install CRDs or RBAC (the installer does: `gpufed local up`, or the Helm chart).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpufed.apis.kinds import KINDS
from gpufed.apis.meta import GROUP
from gpufed.apis.wire import CONSUMER_CONTROL_ROLE, CONSUMER_WORKLOADS_ROLE, STORAGE_CLASS, SYSTEM_NAMESPACE
from gpufed.app.release import ReleaseOwner
from gpufed.app.supervisor import Supervisor, SupervisorSettings
from gpufed.app.workloads import Workloads, WorkloadSettings
from gpufed.defaults import METRICS_HOST
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client
from gpufed.kube.leader import LeaderElector, LeaderSettings, LostLeadershipError
from gpufed.kube.metrics import MetricsServer
from gpupool.estimator.server import EstimatorServer, EstimatorServerSettings
from peering.controllers.consumer import ConsumerRole, ConsumerSettings
from peering.controllers.identity import Identity, ensure_identity
from peering.controllers.offloading import OffloadingController, OffloadingSettings
from peering.controllers.provider import ProviderRole, ProviderSettings
from vkprovider import defaults
from vkprovider.gangs import GangController
from vkprovider.kubelet.csrapprove import ServingCSRApprover
from vkprovider.kueue import FlavorKeeper
from vkprovider.localstorage import KeptLocalReporter, LocalClaims, LocalStorageSettings
from vkprovider.storage import ensure_storage_class
from vkprovider.webhook.server import Webhook, WebhookServerSettings


class PreflightError(GpufedError):
    """The cluster lacks something the controller needs; the message says what to install."""


#: The virtual kubelets' identities: the local environment's certificate user and the in-cluster
#: ServiceAccount (deploy/rbac/virtual-kubelet.yaml binds both).
VIRTUAL_KUBELET_USERS = ("gpufed:virtual-kubelet", "system:serviceaccount:gpufed:gpufed-virtual-kubelet")
#: Default port range for the kubelet APIs of the virtual kubelets the controller starts.
DEFAULT_KUBELET_PORTS = defaults.KUBELET_PORTS


@dataclass(frozen=True)
class WebhookSettings:
    """The offloading admission webhook served by the controller (vkprovider.webhook)."""

    #: TCP port of the HTTPS server; None: no webhook (pods then need the toleration by hand).
    port: int | None = None
    #: Address the API server reaches the webhook on (the MutatingWebhookConfiguration's URL host).
    host: str = "127.0.0.1"
    #: In a cluster: the Service (namespace, name, port) in front of the replicas, used instead of a URL.
    service: tuple[str, str, int] | None = None


@dataclass(frozen=True)
class EstimatorSettings:
    """The provider's capacity estimator served by the controller (gpupool.estimator)."""

    #: TCP port of the gRPC server; None: no estimator (consumers then see static grant capacity).
    port: int | None = None
    #: Address to listen on (0.0.0.0 / :: for every interface; then `address` is required).
    host: str = "127.0.0.1"
    #: host:port consumers reach it on (published in ConfigMap gpufed/gpufed-estimator and named by
    #: its certificate); None: `host` and `port`.
    address: str | None = None


@dataclass(frozen=True)
class VirtualKubeletsSettings:
    """How the controller starts one `gpufed virtual-kubelet` process per peered provider."""

    #: kubeconfig of the virtual kubelets' identity; None: the controller starts none (Helm runs them).
    kubeconfig: Path | None = None
    #: First and last TCP port for their kubelet APIs (one port per virtual node).
    kubelet_ports: tuple[int, int] = DEFAULT_KUBELET_PORTS
    #: Address the virtual nodes publish for their kubelet API (status.addresses InternalIP).
    node_address: str = "127.0.0.1"
    #: Directory for their log files (`virtual-kubelet-<node>.log`); None: inherit stderr.
    log_dir: Path | None = None
    #: Users whose kubelet-serving CSRs for gpufed virtual nodes the controller approves.
    users: tuple[str, ...] = VIRTUAL_KUBELET_USERS


#: The Lease replicas of the controller compete for.
LEADER_LEASE = "gpufed-controller"


@dataclass(frozen=True)
class LeaderElectionSettings:
    #: Whether replicas elect a leader (in a cluster with replicas > 1); off: this process leads.
    enabled: bool = False
    #: This replica's identity in the Lease (the pod name in a cluster).
    identity: str = ""
    #: Namespace and name of the Lease.
    namespace: str = SYSTEM_NAMESPACE
    name: str = LEADER_LEASE


@dataclass(frozen=True)
class ControllerSettings:
    #: kubeconfig file of the controller's identity; None: the pod's service account (in a cluster).
    kubeconfig: Path | None
    #: Context in it (None: current context).
    context: str | None = None
    #: Readable prefix of a newly created ClusterID (e.g. the cluster's name).
    name_hint: str = ""
    #: Explicit ClusterID for a new identity; must match an existing one.
    cluster_id: str | None = None
    provider: ProviderSettings = field(default_factory=ProviderSettings)
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    offloading: OffloadingSettings = field(default_factory=OffloadingSettings)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    virtual_kubelets: VirtualKubeletsSettings = field(default_factory=VirtualKubeletsSettings)
    estimator: EstimatorSettings = field(default_factory=EstimatorSettings)
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)
    workloads: WorkloadSettings = field(default_factory=WorkloadSettings)
    #: Port of the Prometheus /metrics (and /healthz) HTTP server; None: none.
    metrics_port: int | None = None
    #: Address of that server: loopback unless asked (the Helm chart passes 0.0.0.0 for Prometheus).
    metrics_host: str = METRICS_HOST
    #: Name of the virtual StorageClass whose claims are bound on providers; None: none is made.
    storage_class: str | None = STORAGE_CLASS
    #: This cluster's StorageClass for claims of the virtual class whose first pod stays local
    #: (`vkprovider.localstorage`); None: the cluster's default class.
    local_storage_class: str | None = None


async def preflight(api: Any) -> None:
    missing = []
    for kind in KINDS:
        name = f"{kind.plural}.{GROUP}"
        if await rest.get(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is None:
            missing.append(f"CRD {name}")
    for role in (CONSUMER_WORKLOADS_ROLE, CONSUMER_CONTROL_ROLE):
        if await rest.get(api, rest.path("rbac.authorization.k8s.io/v1", "clusterroles", role)) is None:
            missing.append(f"ClusterRole {role}")
    if missing:
        raise PreflightError(
            "gpufed is not installed on this cluster: missing "
            + ", ".join(missing)
            + " (apply deploy/crds/ and deploy/rbac/ with an admin kubeconfig)"
        )


async def run(settings: ControllerSettings, ready: asyncio.Event | None = None) -> None:
    try:
        await _run(settings, ready)
    except* LostLeadershipError as group:
        raise group.exceptions[0] from None
    except* PreflightError as group:
        raise group.exceptions[0] from None


async def _run(settings: ControllerSettings, ready: asyncio.Event | None) -> None:
    log = structlog.get_logger()
    async with api_client(settings.kubeconfig, settings.context) as api:
        try:
            await preflight(api)
            workloads = Workloads(api, settings.workloads)  # a bad template stops the start here
        except KubeError as e:
            raise PreflightError(f"cannot start: {e}") from e
        except ValueError as e:
            raise PreflightError(str(e)) from e
        wh = settings.webhook
        webhook = (
            Webhook(api, WebhookServerSettings(wh.port, wh.host, service=wh.service)) if wh.port is not None else None
        )
        est = settings.estimator
        estimator = (
            EstimatorServer(api, EstimatorServerSettings(port=est.port, host=est.host, address=est.address))
            if est.port is not None
            else None
        )
        le = settings.leader_election
        elector = (
            LeaderElector(api, LeaderSettings(namespace=le.namespace, name=le.name, identity=le.identity))
            if le.enabled
            else None
        )
        try:
            async with asyncio.TaskGroup() as tg:
                # Every replica: the stateless servers.
                if settings.metrics_port is not None:
                    tg.create_task(MetricsServer(settings.metrics_port, settings.metrics_host).run())
                if webhook is not None:
                    tg.create_task(webhook.run())
                if estimator is not None:
                    tg.create_task(estimator.run())
                # The leader only: everything that writes peering state.
                if elector is not None:
                    await elector.acquire()
                    tg.create_task(elector.hold())
                try:
                    identity: Identity = await ensure_identity(
                        api, name_hint=settings.name_hint, cluster_id=settings.cluster_id
                    )
                except KubeError as e:
                    raise PreflightError(f"cannot start: {e}") from e
                log.info("controller starting", cluster=identity.cluster_id, key=identity.fingerprint)
                provider = ProviderRole(api, identity, settings.provider)
                consumer = ConsumerRole(api, identity, settings.consumer)
                offloading = OffloadingController(api, identity.cluster_id, settings.offloading)
                tg.create_task(provider.run())
                tg.create_task(consumer.run())
                tg.create_task(offloading.run())
                tg.create_task(ServingCSRApprover(api, settings.virtual_kubelets.users).run())
                tg.create_task(ReleaseOwner(api).run())
                if webhook is not None:  # the webhook gates the pods of groups; the leader releases them
                    tg.create_task(GangController(api).run())
                tg.create_task(FlavorKeeper(api).run())  # idle until Kueue's API is served
                if settings.storage_class:
                    await ensure_storage_class(api, settings.storage_class)
                    local = LocalStorageSettings(local_class=settings.local_storage_class)
                    tg.create_task(LocalClaims(api, local).run())
                if webhook is not None:  # pods the webhook labelled as kept local by their claims
                    tg.create_task(KeptLocalReporter(api).run())
                tg.create_task(workloads.run())
                vks = settings.virtual_kubelets
                if vks.kubeconfig is not None:
                    supervisor = Supervisor(
                        api, SupervisorSettings(vks.kubeconfig, vks.kubelet_ports, vks.node_address, vks.log_dir)
                    )
                    tg.create_task(supervisor.run())
                await provider.ready.wait()
                await offloading.ready.wait()
                if webhook is not None:
                    await webhook.ready.wait()  # pods of offloaded namespaces are refused until it serves
                if estimator is not None:
                    await estimator.ready.wait()  # consumers find it through its ConfigMap from now on
                log.info("controller ready", cluster=identity.cluster_id)
                if ready is not None:
                    ready.set()
        finally:
            if elector is not None:
                await asyncio.shield(elector.release())
