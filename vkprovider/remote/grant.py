"""Grant and health of one provider: what the remote provider's pool nodes advertise.

Owns, for one (consumer, provider): this provider's ResourceSlices (consumer side, namespace gpufed)
as last seen, the grant they add up to (accepted slices only), its node labels allow-listed
(`forge.pools.filter_node_labels`; what is dropped is reported once per change as a Warning Event
`NodeLabelsDropped` on the ForeignCluster), and the provider's health (its API answers, the answer
reused for `health_ttl_s`).

Construction takes the collaborators: the provider's API client (health) and how to report on the
ForeignCluster.

Does not: watch the ResourceSlices (the RemoteProvider does, and hands each event to `on_slice`),
or decide what a pool node does with the grant (`remote.pools`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import structlog

from gpufed.apis.quantity import parse
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from vkprovider.forge.claims import StorageOffer, merge_offers, offers_from
from vkprovider.forge.pools import filter_node_labels

#: Reason of the Warning Event that reports the provider's node labels the allow-list dropped.
LABELS_DROPPED = "NodeLabelsDropped"


@dataclass(frozen=True)
class Grant:
    """What the provider granted this consumer (all accepted ResourceSlices together)."""

    resources: Mapping[str, Decimal] = field(default_factory=dict)
    #: The GPU product every accepted slice is limited to (None: any, or they differ).
    gpu_product: str | None = None
    #: The labels the provider reported for the grant's nodes that a virtual node may carry.
    labels: Mapping[str, str] = field(default_factory=dict)
    accepted: bool = False
    #: The StorageClasses the provider offers the consumer's claims (checked: `forge.claims.offers_from`).
    storage: tuple[StorageOffer, ...] = ()
    #: What the accepted slices ask for: the most the grant grows back to once the provider's own
    #: load lets it (the grant itself follows the provider's live capacity).
    requested: Mapping[str, Decimal] = field(default_factory=dict)


def _add_quantities(total: dict[str, Decimal], quantities: Mapping[str, Any] | None) -> None:
    """Add a slice's resource map to `total`; an unreadable quantity counts for nothing."""
    for r, q in (quantities or {}).items():
        with contextlib.suppress(ValueError):
            total[r] = total.get(r, Decimal(0)) + parse(q)


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str
    message: str


class ProviderGrant:
    """This provider's ResourceSlices, the grant and health they advertise (see the module docstring)."""

    def __init__(
        self,
        remote_api: Any,
        provider: str,
        node_label_allow: tuple[str, ...],
        health_ttl_s: float,
        on_foreign_cluster: Callable[[str, str, str], None],
    ) -> None:
        self.remote = remote_api
        self.provider = provider
        self.node_label_allow = node_label_allow
        self.health_ttl_s = health_ttl_s
        self._on_foreign_cluster = on_foreign_cluster
        #: Set once this provider's ResourceSlices have been listed (`grant()` is meaningful).
        self.synced = asyncio.Event()
        #: Called when this provider's ResourceSlices change.
        self.listeners: list[Callable[[], None]] = []
        self.slices: dict[str, dict[str, Any]] = {}
        #: The provider's node labels dropped by the allow-list, as last reported.
        self._labels_dropped: dict[str, str] = {}
        self._health: tuple[float, Health] | None = None
        self._log = structlog.get_logger().bind(remote_cluster=provider)

    def on_slice(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED" or (obj.get("spec") or {}).get("providerClusterId") != self.provider:
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
        self._report_dropped_labels()
        for listener in self.listeners:
            listener()

    def _supplied_labels(self) -> dict[str, str]:
        """The node labels the provider reported on its accepted slices, unfiltered."""
        labels: dict[str, str] = {}
        for sl in self.slices.values():
            st = sl.get("status") or {}
            res: dict[str, Any] = next((c for c in st.get("conditions") or [] if c.get("type") == "Resources"), {})
            if res.get("status") == "True" and isinstance(st.get("nodeLabels"), Mapping):
                labels.update({str(k): str(v) for k, v in st["nodeLabels"].items()})
        return labels

    def _report_dropped_labels(self) -> None:
        dropped = filter_node_labels(self._supplied_labels(), self.node_label_allow).dropped
        if dropped == self._labels_dropped:
            return
        self._labels_dropped = dropped
        if not dropped:
            return
        listed = ", ".join(f"{k}={v}" for k, v in sorted(dropped.items()))
        message = (
            f"provider {self.provider} reported node labels its virtual nodes do not carry "
            f"(only GPU labels and the allow-list pass): {listed}"
        )[:1000]
        self._log.warning("provider node labels dropped", labels=sorted(dropped))
        self._on_foreign_cluster("Warning", LABELS_DROPPED, message)

    def grant(self) -> Grant:
        granted: dict[str, Decimal] = {}
        requested: dict[str, Decimal] = {}
        products: set[str | None] = set()
        offers: list[tuple[StorageOffer, ...]] = []
        accepted = False
        for sl in self.slices.values():
            st = sl.get("status") or {}
            res: dict[str, Any] = next((c for c in st.get("conditions") or [] if c.get("type") == "Resources"), {})
            if res.get("status") != "True":
                continue
            accepted = True
            products.add((sl.get("spec") or {}).get("gpuProduct") or None)
            offers.append(offers_from(st.get("storageClasses")))
            _add_quantities(granted, st.get("granted"))
            _add_quantities(requested, (sl.get("spec") or {}).get("resources"))
        product = next(iter(products)) if len(products) == 1 else None
        labels = filter_node_labels(self._supplied_labels(), self.node_label_allow).kept
        return Grant(granted, product, labels, accepted, merge_offers(offers), requested)

    async def health(self) -> Health:
        """Whether the provider's API answers (reused for `health_ttl_s`: every pool node asks)."""
        now = time.monotonic()
        if self._health is not None and now - self._health[0] < self.health_ttl_s:
            return self._health[1]
        try:
            await rest.request(self.remote, "GET", "/version", what="provider health")
            health = Health(True, "KubeletReady", f"provider {self.provider} answers")
        except KubeError as e:
            health = Health(False, "ProviderUnreachable", f"the provider's API does not answer: {str(e)[:300]}")
        self._health = (time.monotonic(), health)
        return health
