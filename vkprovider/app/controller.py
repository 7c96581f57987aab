"""`gpufed controller`: the per-cluster control-plane process.

Owns: wiring — one API client, the preflight checks (CRDs and the consumer ClusterRoles installed),
the cluster identity (created at first start), and the provider and consumer peering roles run
side by side under one TaskGroup until cancelled. Roles communicate only through the API server.

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
from peering.controllers.provider import ProviderRole, ProviderSettings
from peering.ids import CONSUMER_CONTROL_ROLE, CONSUMER_WORKLOADS_ROLE
from peering.kube import rest
from peering.kube.client import KubeError, api_client
from peering.models import GROUP, KINDS


class PreflightError(Exception):
    """The cluster lacks something the controller needs; the message says what to install."""


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
        async with asyncio.TaskGroup() as tg:
            tg.create_task(provider.run())
            tg.create_task(consumer.run())
            await provider.ready.wait()
            log.info("controller ready", cluster=identity.cluster_id)
            if ready is not None:
                ready.set()
