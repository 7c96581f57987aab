"""Per-peering workloads in a real cluster: a virtual-kubelet Deployment per peered provider and a
gateway Deployment per Gateway, from the templates the Helm chart mounts into the controller.

Owns: the objects `vkprovider.forge.workloads.render` makes of each template, in the system
namespace — applied (server-side, field manager `gpufed`) for every ForeignCluster with role
Provider and credentials (the same rule the local environment's process supervisor follows) and
every Gateway; deleted (UID precondition) when their peering is gone. Level-triggered: any event
on the watched kinds marks the state dirty, a sync re-reads everything and converges, and a
periodic resync repairs drift (e.g. a Deployment deleted by hand). A template that cannot be
loaded stops the controller at start with a message naming the file.

Does not: run the workloads (the cluster does), or decide when a peering is peered (the peering
controllers do).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, REMOTE_CLUSTER_LABEL, SYSTEM_NAMESPACE
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from vkprovider.forge import workloads as forge
from vkprovider.forge.workloads import Template, TemplateError

#: Seconds between full resyncs (drift repair) when nothing changes.
RESYNC_S = 60.0
#: Seconds between retries of a failed sync.
RETRY_S = 5.0

VIRTUAL_KUBELET = "virtual-kubelet"
GATEWAY = "gateway"
_KINDS = (("apps/v1", "deployments"), ("v1", "services"))


@dataclass(frozen=True)
class WorkloadSettings:
    #: Template file (YAML documents) of a provider's virtual kubelet; None: none are run this way.
    virtual_kubelet_template: Path | None = None
    #: Template file of a peering's gateway; None: none are run this way.
    gateway_template: Path | None = None
    namespace: str = SYSTEM_NAMESPACE


def load(path: Path, component: str) -> Template:
    """The template in `path`; TemplateError with the file name when unreadable or invalid."""
    container, env = {
        VIRTUAL_KUBELET: ("virtual-kubelet", "GPUFED_PROVIDER"),
        GATEWAY: ("gateway", "GPUFED_GATEWAY_NAME"),
    }[component]
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as e:
        raise TemplateError(f"cannot read the {component} template {path}: {e}") from e
    return forge.check(component, container, env, docs, source=str(path))


def provider_peered(fc: Mapping[str, Any]) -> bool:
    spec = fc.get("spec") or {}
    return (
        "Provider" in (spec.get("roles") or [])
        and not fc["metadata"].get("deletionTimestamp")
        and bool((fc.get("status") or {}).get("kubeconfigSecret"))
    )


class Workloads:
    def __init__(self, api: Any, settings: WorkloadSettings) -> None:
        self.api = api
        self.settings = settings
        self.templates: dict[str, Template] = {}
        if settings.virtual_kubelet_template is not None:
            self.templates[VIRTUAL_KUBELET] = load(settings.virtual_kubelet_template, VIRTUAL_KUBELET)
        if settings.gateway_template is not None:
            self.templates[GATEWAY] = load(settings.gateway_template, GATEWAY)
        self.ready = asyncio.Event()
        self._dirty = asyncio.Event()
        self._log = structlog.get_logger().bind(component="peering-workloads")

    async def desired(self) -> list[dict[str, Any]]:
        """Every object the current peerings need."""
        out: list[dict[str, Any]] = []
        ns = self.settings.namespace
        if VIRTUAL_KUBELET in self.templates:
            for fc in await rest.list_items(self.api, rest.path(API_VERSION, "foreignclusters")):
                if provider_peered(fc):
                    owner = forge.owner_reference(API_VERSION, "ForeignCluster", fc)
                    out += forge.render(self.templates[VIRTUAL_KUBELET], fc["metadata"]["name"], ns, owner)
        if GATEWAY in self.templates:
            for gw in await rest.list_items(self.api, rest.path(API_VERSION, "gateways", namespace=ns)):
                if not gw["metadata"].get("deletionTimestamp"):
                    owner = forge.owner_reference(API_VERSION, "Gateway", gw)
                    listens = (gw.get("spec") or {}).get("role") != "Client"
                    out += forge.render(self.templates[GATEWAY], gw["metadata"]["name"], ns, owner, services=listens)
        return out

    async def sync(self) -> None:
        ns = self.settings.namespace
        want = await self.desired()
        keys = {(o["kind"], o["metadata"]["name"]) for o in want}
        for obj in want:
            plural = "deployments" if obj["kind"] == "Deployment" else "services"
            url = rest.path(obj["apiVersion"], plural, obj["metadata"]["name"], namespace=ns)
            await rest.apply(self.api, url, obj, what=f"apply {obj['kind']} {ns}/{obj['metadata']['name']}")
        for component in sorted(self.templates):
            selector = f"{MANAGED_BY_LABEL}={MANAGED_BY},{forge.COMPONENT_LABEL}={component}"
            for api_version, plural in _KINDS:
                existing = await rest.list_items(
                    self.api, rest.path(api_version, plural, namespace=ns), params={"labelSelector": selector}
                )
                for obj in existing:
                    await self._remove_unwanted(api_version, plural, obj, keys)

    async def _remove_unwanted(
        self, api_version: str, plural: str, obj: dict[str, Any], keys: set[tuple[str, str]]
    ) -> None:
        meta = obj["metadata"]
        kind = "Deployment" if plural == "deployments" else "Service"
        peer = (meta.get("labels") or {}).get(REMOTE_CLUSTER_LABEL)
        if (kind, meta["name"]) in keys or not peer:
            return
        self._log.info("peering gone; removing its workload", kind=kind, name=meta["name"], remote_cluster=peer)
        with contextlib.suppress(KubeError):  # gone meanwhile, or replaced: the next sync sees it
            await rest.delete(
                self.api,
                rest.path(api_version, plural, meta["name"], namespace=self.settings.namespace),
                uid=meta["uid"],
            )

    def _on_event(self, _kind: str, _obj: dict[str, Any]) -> None:
        self._dirty.set()

    async def run(self) -> None:
        if not self.templates:
            self.ready.set()
            return
        ns = self.settings.namespace
        async with asyncio.TaskGroup() as tg:
            if VIRTUAL_KUBELET in self.templates:
                url = rest.path(API_VERSION, "foreignclusters")
                tg.create_task(watch(self.api, url, self._on_event, what="workloads-foreignclusters"))
            if GATEWAY in self.templates:
                url = rest.path(API_VERSION, "gateways", namespace=ns)
                tg.create_task(watch(self.api, url, self._on_event, what="workloads-gateways"))
            tg.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            self._dirty.clear()
            try:
                await self.sync()
                self.ready.set()
                delay = RESYNC_S
            except KubeError as e:
                self._log.warning("peering workloads not synced; retrying", error=str(e))
                delay = RETRY_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._dirty.wait()
