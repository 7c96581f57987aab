"""The storage provisioner of one provider: consumer claims of gpufed's virtual StorageClass bound in
the provider's twin namespace, and the consumer's virtual PersistentVolumes for them.

Owns, for one (consumer, provider):
- a watch of the consumer's PersistentVolumeClaims (all namespaces; only those the consumer's
  kube-controller-manager hands to gpufed's provisioner are held: annotation
  `volume.kubernetes.io/storage-provisioner: storage.gpufed.io`, whatever the class is named) and of
  the consumer's PersistentVolumes labelled with this provider;
- provisioning, per claim (a work queue keyed by namespace and name): a claim of the virtual class,
  not yet bound, whose selected node (the consumer's kube-scheduler writes it for the claim's first
  pod) is one of this provider's virtual nodes, is created in the twin namespace with the offered
  class `forge.claims.choose_offer` picks (the provider's API server enforces its quota and claims
  policy), then the virtual PersistentVolume is created on the consumer, bound to the claim by the
  consumer's kube-controller-manager. Each outcome is an Event on the claim: Normal `Provisioned`,
  Warning `ProvisioningFailed` (a refusal by the provider, with its words; tried again with backoff)
  or Warning `StorageNotOffered`/`AccessModeNotOffered` (tried again when the claim or the grant
  changes). A claim whose namespace has no twin namespace here yet is looked at again every
  `retry_s`. A bound claim being deleted while pods still use it (Kubernetes'
  `kubernetes.io/pvc-protection` keeps it) gets one Warning `ClaimInUse` saying what happens to its
  data on the provider;
- reclaim, per virtual volume: once its claim is gone (the volume Released), the provider's claim is
  deleted when the policy is Delete (only a claim labelled as this consumer's copy of that very
  claim: origin UID), then the volume; with Retain both stay for the operator;
- mirror, per bound virtual volume (on each change, and every `resync_s`, every `retry_s` while the
  provider's claim is not Bound yet): the volume shows the provider's claim
  (`forge.claims.mirror_volume`): its phase (annotation `gpufed.io/remote-phase`;
  `Missing` when the claim is gone) and, once it is Bound, the capacity and access modes of the
  provider's volume (`spec.capacity`, `spec.accessModes`, both mutable on a PersistentVolume; never
  fewer access modes, nor less capacity, than the consumer's claim asked). What the provider reports
  that cannot be mirrored (no quantity, an unknown mode or phase) is ignored and logged once per
  volume and field.

Construction takes the collaborators: both API clients, the identities, this provider's virtual node
names and twin namespaces (callables: the RemoteProvider knows them), the classes the provider
offers (from the grant), the bounded EventRelay, and the settings.

Does not: decide the claims policy or quota (the provider's API server does), mount anything (no
kubelet mounts a virtual volume: pods on virtual nodes only name the claim, which exists in the twin
namespace under the same name), or choose nodes (the consumer's kube-scheduler does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, STORAGE_PROVISIONER
from gpufed.kube import meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from vkprovider.forge.claims import (
    ClaimRefusedError,
    StorageOffer,
    choose_offer,
    mirror_volume,
    provisioner,
    remote_claim,
    remote_claim_ref,
    selected_node,
    virtual_volume,
    volume_name,
)
from vkprovider.forge.meta import Target, owned_by

PROVISIONED = "Provisioned"
#: Kubernetes' finalizer that keeps a claim while a pod uses it.
PVC_PROTECTION = "kubernetes.io/pvc-protection"
DELETION_HELD = "ClaimInUse"
PROVISIONING_FAILED = "ProvisioningFailed"


class EventSink(Protocol):
    """Where Events about consumer objects go (the bounded `EventRelay`)."""

    def offer(self, obj: Mapping[str, Any], *, type_: str, reason: str, message: str) -> bool: ...


@dataclass(frozen=True)
class VolumeSettings:
    #: What happens to the provider's claim when the consumer's claim goes (the class's reclaimPolicy).
    reclaim_policy: str = "Delete"
    #: Seconds between looks at a claim that waits (no twin namespace yet, a refusal).
    retry_s: float = 5.0
    #: Seconds between mirrors of the provider's claims (phase, size, access modes) onto the virtual volumes.
    resync_s: float = 30.0
    #: Seconds a deleted claim must stay held by Kubernetes' protection before it is said to wait for
    #: pods (an unused claim keeps the finalizer for a moment too, until the controller-manager looks).
    held_after_s: float = 2.0


class ClaimProvisioner:
    """Binds the virtual class's claims on this provider (see the module docstring)."""

    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        consumer: str,
        provider: str,
        nodes: Callable[[], set[str]],
        twin_namespace: Callable[[str], str | None],
        offers: Callable[[], tuple[StorageOffer, ...]],
        events: EventSink,
        settings: VolumeSettings | None = None,
    ) -> None:
        self.local = local_api
        self.remote = remote_api
        self.consumer = consumer
        self.provider = provider
        self.nodes = nodes
        self.twin_namespace = twin_namespace
        self.offers = offers
        self.events = events
        self.settings = settings or VolumeSettings()
        #: (namespace, name) -> the consumer's claim of the virtual class
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        #: name -> this provider's virtual volume
        self.volumes: dict[str, dict[str, Any]] = {}
        self.queue: WorkQueue[tuple[str, str, str]] = WorkQueue(f"volumes-{provider}", max_delay=60.0)
        #: claims refused for what the grant offers: tried again when it changes (`grant_changed`)
        self._refused: set[tuple[str, str]] = set()
        #: UIDs of claims being deleted while held: when that was first seen (monotonic), None once
        #: reported
        self._held: dict[str, float | None] = {}
        #: (volume, field): a field of a provider's claim that is not mirrored, logged once (whatever
        #: the provider writes there next, so that it cannot fill the log or this set)
        self._ignored: set[tuple[str, str]] = set()
        self._log = structlog.get_logger().bind(remote_cluster=provider, component="volumes")

    # ---- caches

    def on_claim(self, event: str, claim: dict[str, Any]) -> None:
        key = (meta.namespace(claim), meta.name(claim))
        if event == "DELETED" or provisioner(claim) != STORAGE_PROVISIONER:
            self.claims.pop(key, None)
            self._refused.discard(key)
            self._held.pop(meta.uid(claim), None)
            return
        self.claims[key] = claim
        self.queue.add(("claim", *key))

    def on_volume(self, event: str, volume: dict[str, Any]) -> None:
        name = meta.name(volume)
        if event == "DELETED" or meta.labels(volume).get(REMOTE_CLUSTER_LABEL) != self.provider:
            self.volumes.pop(name, None)
            self._ignored = {k for k in self._ignored if k[0] != name}
            return
        self.volumes[name] = volume
        self.queue.add(("volume", "", name))

    def grant_changed(self) -> None:
        """The offered classes may have changed: claims refused for them are looked at again."""
        for key in sorted(self._refused):
            self.queue.add(("claim", *key))
        self._refused.clear()

    # ---- reconcile

    async def handle(self, key: tuple[str, str, str]) -> float | None:
        kind, namespace, name = key
        if kind == "claim":
            return await self._claim(namespace, name)
        return await self._volume(name)

    async def _claim(self, namespace: str, name: str) -> float | None:
        claim = self.claims.get((namespace, name))
        if claim is None:
            return None
        bound_to = str((claim.get("spec") or {}).get("volumeName") or "")
        if meta.is_deleting(claim):
            if bound_to in self.volumes and PVC_PROTECTION in (claim["metadata"].get("finalizers") or []):
                return self._held_once(claim, bound_to)
            return None
        if bound_to:
            return None
        node = selected_node(claim)
        if not node or node not in self.nodes():
            return None  # not scheduled yet, or not here
        twin_ns = self.twin_namespace(namespace)
        if twin_ns is None:
            return self.settings.retry_s  # the twin namespace is not Ready yet
        try:
            offer = choose_offer(claim, self.offers(), self.provider)
        except ClaimRefusedError as e:
            self._refused.add((namespace, name))
            self._event(claim, "Warning", e.reason, str(e))
            return None
        target = Target(self.consumer, node, twin_ns, self.provider)
        uid = str(claim["metadata"].get("uid", ""))
        path = rest.path("v1", "persistentvolumeclaims", name, namespace=twin_ns)
        have = await rest.get(self.remote, path)
        if have is not None and not owned_by(have, self.consumer, uid):
            self._event(
                claim,
                "Warning",
                PROVISIONING_FAILED,
                f"provider {self.provider} already has a claim {twin_ns}/{name} that is not this claim's copy",
            )
            return self.settings.retry_s * 6
        if have is None:
            try:
                await rest.create(
                    self.remote,
                    rest.path("v1", "persistentvolumeclaims", namespace=twin_ns),
                    remote_claim(claim, target, offer),
                )
            except KubeError as e:
                if not e.conflict:
                    self._event(
                        claim, "Warning", PROVISIONING_FAILED, f"provider {self.provider} refused the claim: {e}"[:1000]
                    )
                    raise
        volume = virtual_volume(claim, self.provider, twin_ns, offer, self.settings.reclaim_policy)
        try:
            await rest.create(self.local, rest.path("v1", "persistentvolumes"), volume)
        except KubeError as e:
            if not e.conflict:
                raise
            return None
        self._event(
            claim,
            "Normal",
            PROVISIONED,
            f"bound on provider {self.provider} as {twin_ns}/{name} (StorageClass {offer.name}); "
            f"volume {volume_name(claim)}",
        )
        self._log.info("claim provisioned", namespace=namespace, claim=name, storage_class=offer.name)
        return None

    async def _volume(self, name: str) -> float | None:
        volume = self.volumes.get(name)
        if volume is None:
            return None
        ref = remote_claim_ref(volume)
        if ref is None:
            return None
        remote_ns, remote_name = ref
        spec = volume.get("spec") or {}
        claim_uid = str((spec.get("claimRef") or {}).get("uid") or "")
        path = rest.path("v1", "persistentvolumeclaims", remote_name, namespace=remote_ns)
        phase = str((volume.get("status") or {}).get("phase") or "")
        # The twin namespace is still followed: else it is gone (unoffloaded, unpeered), and the
        # provider's claim with it, or it is no longer this consumer's to touch.
        followed = self.twin_namespace(str((spec.get("claimRef") or {}).get("namespace") or "")) == remote_ns
        if phase == "Released" and spec.get("persistentVolumeReclaimPolicy") == "Delete":
            have = await rest.get(self.remote, path) if followed else None
            if have is not None and owned_by(have, self.consumer, claim_uid):
                await rest.delete(self.remote, path, uid=meta.uid(have))
                self._log.info("provider claim deleted", namespace=remote_ns, claim=remote_name)
            await rest.delete(self.local, rest.path("v1", "persistentvolumes", name), uid=meta.uid(volume))
            return None
        if phase != "Bound" or not followed:
            return None
        have = await rest.get(self.remote, path)
        ours = have if have is not None and owned_by(have, self.consumer, claim_uid) else None
        mirror = mirror_volume(volume, ours, self._bound_claim(spec.get("claimRef") or {}))
        for field, problem in mirror.ignored:
            self._ignored_once(name, remote_ns, remote_name, field, problem)
        if mirror.patch is not None:
            await rest.merge_patch(self.local, rest.path("v1", "persistentvolumes", name), mirror.patch)
            if "spec" in mirror.patch:
                self._log.info(
                    "virtual volume mirrors the provider's volume",
                    volume=name,
                    capacity=(mirror.patch["spec"].get("capacity") or {}).get("storage"),
                    access_modes=mirror.patch["spec"].get("accessModes"),
                )
        # Until the provider's claim is Bound (its size and modes known) it is looked at sooner.
        bound = ours is not None and (ours.get("status") or {}).get("phase") == "Bound"
        return self.settings.resync_s if bound else self.settings.retry_s

    def _bound_claim(self, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        """The consumer's claim a virtual volume's `claimRef` names (None: not at hand, or another
        claim of that name)."""
        claim = self.claims.get((str(ref.get("namespace") or ""), str(ref.get("name") or "")))
        return claim if claim is not None and ref.get("uid") and meta.uid(claim) == ref.get("uid") else None

    def _ignored_once(self, volume: str, remote_ns: str, remote_name: str, field: str, problem: str) -> None:
        """Log once per volume and field what the provider's claim reported that is not mirrored."""
        if (volume, field) in self._ignored:
            return
        self._ignored.add((volume, field))
        self._log.warning(
            "provider claim not mirrored",
            volume=volume,
            namespace=remote_ns,
            claim=remote_name,
            problem=problem,
        )

    def _held_once(self, claim: dict[str, Any], volume: str) -> float | None:
        """Say once that a claim being deleted waits for the pods that use it (Kubernetes' protection),
        once it has been held `held_after_s`; the seconds until then to look again, else None."""
        uid = meta.uid(claim)
        now = time.monotonic()
        since = self._held.setdefault(uid, now)
        if since is None:
            return None
        if now - since < self.settings.held_after_s:
            return self.settings.held_after_s - (now - since)
        self._held[uid] = None
        what = "deleted then" if self.settings.reclaim_policy == "Delete" else "kept (reclaim policy Retain)"
        self._event(
            claim,
            "Warning",
            DELETION_HELD,
            f"the claim is deleted once no pod uses it; its data on provider {self.provider} "
            f"(volume {volume}) is {what}",
        )
        return None

    def _event(self, claim: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.offer(
            {**claim, "apiVersion": "v1", "kind": "PersistentVolumeClaim"}, type_=type_, reason=reason, message=message
        )

    # ---- loop

    async def run(self) -> None:
        """Watch and reconcile until cancelled (raises `KubeError` when a watch cannot go on)."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                watch(self.local, "/api/v1/persistentvolumeclaims", self.on_claim, what="claims of the virtual class")
            )
            tg.create_task(
                watch(
                    self.local,
                    "/api/v1/persistentvolumes",
                    self.on_volume,
                    what=f"virtual volumes of {self.provider}",
                    params={"labelSelector": f"{REMOTE_CLUSTER_LABEL}={self.provider}"},
                )
            )
            tg.create_task(self.queue.run(self.handle, workers=2))
