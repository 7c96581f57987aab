"""`GroupStart`: the twins of a group are created gated and released together (see `forge.groups`).

Owns, for one provider: whether a new twin of a group pod is created gated (its group has not
started there yet), and releasing a group's gated twins — one JSON patch per twin that removes the
gate, sent once every twin of the group exists and the provider's capacity snapshot holds them
(after this consumer's twins already on their way to the same pool's nodes). A gated twin is looked
at again whenever one of its group's twins changes (the pod controller reconciles it and the
provider calls `start`) and whenever a capacity snapshot arrives (`waiting` names the twins to
look at).

Does not: watch (the RemoteProvider keeps the twins in the `TwinStore` it hands over; its indexes
answer "this group's twins", "the gated twins" and "the twins on their way to a pool"), fail a group
back (the pod controller does once a twin stays unplaced past its timeout), or decide groups
(`gpupool.gang`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpupool.capacity import Snapshot
from vkprovider.forge import groups
from vkprovider.forge.pods import origin_node
from vkprovider.remote.placement import pod_gpus
from vkprovider.remote.refusals import refusal
from vkprovider.remote.twinstore import TwinStore

#: The provider's capacity snapshot now (None: no live snapshot).
SnapshotOf = Callable[[], Snapshot | None]


class GroupStart:
    def __init__(
        self,
        remote_api: Any,
        twins: TwinStore,
        products: Mapping[str, str | None],
        snapshot: SnapshotOf | None = None,
    ) -> None:
        self.remote = remote_api
        self._twins = twins
        #: Pool node -> its GPU product (the RemoteProvider's, kept up to date by the pool manager).
        self._products = products
        self._snapshot = snapshot
        self._log = structlog.get_logger().bind(component="group-start")

    def _members(self, local_ns: str, group: str) -> list[Mapping[str, Any]]:
        return groups.members(self._twins.group(local_ns, group), group)

    def gate_new(self, pod: Mapping[str, Any]) -> bool:
        """Whether the twin about to be created for the local `pod` is gated: it is of a group that
        has not started at the provider yet."""
        found = groups.group_of(pod)
        if found is None:
            return False
        return not groups.started(self._members(pod["metadata"]["namespace"], found[0]))

    def _fits(self, node: str, waiting: Sequence[Mapping[str, Any]]) -> bool | None:
        """Whether the provider's free GPUs of `node`'s product hold the `waiting` twins after the
        ungated twins still on their way to that pool (None: no snapshot, or no single product)."""
        snapshot = self._snapshot() if self._snapshot is not None else None
        product = self._products.get(node)
        cap = snapshot.product(product) if snapshot is not None and product else None
        if cap is None:
            return None
        before = [pod_gpus(t) for t in self._twins.on_the_way(node)]
        return groups.holds(cap.histogram, before, [pod_gpus(t) for t in waiting])

    async def start(self, pod: Mapping[str, Any], twin: Mapping[str, Any]) -> None:
        """Release the gated twins of `pod`'s group when the group may start (see the module docstring)."""
        found = groups.group_of(pod)
        if found is None or groups.gated(twin) is None:
            return
        group, size = found
        members = self._members(pod["metadata"]["namespace"], group)
        release = groups.to_start(members, size, lambda waiting: self._fits(origin_node(twin, ""), waiting))
        if not release:
            return
        for t in release:
            meta = t["metadata"]
            try:
                await rest.request(
                    self.remote,
                    "PATCH",
                    rest.path("v1", "pods", meta["name"], namespace=meta["namespace"]),
                    body=groups.ungate_patch(t),
                    content_type="application/json-patch+json",
                    what=f"start twin {meta['namespace']}/{meta['name']} with its group",
                )
            except KubeError as e:
                if e.not_found or e.status == 422:  # gone, or its gates changed: the next event says
                    continue
                raise refusal(e, "cannot start the twin with its group") from e
        self._log.debug("group started", group=group, pods=len(release), size=size)

    def waiting(self) -> list[tuple[str, str]]:
        """LOCAL keys of the gated twins (looked at again when the provider's capacity changes)."""
        return self._twins.gated()
