"""The remapper the virtual kubelet uses, kept current: it implements the IP-translation Protocol of
`vkprovider.remote` (structurally; netfabric never imports vkprovider) by delegating to the
`Remapper` built from this cluster's NetworkConfig and the provider's RemoteNetwork, and rebuilds it
when either changes (watched). Until the fabric is configured, or with a damaged object, addresses
pass unchanged (the identity), which is also right for a peering whose CIDRs never collided.

Does not: re-report addresses already written before a mapping changed (the next status update of
each pod does), or allocate anything.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.network import NETWORK_CONFIG, NetworkConfigSpec, RemoteNetworkSpec
from gpufed.apis.wire import SYSTEM_NAMESPACE
from gpufed.kube import rest
from gpufed.kube.watch import watch
from netfabric.plan import remapper
from netfabric.remap import Remapper

log = structlog.get_logger()


class LiveRemapper:
    def __init__(self, api: Any, peer_id: str, namespace: str = SYSTEM_NAMESPACE) -> None:
        self.api = api
        self.peer_id = peer_id
        self.namespace = namespace
        self.current: Remapper | None = None
        self._specs: dict[str, dict[str, Any] | None] = {"networkconfigs": None, "remotenetworks": None}

    def to_local_ip(self, ip: str) -> str:
        return self.current.to_local_ip(ip) if self.current else ip

    def to_remote_ip(self, ip: str) -> str:
        return self.current.to_remote_ip(ip) if self.current else ip

    def _rebuild(self) -> None:
        net, remote = self._specs["networkconfigs"], self._specs["remotenetworks"]
        before = self.current
        try:
            self.current = (
                remapper(NetworkConfigSpec.model_validate(net), RemoteNetworkSpec.model_validate(remote))
                if net is not None and remote is not None
                else None
            )
        except (ValidationError, ValueError) as e:
            self.current = None
            log.warning("fabric mapping unusable; addresses pass unchanged", remote_cluster=self.peer_id, error=str(e))
        if self.current != before:
            log.info(
                "fabric mapping",
                remote_cluster=self.peer_id,
                remote_pods=str(self.current.peer_pod.to_mapped(self.current.peer_pod.real.network_address))
                if self.current
                else "unchanged addresses",
            )

    async def load(self) -> None:
        """Read both objects once (so the first pod status is already translated)."""
        for plural, name in (("networkconfigs", NETWORK_CONFIG), ("remotenetworks", self.peer_id)):
            obj = await rest.get(self.api, rest.path(API_VERSION, plural, name, namespace=self.namespace))
            self._specs[plural] = (obj or {}).get("spec") if obj else None
        self._rebuild()

    async def _watch(self, plural: str, name: str) -> None:
        def on_event(t: str, obj: dict[str, Any]) -> None:
            self._specs[plural] = None if t == "DELETED" else obj.get("spec")
            self._rebuild()

        await watch(
            self.api,
            rest.path(API_VERSION, plural, namespace=self.namespace),
            on_event,
            what=f"{plural}/{name}",
            params={"fieldSelector": f"metadata.name={name}"},
        )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch("networkconfigs", NETWORK_CONFIG))
            tg.create_task(self._watch("remotenetworks", self.peer_id))
