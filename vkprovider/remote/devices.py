"""The consumer side of Dynamic Resource Allocation for one provider's pool nodes.

Owns:
- `ClaimCache`: a watch of the consumer's ResourceClaims (resource.k8s.io/v1, every namespace),
  keeping which devices of gpufed's driver each pool node's claims hold (so a republished slice keeps
  them and the node's GPU figures count them once), and the claims themselves for the offloading
  path; listeners are called on every change that moves a held device;
- `SlicePublisher`: applies the consumer's DeviceClass `gpu.gpufed.io` before its first slice, and
  server-side applies the ResourceSlice of a pool node (`forge.devices`) when its
  devices change, bumping the pool's generation, and deletes it when the node goes.

A consumer that serves no resource.k8s.io/v1 gets neither (the composition root asks `rest.serves`).

Does not: decide what is offered (`forge.devices.offer`), or offload claims (`remote.dra_claims`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from gpufed.apis.wire import DRA_API_PATH, DRA_DRIVER
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from vkprovider.forge.devices import device_class, slice_manifest

Key = tuple[str, str]


def held_devices(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(pool, device) of gpufed's driver that `claim`'s allocation holds."""
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices")) or {}).get("results") or []
    return [(str(r.get("pool") or ""), str(r.get("device") or "")) for r in results if r.get("driver") == DRA_DRIVER]


class ClaimCache:
    """The consumer's ResourceClaims; `held(node)` the gpufed devices allocated on a pool node."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.claims: dict[Key, dict[str, Any]] = {}
        self._held: dict[Key, tuple[tuple[str, str], ...]] = {}
        self.listeners: list[Callable[[], None]] = []

    def _on_claim(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        before = self._held.get(key, ())
        if kind == "DELETED":
            self.claims.pop(key, None)
            self._held.pop(key, None)
        else:
            self.claims[key] = obj
            now = tuple(held_devices(obj))
            if now:
                self._held[key] = now
            else:
                self._held.pop(key, None)
        if self._held.get(key, ()) != before:
            for listener in self.listeners:
                listener()

    def held(self, node: str) -> set[str]:
        """Device names of `node`'s pool that consumer claims hold."""
        return {device for devices in self._held.values() for pool, device in devices if pool == node}

    def held_count(self, nodes: Callable[[str], bool]) -> int:
        """Devices held on the pool nodes `nodes` accepts."""
        return sum(1 for devices in self._held.values() for pool, _d in devices if nodes(pool))

    async def run(self) -> None:
        await watch(self.api, f"{DRA_API_PATH}/resourceclaims", self._on_claim, what="resourceclaims")


class SlicePublisher:
    """Publishes pool nodes' ResourceSlices; remembers what it last wrote per node."""

    def __init__(self, api: Any, owner_references: Sequence[Mapping[str, Any]] = ()) -> None:
        self.api = api
        #: The slices' owners (the peering's ForeignCluster): unpeering deletes them with the nodes.
        self.owner_references = tuple(owner_references)
        self._last: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._class_applied = False
        self._log = structlog.get_logger().bind(kind="ResourceSlice")

    def _path(self, node: str = "") -> str:
        return f"{DRA_API_PATH}/resourceslices" + (f"/{rest.segment(node)}" if node else "")

    async def ensure_class(self) -> None:
        """The DeviceClass consumer claims name (server-side applied: idempotent; every virtual kubelet
        of the consumer applies the same object, so a lost race is no failure)."""
        if self._class_applied:
            return
        cls = device_class()
        path = f"{DRA_API_PATH}/deviceclasses/{cls['metadata']['name']}"
        try:
            await rest.apply(self.api, path, cls, what="deviceclass")
        except KubeError as e:
            if not e.conflict:
                raise
        self._class_applied = True

    async def publish(self, node: str, devices: Sequence[dict[str, Any]]) -> None:
        await self.ensure_class()
        last = self._last.get(node)
        if last is not None and last[1] == list(devices):
            return
        if last is None:
            current = await rest.get(self.api, self._path(node), what=f"resourceslice {node}")
            generation = int((((current or {}).get("spec") or {}).get("pool") or {}).get("generation") or 0)
        else:
            generation = last[0]
        generation += 1
        await rest.apply(
            self.api,
            self._path(node),
            slice_manifest(node, devices, generation, self.owner_references),
            what=f"resourceslice {node}",
        )
        self._last[node] = (generation, list(devices))
        self._log.info("devices published", node=node, devices=len(devices), generation=generation)

    async def remove(self, node: str) -> None:
        self._last.pop(node, None)
        await rest.delete(self.api, self._path(node), what=f"resourceslice {node}")


__all__ = ["ClaimCache", "SlicePublisher", "held_devices"]
