"""`OffloadedNamespaces`: which consumer namespaces are offloaded to one provider, as the CONSUMER says.

The provider writes the TwinNamespaces the virtual kubelet watches (spec and status), so a provider
could claim any consumer namespace by writing one. What is offloaded where is the consumer's own
decision, recorded by its offloading controller (`peering.controllers.offloading`) in each
NamespaceOffloading's `status.remoteNamespaces`: one entry per selected provider, and an entry in
phase `Terminating` for a provider whose twin is being removed. Only that record counts here; the
virtual kubelet reflects, copies references into, creates twins in and issues tokens for a
namespace only while `allows(namespace)`.

Owns, for one provider: a list+watch of the consumer's NamespaceOffloadings (every namespace),
the decision per namespace (`offloaded_to`, pure), and telling `listeners` when it changes.

Does not: look at anything the provider wrote, decide the selection itself (the offloading
controller does, from `spec.clusterSelector` and the virtual nodes), or report refusals
(`remote.provider` does, on the NamespaceOffloading or the ForeignCluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import NAMESPACE_OFFLOADING
from gpufed.kube import rest
from gpufed.kube.watch import watch

#: Phase of a `remoteNamespaces` entry whose provider is no longer selected (its twin is being removed).
LEAVING_PHASE = "Terminating"


def offloaded_to(offloading: Mapping[str, Any] | None, provider: str) -> bool:
    """Whether `offloading` (a NamespaceOffloading as the consumer's API server holds it) offloads its
    namespace to `provider`: not being deleted, and an entry for the provider that is not leaving."""
    if offloading is None or (offloading.get("metadata") or {}).get("deletionTimestamp"):
        return False
    entries = (offloading.get("status") or {}).get("remoteNamespaces") or []
    return any(
        isinstance(e, Mapping) and e.get("clusterId") == provider and e.get("phase") != LEAVING_PHASE for e in entries
    )


class OffloadedNamespaces:
    """The consumer's NamespaceOffloadings, as far as one provider is concerned."""

    def __init__(self, local_api: Any, provider: str) -> None:
        self.local = local_api
        self.provider = provider
        #: Set once the NamespaceOffloadings have been listed (before: nothing is allowed).
        self.synced = asyncio.Event()
        #: Called with a namespace whose decision changed, and with "" once listed.
        self.listeners: list[Callable[[str], None]] = []
        self._objects: dict[str, dict[str, Any]] = {}

    def allows(self, namespace: str) -> bool:
        """Whether the consumer offloaded `namespace` to this provider (False until listed)."""
        return self.synced.is_set() and offloaded_to(self._objects.get(namespace), self.provider)

    def offloading(self, namespace: str) -> dict[str, Any] | None:
        """The NamespaceOffloading of `namespace` as last seen (None: there is none)."""
        return self._objects.get(namespace)

    async def run(self) -> None:
        await watch(
            self.local,
            rest.path(API_VERSION, "namespaceoffloadings"),
            self._on_event,
            what="namespaceoffloadings",
            on_synced=self._on_synced,
        )

    def _on_synced(self) -> None:
        if not self.synced.is_set():
            self.synced.set()
            self._tell("")

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("name") != NAMESPACE_OFFLOADING:
            return
        namespace = str(meta.get("namespace") or "")
        before = offloaded_to(self._objects.get(namespace), self.provider)
        if kind == "DELETED":
            self._objects.pop(namespace, None)
        else:
            self._objects[namespace] = obj
        if self.synced.is_set() and offloaded_to(self._objects.get(namespace), self.provider) != before:
            self._tell(namespace)

    def _tell(self, namespace: str) -> None:
        for listener in self.listeners:
            listener(namespace)


__all__ = ["LEAVING_PHASE", "OffloadedNamespaces", "offloaded_to"]
