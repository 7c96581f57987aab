"""`gpufed controller`: the per-cluster control-plane process.

Owns: wiring — one API client, the preflight checks (CRDs and the consumer ClusterRoles installed),
the cluster identity (created at first start), and, side by side under one TaskGroup until
cancelled: the provider and consumer peering roles, the namespace offloading controller, the
offloading webhook (when a port is set; ready only once it serves), the approver of the virtual
nodes' kubelet-serving certificates (`vkprovider.node.csrapprove`) and the virtual kubelets'
supervisor, and the capacity estimator (`peering.estimator.server`, when a port is set; ready only
once it serves and has published its ConfigMap). Roles communicate only through the API server.

Does not: install CRDs or RBAC (the installer does: `gpufed local up`, later the Helm chart).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from peering.controllers.consumer import ConsumerRole, ConsumerSettings
from peering.controllers.identity import Identity, ensure_identity
from peering.controllers.offloading import OffloadingController, OffloadingSettings
from peering.controllers.provider import ProviderRole, ProviderSettings
from peering.estimator.server import EstimatorServer, EstimatorServerSettings
from peering.ids import CONSUMER_CONTROL_ROLE, CONSUMER_WORKLOADS_ROLE
from peering.kube import rest
from peering.kube.client import KubeError, api_client
from peering.models import GROUP, KINDS
from vkprovider.app.supervisor import Supervisor, SupervisorSettings
from vkprovider.node.csrapprove import ServingCSRApprover
from vkprovider.webhook.server import Webhook, WebhookServerSettings


class PreflightError(Exception):
    """The cluster lacks something the controller needs; the message says what to install."""


#: The virtual kubelets' identities: the local environment's certificate user and the in-cluster
#: ServiceAccount (deploy/rbac/virtual-kubelet.yaml binds both).
VIRTUAL_KUBELET_USERS = ("gpufed:virtual-kubelet", "system:serviceaccount:gpufed:gpufed-virtual-kubelet")
#: Default port range for the kubelet APIs of the virtual kubelets the controller starts.
DEFAULT_KUBELET_PORTS = (10250, 10259)


@dataclass(frozen=True)
class WebhookSettings:
    """The offloading admission webhook served by the controller (vkprovider.webhook)."""

    #: TCP port of the HTTPS server; None: no webhook (pods then need the toleration by hand).
    port: int | None = None
    #: Address the API server reaches the webhook on (the MutatingWebhookConfiguration's URL host).
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class EstimatorSettings:
    """The provider's capacity estimator served by the controller (peering.estimator)."""

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


@dataclass(frozen=True)
class ControllerSettings:
    #: kubeconfig file of the controller's identity.
    kubeconfig: Path
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
    log = structlog.get_logger()
    async with api_client(settings.kubeconfig, settings.context) as api:
        try:
            await preflight(api)
            identity: Identity = await ensure_identity(
                api, name_hint=settings.name_hint, cluster_id=settings.cluster_id
            )
        except KubeError as e:
            raise PreflightError(f"cannot start: {e}") from e
        log.info("controller starting", cluster=identity.cluster_id, key=identity.fingerprint)
        provider = ProviderRole(api, identity, settings.provider)
        consumer = ConsumerRole(api, identity, settings.consumer)
        offloading = OffloadingController(api, identity.cluster_id, settings.offloading)
        webhook = (
            Webhook(api, WebhookServerSettings(settings.webhook.port, settings.webhook.host))
            if settings.webhook.port is not None
            else None
        )
        est = settings.estimator
        estimator = (
            EstimatorServer(api, EstimatorServerSettings(port=est.port, host=est.host, address=est.address))
            if est.port is not None
            else None
        )
        async with asyncio.TaskGroup() as tg:
            tg.create_task(provider.run())
            tg.create_task(consumer.run())
            tg.create_task(offloading.run())
            tg.create_task(ServingCSRApprover(api, settings.virtual_kubelets.users).run())
            if webhook is not None:
                tg.create_task(webhook.run())
            if estimator is not None:
                tg.create_task(estimator.run())
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
