"""The consumer's own storage (consumer side, in the controller): claims of gpufed's virtual
StorageClass whose first pod stays on a local node are bound locally, and pods their claims keep
local are told so.

Owns:
- `LocalClaims`: watches the consumer's claims that kube-controller-manager handed to gpufed's
  provisioner (annotation `volume.kubernetes.io/storage-provisioner: storage.gpufed.io`), gpufed's
  shadow claims, PersistentVolumes, StorageClasses and nodes. A claim whose selected node (written
  by kube-scheduler for its first pod) is a local node, not a virtual one, is bound with the
  consumer's local StorageClass (`LocalStorageSettings.local_class`, else the cluster's default class
  that is not gpufed's):
  - a class of static volumes (`kubernetes.io/no-provisioner`): the volume kube-scheduler's binder
    would pick (`forge.localclaims.pick_volume`) gets the claim as its `claimRef`, at the volume's
    resourceVersion (a volume taken meanwhile is a conflict: picked again);
  - a dynamic class: a shadow claim `gpufed-local-<uid>` of that class, with the same selected node,
    is handed to that class's provisioner; once bound, its volume's `claimRef` is moved to the
    user's claim (the volume is never Released in between, so its reclaim policy never fires) and
    the shadow is deleted. The shadow is owned by the user's claim: deleting the claim first takes
    the shadow, and its volume, with it.
  The consumer's kube-controller-manager then binds the claim to the volume, and kube-scheduler
  binds the waiting pod. From then on the volume is this cluster's, with its class's reclaim
  policy; data gravity keeps every later pod of the claim local (the offloading webhook pins them).
  Outcomes are Events on the claim: Normal `BoundLocally`, Warning `NoLocalStorageClass` (no class
  to bind with) or `NoLocalVolume` (no static volume fits on that node); both are tried again when
  classes or volumes change.
- `KeptLocalReporter`: pods the offloading webhook labelled `gpufed.io/kept-local` (claims bound to
  this cluster's own storage, in an offloaded namespace) get one Event each, `KeptLocal`, saying why
  they are not offloaded (Warning when the namespace's pods run remotely only: it stays Pending).

Does not: bind claims placed on virtual nodes (each provider's virtual kubelet,
`vkprovider.remote.volumes`), choose nodes (kube-scheduler), or decide which pods are kept local
(the offloading webhook, `forge.offloading.claim_pin`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from gpufed.apis.wire import (
    DEFAULT_STORAGE_CLASS_ANNOTATION,
    KEPT_LOCAL_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ORIGIN_UID_LABEL,
    STATIC_PROVISIONER,
    STORAGE_PROVISIONER,
    TYPE_LABEL,
    VIRTUAL_NODE_TYPE,
)
from gpufed.kube import events, meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from vkprovider.forge.claims import SELECTED_NODE_ANNOTATION, claim_names, provisioner, selected_node
from vkprovider.forge.localclaims import SHADOW_PREFIX, claim_ref, pick_volume, shadow_claim

COMPONENT = "gpufed-controller"
BOUND_LOCALLY = "BoundLocally"
NO_LOCAL_CLASS = "NoLocalStorageClass"
NO_LOCAL_VOLUME = "NoLocalVolume"
KEPT_LOCAL = "KeptLocal"
#: Pods reported, remembered by UID up to this many (then forgotten all at once: a pod reported
#: twice gets its Event's count raised, nothing worse).
MAX_REPORTED = 10_000


@dataclass(frozen=True)
class LocalStorageSettings:
    #: The consumer's StorageClass for claims of the virtual class bound locally (None: the
    #: cluster's default class, when it is not gpufed's own).
    local_class: str | None = None
    #: Seconds before a claim waiting for something not watched here is looked at again.
    retry_s: float = 10.0


def _is_shadow(claim: Mapping[str, Any]) -> bool:
    return meta.name(claim).startswith(SHADOW_PREFIX) and meta.labels(claim).get(MANAGED_BY_LABEL) == MANAGED_BY


def _slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": meta.name(node), "labels": dict(meta.labels(node))}}


class LocalClaims:
    """Binds claims of the virtual class whose first pod stays local (see the module docstring)."""

    def __init__(self, api: Any, settings: LocalStorageSettings | None = None) -> None:
        self.api = api
        self.settings = settings or LocalStorageSettings()
        #: (namespace, name) -> a claim handed to gpufed's provisioner
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        #: UID of the user's claim -> its shadow claim
        self.shadows: dict[str, dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.classes: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue("local-claims", max_delay=60.0)
        #: claims that wait for a class or a volume: looked at again when those change
        self._waiting: set[tuple[str, str]] = set()
        #: (claim UID, reason) already said in an Event
        self._said: set[tuple[str, str]] = set()
        self._log = structlog.get_logger().bind(component="local-claims")

    # ---- caches

    def on_claim(self, event: str, claim: dict[str, Any]) -> None:
        if _is_shadow(claim):
            origin = meta.labels(claim).get(ORIGIN_UID_LABEL, "")
            if event == "DELETED":
                if meta.uid(self.shadows.get(origin)) == meta.uid(claim):
                    self.shadows.pop(origin, None)
            else:
                self.shadows[origin] = claim
            self._requeue_uid(origin)
            return
        key = (meta.namespace(claim), meta.name(claim))
        if event == "DELETED" or provisioner(claim) != STORAGE_PROVISIONER:
            if self.claims.pop(key, None) is not None:
                self._said = {s for s in self._said if s[0] != meta.uid(claim)}
            self._waiting.discard(key)
            return
        self.claims[key] = claim
        self.queue.add(key)

    def on_volume(self, event: str, volume: dict[str, Any]) -> None:
        name = meta.name(volume)
        if event == "DELETED":
            self.volumes.pop(name, None)
        else:
            self.volumes[name] = volume
        self._requeue_waiting()

    def on_class(self, event: str, cls: dict[str, Any]) -> None:
        if event == "DELETED":
            self.classes.pop(meta.name(cls), None)
        else:
            self.classes[meta.name(cls)] = cls
        self._requeue_waiting()

    def on_node(self, event: str, node: dict[str, Any]) -> None:
        if event == "DELETED":
            self.nodes.pop(meta.name(node), None)
        else:
            self.nodes[meta.name(node)] = _slim_node(node)

    def _requeue_uid(self, uid: str) -> None:
        for key, claim in self.claims.items():
            if meta.uid(claim) == uid:
                self.queue.add(key)

    def _requeue_waiting(self) -> None:
        for key in sorted(self._waiting):
            self.queue.add(key)
        self._waiting.clear()

    # ---- decisions

    def local_class(self) -> dict[str, Any] | None:
        """The StorageClass local claims are bound with (see `LocalStorageSettings.local_class`)."""
        if self.settings.local_class:
            return self.classes.get(self.settings.local_class)
        defaults = sorted(
            (c for c in self.classes.values() if c.get("provisioner") != STORAGE_PROVISIONER and _is_default(c)),
            key=meta.name,
        )
        return defaults[0] if defaults else None

    async def handle(self, key: tuple[str, str]) -> float | None:
        claim = self.claims.get(key)
        if claim is None:
            return None
        uid = meta.uid(claim)
        shadow = self.shadows.get(uid)
        if meta.is_deleting(claim) or (claim.get("spec") or {}).get("volumeName"):
            if shadow is not None and (claim.get("spec") or {}).get("volumeName"):
                await self._delete_shadow(shadow)
            return None
        node_name = selected_node(claim)
        if not node_name:
            return None
        if any(_holder(v) == uid for v in self.volumes.values()):
            # handed over already: kube-controller-manager binds the claim to it
            if shadow is not None:
                await self._delete_shadow(shadow)
            return None
        node = self.nodes.get(node_name)
        if node is None:
            return self.settings.retry_s
        if meta.labels(node).get(TYPE_LABEL) == VIRTUAL_NODE_TYPE:
            if shadow is not None:
                await self._delete_shadow(shadow)  # its pod went to a virtual node after all
            return None
        if shadow is not None and meta.annotations(shadow).get(SELECTED_NODE_ANNOTATION) != node_name:
            await self._delete_shadow(shadow)  # kube-scheduler chose another node meanwhile
            return self.settings.retry_s
        cls = self.local_class()
        if cls is None:
            wanted = self.settings.local_class
            await self._wait(
                key,
                claim,
                NO_LOCAL_CLASS,
                f"the claim's first pod was scheduled to local node {node_name}, and "
                + (
                    f"StorageClass {wanted} (gpufed controller --local-storage-class) does not exist"
                    if wanted
                    else "this cluster has no default StorageClass for local claims "
                    "(set one, or name one with gpufed controller --local-storage-class)"
                ),
            )
            return None
        if cls.get("provisioner") == STATIC_PROVISIONER:
            return await self._bind_static(key, claim, node, meta.name(cls))
        return await self._bind_dynamic(key, claim, shadow, node_name, meta.name(cls))

    async def _bind_static(
        self, key: tuple[str, str], claim: dict[str, Any], node: Mapping[str, Any], class_name: str
    ) -> float | None:
        volume = pick_volume(claim, self.volumes.values(), node, class_name)
        if volume is None:
            await self._wait(
                key,
                claim,
                NO_LOCAL_VOLUME,
                f"no volume of StorageClass {class_name} on local node {meta.name(node)} is free, large enough "
                "and offers the claim's access modes",
            )
            return None
        if not await self._hand_over(volume, claim):
            return 1.0
        await self._bound(claim, meta.name(volume), class_name, meta.name(node))
        return None

    async def _bind_dynamic(
        self,
        key: tuple[str, str],
        claim: dict[str, Any],
        shadow: dict[str, Any] | None,
        node_name: str,
        class_name: str,
    ) -> float | None:
        if shadow is None:
            body = shadow_claim(claim, class_name, node_name)
            try:
                await rest.create(
                    self.api, rest.path("v1", "persistentvolumeclaims", namespace=meta.namespace(claim)), body
                )
            except KubeError as e:
                if not e.conflict:
                    raise
            self._log.info("shadow claim created", namespace=meta.namespace(claim), claim=meta.name(claim))
            return None  # its binding arrives as an event
        volume = self.volumes.get(str((shadow.get("spec") or {}).get("volumeName") or ""))
        if volume is None or _holder(volume) != meta.uid(shadow):
            # the shadow's volume may reach this cache after the shadow's binding: a volume event
            # looks at the claim again
            self._waiting.add(key)
            return None
        if not await self._hand_over(volume, claim):
            return 1.0
        await self._delete_shadow(shadow)
        await self._bound(claim, meta.name(volume), class_name, node_name)
        return None

    async def _hand_over(self, volume: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
        """Point `volume` at `claim`, at the volume's resourceVersion; False on a conflict."""
        patch = {"metadata": {"resourceVersion": meta.resource_version(volume)}, "spec": {"claimRef": claim_ref(claim)}}
        try:
            await rest.merge_patch(self.api, rest.path("v1", "persistentvolumes", meta.name(volume)), patch)
        except KubeError as e:
            if e.conflict:
                return False
            raise
        return True

    async def _delete_shadow(self, shadow: Mapping[str, Any]) -> None:
        path = rest.path("v1", "persistentvolumeclaims", meta.name(shadow), namespace=meta.namespace(shadow))
        with contextlib.suppress(KubeError):
            await rest.delete(self.api, path, uid=meta.uid(shadow))

    async def _bound(self, claim: Mapping[str, Any], volume: str, class_name: str, node: str) -> None:
        self._log.info("claim bound locally", namespace=meta.namespace(claim), claim=meta.name(claim), volume=volume)
        await self._event(
            claim,
            "Normal",
            BOUND_LOCALLY,
            f"bound to this cluster's volume {volume} (StorageClass {class_name}): its first pod was scheduled "
            f"to local node {node}; later pods mounting it stay on local nodes",
        )

    async def _wait(self, key: tuple[str, str], claim: Mapping[str, Any], reason: str, message: str) -> None:
        """The claim waits for a class or a volume; said once per claim and reason."""
        self._waiting.add(key)
        if (meta.uid(claim), reason) in self._said:
            return
        self._said.add((meta.uid(claim), reason))
        await self._event(claim, "Warning", reason, message)

    async def _event(self, claim: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        obj = {**claim, "apiVersion": "v1", "kind": "PersistentVolumeClaim"}
        await events.emit(self.api, obj, type_=type_, reason=reason, message=message, component=COMPONENT)

    # ---- loop

    async def run(self) -> None:
        """Watch and reconcile until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(watch(self.api, "/api/v1/persistentvolumeclaims", self.on_claim, what="claims"))
            tg.create_task(watch(self.api, "/api/v1/persistentvolumes", self.on_volume, what="volumes"))
            tg.create_task(
                watch(self.api, "/apis/storage.k8s.io/v1/storageclasses", self.on_class, what="storage classes")
            )
            tg.create_task(watch(self.api, "/api/v1/nodes", self.on_node, what="nodes"))
            tg.create_task(self.queue.run(self.handle, workers=2))


def _holder(volume: Mapping[str, Any]) -> str:
    """UID of the claim a volume is bound or handed to ("" : none)."""
    return str(((volume.get("spec") or {}).get("claimRef") or {}).get("uid") or "")


def _is_default(cls: Mapping[str, Any]) -> bool:
    return str(meta.annotations(cls).get(DEFAULT_STORAGE_CLASS_ANNOTATION, "")).lower() == "true"


class KeptLocalReporter:
    """One Event per pod that its claims keep local (see the module docstring)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.queue: WorkQueue[tuple[str, str, str]] = WorkQueue("kept-local", max_delay=60.0)
        self.pods: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._reported: set[str] = set()

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        key = (meta.namespace(pod), meta.name(pod), meta.uid(pod))
        if event == "DELETED":
            self.pods.pop(key, None)
            self._reported.discard(key[2])
            return
        if key[2] in self._reported or key in self.pods:
            return
        self.pods[key] = pod
        self.queue.add(key)

    async def handle(self, key: tuple[str, str, str]) -> float | None:
        pod = self.pods.pop(key, None)
        if pod is None or key[2] in self._reported:
            return None
        pending = meta.labels(pod).get(KEPT_LOCAL_LABEL) == "pending"
        message = (
            f"not offloaded: its claims ({', '.join(claim_names(pod)) or 'none'}) keep their data in this "
            "cluster's own storage, so it runs on local nodes only"
        )
        if pending:
            message += "; this namespace's pods run remotely only (podOffloadingStrategy Remote): it stays Pending"
        await events.emit(
            self.api,
            {**pod, "apiVersion": "v1", "kind": "Pod"},
            type_="Warning" if pending else "Normal",
            reason=KEPT_LOCAL,
            message=message,
            component=COMPONENT,
        )
        if len(self._reported) >= MAX_REPORTED:
            self._reported.clear()
        self._reported.add(key[2])
        return None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                watch(
                    self.api,
                    "/api/v1/pods",
                    self.on_pod,
                    what="pods kept local by their claims",
                    params={"labelSelector": KEPT_LOCAL_LABEL},
                )
            )
            tg.create_task(self.queue.run(self.handle, workers=2))


__all__ = [
    "BOUND_LOCALLY",
    "KEPT_LOCAL",
    "NO_LOCAL_CLASS",
    "NO_LOCAL_VOLUME",
    "KeptLocalReporter",
    "LocalClaims",
    "LocalStorageSettings",
]
