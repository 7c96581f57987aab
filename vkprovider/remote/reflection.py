"""Reflection: the objects around offloaded pods, kept in sync between an offloaded consumer
namespace and its twin namespace on one provider.

Owns, for one (consumer, provider):
- one reflector per kind (ConfigMap, Secret, Service, EndpointSlice, Ingress; `KINDS`), started
  for a namespace when its twin namespace is Ready and stopped when it goes (`start_namespace`,
  `stop_namespace`; the RemoteProvider calls them from its TwinNamespace watch);
- per namespace and kind a list+watch of the local objects and of the remote copies (all objects of
  the kind in the twin namespace, so a pre-existing object gpufed did not create is seen and left
  alone), the consumer Namespace (its allow-list annotation), and the provider's IngressClasses;
- a work queue keyed by (kind, namespace, name): each key is reconciled level-triggered from the
  two caches: the forge function (`vkprovider.forge.reflection`) says what the remote copy should be
  (None: it must not exist), and the reconciler creates/updates it with server-side apply, deletes
  an owned copy (UID precondition), or leaves an unowned object untouched and reports the
  collision as a Warning Event on the local object;
- drift: a changed remote copy comes back through the remote watch and is re-applied; every
  `resync_s` all keys are reconciled again; a relist after a reconnect (the watch's SYNC events)
  enqueues every key it delivers;
- status per namespace: Events on the namespace's NamespaceOffloading (`Reflecting` when its
  reflectors have synced, `ReflectionFailed` when a watch or a write keeps failing).

Directions: everything here goes consumer -> provider. The provider -> consumer direction needs
no writer: offloaded pods report their (translated) IPs and readiness in their local status, so the
consumer's own EndpointSlice controller lists them in the Service's slices, next to local pods;
remote twins' Events reach local pods through RemoteProvider.

Does not: copy what a pod needs before its twin is created (RemoteProvider does that on demand,
with the same forge functions), issue service-account tokens (remote.tokens), or delete remote
copies when a namespace is unoffloaded (its twin namespace is deleted with everything in it).
Several virtual kubelets of one provider each run a Reflection; their writes are identical
server-side applies with one field manager, so they converge rather than fight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import NAMESPACE_OFFLOADING
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from vkprovider.forge import reflection as forge
from vkprovider.forge.meta import Target
from vkprovider.forge.tokens import TOKEN_FOR_POD_LABEL
from vkprovider.remote.translate import Identity, IPTranslator

COMPONENT = "gpufed-reflection"
#: Seconds between full resyncs of every reflected key.
DEFAULT_RESYNC_S = 300.0
#: Concurrent reconciles per provider (all kinds and namespaces share them).
DEFAULT_WORKERS = 8
#: Seconds before a watch that failed with a non-transient error (e.g. 403 while the provider is
#: still binding the twin namespace) is tried again.
WATCH_RETRY_S = 2.0
DEFAULT_CLASS_ANNOTATION = "ingressclass.kubernetes.io/is-default-class"

Key = tuple[str, str, str]  # (kind, local namespace, name)


KINDS = forge.KINDS
CONFIG_MAP, SECRET, SERVICE, ENDPOINT_SLICE, INGRESS = (
    forge.CONFIG_MAP,
    forge.SECRET,
    forge.SERVICE,
    forge.ENDPOINT_SLICE,
    forge.INGRESS,
)
Kind = forge.Kind


@dataclass(frozen=True)
class ReflectionSettings:
    #: This (consumer) cluster's ClusterID.
    consumer: str
    #: The provider's ClusterID.
    provider: str
    resync_s: float = DEFAULT_RESYNC_S
    workers: int = DEFAULT_WORKERS


@dataclass
class _Namespace:
    twin: str
    annotations: dict[str, str]
    task: asyncio.Task[None] | None = None
    #: Watches ("namespace", "local-<Kind>", "remote-<Kind>") whose first list has been delivered.
    synced: set[str] = field(default_factory=set)
    announced: bool = False

    def ready(self) -> bool:
        return len(self.synced) >= 2 * len(KINDS) + 1


class Reflection:
    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        settings: ReflectionSettings,
        translator: IPTranslator | None = None,
    ) -> None:
        self.local = local_api
        self.remote = remote_api
        self.settings = settings
        self.translator: IPTranslator = translator or Identity()
        self.ready = asyncio.Event()
        self._ns: dict[str, _Namespace] = {}
        self._local: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k.kind: {} for k in KINDS}
        self._remote: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k.kind: {} for k in KINDS}
        self._classes: dict[str, dict[str, Any]] = {}
        self._classes_known = False
        self._queue: WorkQueue[Key] = WorkQueue(f"reflection-{settings.provider}")
        #: Per local object UID (or "ns/<namespace>" for namespace-wide reports): what was already
        #: reported, so a resync or a retrying watch does not repeat an Event. Dropped with the object.
        self._reported: dict[str, set[str]] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._pending: dict[str, str] = {}
        self._log = structlog.get_logger().bind(remote_cluster=settings.provider)
        #: Applies and deletes done (tests read it to prove that nothing was written).
        self.writes = 0

    # ---- lifecycle

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for local_ns, twin in self._pending.items():
                self._start(local_ns, twin)
            self._pending.clear()
            tg.create_task(self._queue.run(self._reconcile, workers=self.settings.workers))
            tg.create_task(
                self._watch_forever(
                    self.remote,
                    "/apis/networking.k8s.io/v1/ingressclasses",
                    self._on_class,
                    "provider ingressclasses",
                    self._classes_synced,
                )
            )
            tg.create_task(self._resync_loop())
            self.ready.set()

    def start_namespace(self, local_ns: str, twin_ns: str) -> None:
        """Reflect `local_ns` into `twin_ns` (idempotent; a new twin restarts the reflectors)."""
        current = self._ns.get(local_ns)
        if current is not None and current.twin == twin_ns:
            return
        self.stop_namespace(local_ns)
        if self._tg is None:
            self._pending[local_ns] = twin_ns
            return
        self._start(local_ns, twin_ns)

    def stop_namespace(self, local_ns: str) -> None:
        """Stop reflecting `local_ns`; its remote copies go with the twin namespace."""
        self._pending.pop(local_ns, None)
        state = self._ns.pop(local_ns, None)
        if state is None:
            return
        if state.task is not None:
            state.task.cancel()
        for cache in (*self._local.values(), *self._remote.values()):
            for key in [k for k in cache if k[0] == local_ns]:
                obj = cache.pop(key)
                self._reported.pop(str(obj["metadata"].get("uid")), None)
        self._reported.pop(f"ns/{local_ns}", None)
        self._log.info("reflection stopped", namespace=local_ns)

    def namespace_annotations(self, local_ns: str) -> Mapping[str, str]:
        """The annotations of a reflected namespace as last seen (policy input); empty when unknown."""
        state = self._ns.get(local_ns)
        return state.annotations if state is not None else {}

    def namespaces(self) -> dict[str, str]:
        """Reflected local namespace -> twin namespace."""
        return {ns: s.twin for ns, s in self._ns.items()}

    def _start(self, local_ns: str, twin_ns: str) -> None:
        assert self._tg is not None
        state = _Namespace(twin_ns, {})
        self._ns[local_ns] = state
        state.task = self._tg.create_task(self._watch_namespace(local_ns, state))
        self._log.info("reflection started", namespace=local_ns, twin=twin_ns)

    # ---- watches

    async def _watch_forever(
        self,
        api: Any,
        path: str,
        on_event: Callable[[str, dict[str, Any]], None],
        what: str,
        on_synced: Callable[[], None] | None,
        params: Mapping[str, str] | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        while True:
            try:
                await watch(api, path, on_event, what=what, params=params, on_synced=on_synced)
            except KubeError as e:
                self._log.warning("reflection watch failed; retrying", what=what, error=str(e))
                if report is not None:
                    report(f"cannot watch {what}: {e}")
                await asyncio.sleep(WATCH_RETRY_S)

    async def _watch_namespace(self, local_ns: str, state: _Namespace) -> None:
        def synced(side: str) -> Callable[[], None]:
            def cb() -> None:
                state.synced.add(side)
                if state.ready() and not state.announced:
                    state.announced = True
                    self._announce(local_ns, state)

            return cb

        def report(message: str) -> None:
            seen = self._reported.setdefault(f"ns/{local_ns}", set())
            if message not in seen:  # a failing watch retries every few seconds
                seen.add(message)
                self._status_event(local_ns, "Warning", "ReflectionFailed", message)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                self._watch_forever(
                    self.local,
                    "/api/v1/namespaces",
                    lambda t, o: self._on_namespace(local_ns, t, o),
                    f"namespace {local_ns}",
                    synced("namespace"),
                    {"fieldSelector": f"metadata.name={local_ns}"},
                    report,
                )
            )
            for kind in KINDS:
                tg.create_task(
                    self._watch_forever(
                        self.local,
                        kind.path(local_ns),
                        self._local_handler(kind, local_ns),
                        f"local {kind.plural} in {local_ns}",
                        synced(f"local-{kind.kind}"),
                        report=report,
                    )
                )
                tg.create_task(
                    self._watch_forever(
                        self.remote,
                        kind.path(state.twin),
                        self._remote_handler(kind, local_ns, state),
                        f"remote {kind.plural} in {state.twin}",
                        synced(f"remote-{kind.kind}"),
                        report=report,
                    )
                )

    def _local_handler(self, kind: Kind, local_ns: str) -> Callable[[str, dict[str, Any]], None]:
        cache = self._local[kind.kind]

        def handle(t: str, obj: dict[str, Any]) -> None:
            if local_ns not in self._ns:
                return
            name = obj["metadata"]["name"]
            if t == "DELETED":
                cache.pop((local_ns, name), None)
                self._reported.pop(str(obj["metadata"].get("uid")), None)
            else:
                obj.setdefault("kind", kind.kind)
                obj.setdefault("apiVersion", kind.api_version)
                cache[(local_ns, name)] = obj
            self._queue.add((kind.kind, local_ns, name))
            if kind is SERVICE:  # a Service's reflection decides whether its slices are reflected
                for slice_ns, slice_name in self._slices_of(local_ns, name):
                    self._queue.add((ENDPOINT_SLICE.kind, slice_ns, slice_name))

        return handle

    def _remote_handler(self, kind: Kind, local_ns: str, state: _Namespace) -> Callable[[str, dict[str, Any]], None]:
        cache = self._remote[kind.kind]

        def handle(t: str, obj: dict[str, Any]) -> None:
            if self._ns.get(local_ns) is not state:
                return
            labels = obj["metadata"].get("labels") or {}
            if TOKEN_FOR_POD_LABEL in labels:
                return  # remote.tokens' Secrets have no local counterpart
            name = obj["metadata"]["name"]
            if t == "DELETED":
                cache.pop((local_ns, name), None)
            else:
                cache[(local_ns, name)] = obj
            self._queue.add((kind.kind, local_ns, name))

        return handle

    def _on_namespace(self, local_ns: str, t: str, obj: dict[str, Any]) -> None:
        state = self._ns.get(local_ns)
        if state is None or t == "DELETED":
            return
        annotations = dict(obj["metadata"].get("annotations") or {})
        if annotations != state.annotations:
            state.annotations = annotations
            self._enqueue_namespace(local_ns)

    def _on_class(self, t: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if t == "DELETED":
            self._classes.pop(name, None)
        else:
            self._classes[name] = obj
        if self._classes_known:
            self._enqueue_ingresses()

    def _classes_synced(self) -> None:
        self._classes_known = True
        self._enqueue_ingresses()

    def _enqueue_ingresses(self) -> None:
        for ns, ingress in list(self._local[INGRESS.kind]):
            self._queue.add((INGRESS.kind, ns, ingress))

    def _enqueue_namespace(self, local_ns: str) -> None:
        for kind in KINDS:
            names = {n for ns, n in self._local[kind.kind] if ns == local_ns}
            names |= {n for ns, n in self._remote[kind.kind] if ns == local_ns}
            for name in names:
                self._queue.add((kind.kind, local_ns, name))

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_s)
            for ns in list(self._ns):
                self._enqueue_namespace(ns)

    def _slices_of(self, local_ns: str, service: str) -> list[tuple[str, str]]:
        return [
            key
            for key, obj in self._local[ENDPOINT_SLICE.kind].items()
            if key[0] == local_ns and (obj["metadata"].get("labels") or {}).get(forge.SERVICE_NAME_LABEL) == service
        ]

    # ---- reconcile

    def _reflected_service(self, local_ns: str, slice_: Mapping[str, Any], state: _Namespace) -> set[str]:
        """The slice's Service when it is reflected (it exists locally and the policy allows it)."""
        service = str((slice_["metadata"].get("labels") or {}).get(forge.SERVICE_NAME_LABEL) or "")
        svc = self._local[SERVICE.kind].get((local_ns, service))
        return {service} if svc is not None and forge.policy(svc, state.annotations).reflect else set()

    def _default_class(self) -> str | None:
        for name, obj in sorted(self._classes.items()):
            if (obj["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true":
                return name
        return None

    def _want(
        self, kind: Kind, local: Mapping[str, Any], local_ns: str, state: _Namespace
    ) -> tuple[dict[str, Any] | None, str, str]:
        """The remote copy `local` should have (None: none), and why not when None."""
        decision = forge.policy(local, state.annotations)
        if not decision.reflect:
            return None, decision.reason, decision.message
        target = Target(self.settings.consumer, "", state.twin, self.settings.provider)
        if kind is CONFIG_MAP:
            return forge.remote_config_map(local, target), "", ""
        if kind is SECRET:
            return forge.remote_secret(local, target), "", ""
        if kind is SERVICE:
            return forge.remote_service(local, target), "", ""
        if kind is ENDPOINT_SLICE:
            services = self._reflected_service(local_ns, local, state)
            return forge.remote_endpoint_slice(local, target, self.translator.to_remote_ip, services), "", ""
        if not self._classes_known:
            return None, "", ""  # not yet known: nothing to decide (the class watch enqueues again)
        outcome = forge.remote_ingress(local, target, set(self._classes), self._default_class())
        return outcome.body, outcome.reason, outcome.message

    async def _reconcile(self, key: Key) -> float | None:
        kind_name, local_ns, name = key
        kind = forge.KINDS_BY_NAME[kind_name]
        state = self._ns.get(local_ns)
        if state is None:
            return None
        if not state.ready():
            return 0.2  # both caches listed first: never create over an object not yet seen
        local = self._local[kind.kind].get((local_ns, name))
        remote = self._remote[kind.kind].get((local_ns, name))
        want, reason, message = self._want(kind, local, local_ns, state) if local is not None else (None, "", "")
        url = kind.path(state.twin, name)
        if remote is not None and not forge.reflection_owned(remote, self.settings.consumer):
            if want is not None and local is not None:
                await self._collision(kind, local, remote, state)
            return None
        if want is None:
            if local is not None and reason == "IngressClassMissing":
                await self._report_once(local, reason, message, reason)
            if remote is not None:
                await self._delete(kind, remote, url)
            return None
        assert local is not None  # a wanted copy always has its local object
        if remote is not None and not forge.needs_apply(want, remote):
            return None
        if remote is not None and forge.needs_recreate(want, remote):
            await self._delete(kind, remote, url)  # e.g. an immutable ConfigMap changed: apply cannot
        try:
            applied = await rest.apply(self.remote, url, want, what=f"reflect {kind.kind} {local_ns}/{name}")
        except KubeError as e:
            if e.transient:
                raise
            await self._report_once(
                local, "ReflectionFailed", f"cannot reflect to {self.settings.provider}: {e}", f"{e.status}:{e}"
            )
            raise
        self.writes += 1
        self._remote[kind.kind][(local_ns, name)] = applied
        return None

    async def _delete(self, kind: Kind, remote: Mapping[str, Any], url: str) -> None:
        meta = remote["metadata"]
        try:
            await rest.delete(self.remote, url, uid=meta.get("uid"), what=f"unreflect {kind.kind} {meta['name']}")
        except KubeError as e:
            if not e.conflict:  # conflict: the UID precondition failed, that copy is gone already
                raise
        self.writes += 1

    async def _collision(
        self, kind: Kind, local: Mapping[str, Any], remote: Mapping[str, Any], state: _Namespace
    ) -> None:
        message = (
            f"{kind.kind} {state.twin}/{remote['metadata']['name']} on {self.settings.provider} was not created "
            "by gpufed: it is left untouched and this object is not reflected"
        )
        await self._report_once(local, "ReflectionCollision", message, str(remote["metadata"].get("uid")))

    async def _report_once(self, local: Mapping[str, Any], reason: str, message: str, token: str) -> None:
        seen = self._reported.setdefault(str(local["metadata"].get("uid")), set())
        if f"{reason}/{token}" in seen:
            return
        seen.add(f"{reason}/{token}")
        self._log.warning(
            "reflection refused",
            kind=local.get("kind"),
            name=local["metadata"].get("name"),
            namespace=local["metadata"].get("namespace"),
            reason=reason,
        )
        await events.emit(self.local, local, type_="Warning", reason=reason, message=message, component=COMPONENT)

    # ---- status

    def _announce(self, local_ns: str, state: _Namespace) -> None:
        counts = ", ".join(f"{sum(1 for ns, _ in self._local[k.kind] if ns == local_ns)} {k.plural}" for k in KINDS)
        mode = "allow-list" if state.annotations.get(forge.ALLOW_ANNOTATION, "").lower() == "true" else "all"
        self._enqueue_namespace(local_ns)
        self._status_event(
            local_ns,
            "Normal",
            "Reflecting",
            f"reflecting into {state.twin} on {self.settings.provider} ({mode}; local objects: {counts})",
        )

    def _status_event(self, local_ns: str, type_: str, reason: str, message: str) -> None:
        if self._tg is None:
            return
        meta: dict[str, Any] = {"namespace": local_ns, "name": NAMESPACE_OFFLOADING}
        obj = {"apiVersion": API_VERSION, "kind": "NamespaceOffloading", "metadata": meta}

        async def send() -> None:
            with contextlib.suppress(KubeError):
                got = await rest.get(
                    self.local, rest.path(API_VERSION, "namespaceoffloadings", NAMESPACE_OFFLOADING, namespace=local_ns)
                )
                if got is not None:
                    meta["uid"] = got["metadata"].get("uid")
            await events.emit(self.local, obj, type_=type_, reason=reason, message=message, component=COMPONENT)

        self._tg.create_task(send())


__all__ = ["KINDS", "Kind", "Reflection", "ReflectionSettings"]
