"""Reflection: the objects around offloaded pods, kept in sync between an offloaded consumer
namespace and its twin namespace on one provider.

Owns, for one (consumer, provider):
- one reflector per kind (ConfigMap, Secret, Service, EndpointSlice, Ingress; `KINDS`), started
  for a namespace when its twin namespace is Ready and stopped when it goes (`start_namespace`,
  `stop_namespace`; the RemoteProvider calls them from its TwinNamespace watch);
- per namespace and kind a list+watch of the local objects and of the remote copies (the objects of
  the kind in the twin namespace labelled as this consumer's, token Secrets excepted: the provider's
  own objects are neither listed nor held), the consumer Namespace (its allow-list annotation), and
  the provider's IngressClasses;
- bounded caches: at most `max_objects` objects per namespace, kind and side (local, remote; and as
  many IngressClasses). Beyond, on the local side an object is not held and not reflected (taken up
  when it changes after room was made, or when its watch relists); on the remote side (objects
  claiming to be this consumer's copies, so forged ones) the watch of that kind in that twin namespace
  stops and its objects are let go: from then on each copy is read when it is reconciled (a GET
  before every write or delete, drift caught at the resync), until the namespace's reflection
  restarts; past the IngressClass bound, the class watch stops with the classes held. Each is
  reported once per namespace, kind and side as a Warning Event `ReflectionLimit` on the
  NamespaceOffloading and counted in `gpufed_reflection_ignored_objects_total{remote_cluster,kind,side}`;
- a work queue keyed by (kind, namespace, name): each key is reconciled level-triggered from the
  two caches: the forge function (`vkprovider.forge.reflection`) says what the remote copy should be
  (None: it must not exist), and the reconciler creates/updates it with server-side apply, deletes
  an owned copy (UID precondition), or leaves an unowned object untouched and reports the
  collision as a Warning Event on the local object. Before creating a copy it reads the name on the
  provider (an object the provider's users made is not watched: that read finds it);
- the provider's refusals (403s, reported by `remote.reflection_reports`): not retried in a loop:
  the object is tried again when it changes, at the next resync, or when the namespace's reflection
  restarts (an RBAC refusal, which a provider still binding the twin namespace answers for a
  moment, is retried with the queue's backoff);
- Ingress annotations: only those the provider lets a consumer set are sent
  (`forge.remote_ingress`; `set_ingress_annotations` gives what the provider publishes per
  namespace), what is left out is said once per set as a Warning Event `IngressAnnotationsDropped`
  on the local Ingress;
- drift: a changed remote copy comes back through the remote watch and is re-applied; every
  `resync_s` all keys are reconciled again; a relist after a reconnect (the watch's SYNC events)
  enqueues every key it delivers;
- status per namespace: Events on the namespace's NamespaceOffloading (`Reflecting` when its
  reflectors have synced, `ReflectionFailed` when a watch or a write keeps failing), recorded
  through a bounded `EventRelay` (never a task per Event); each Warning is said once
  (`remote.reflection_reports`).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from vkprovider.forge import reflection as forge
from vkprovider.forge.meta import Target, is_dns_subdomain
from vkprovider.forge.tokens import TOKEN_FOR_POD_LABEL
from vkprovider.remote.events_relay import EventRelay, RelayLimits
from vkprovider.remote.reflection_reports import LOCAL, REMOTE, ReflectionReports
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
#: Objects held per namespace, kind and side (and IngressClasses): above the provider's per-namespace
#: object quotas (`peering.grants.TWIN_OBJECT_COUNTS`), far below what would exhaust the process.
DEFAULT_MAX_OBJECTS = 5_000
#: Reason of the Warning Event on an Ingress whose copy leaves annotations out.
ANNOTATIONS_DROPPED = "IngressAnnotationsDropped"
_INGRESS_CLASS = "IngressClass"

IGNORED = Counter(
    "gpufed_reflection_ignored_objects_total",
    "Objects reflection did not hold because a namespace reached the most objects of a kind it holds (side "
    "local: watch events of the consumer's namespace beyond the bound; remote: copies let go when the watch of a "
    "twin namespace's kind stopped at the bound, and the provider's IngressClasses beyond it).",
    ["remote_cluster", "kind", "side"],
)

Key = tuple[str, str, str]  # (kind, local namespace, name)


class _SaturatedError(Exception):
    """Raised from a remote watch's handler to end that watch: it delivered more than the bound."""


def _path(kind: forge.Kind, namespace: str, name: str = "") -> str:
    """REST path of `kind`'s collection in `namespace`, or of the object `name` in it (quoted:
    names listed from the provider are used here too)."""
    return rest.path(kind.api_version, kind.plural, name, namespace=namespace)


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
    #: Objects held per namespace, kind and side (and IngressClasses held).
    max_objects: int = DEFAULT_MAX_OBJECTS
    #: How many status Events reflection may record, and how fast.
    event_limits: RelayLimits = field(default_factory=RelayLimits)


@dataclass
class _Namespace:
    twin: str
    annotations: dict[str, str]
    task: asyncio.Task[None] | None = None
    #: Watches ("namespace", "local-<Kind>", "remote-<Kind>") whose first list has been delivered.
    synced: set[str] = field(default_factory=set)
    announced: bool = False
    #: Kinds whose remote watch stopped at the bound: their copies are read when reconciled.
    saturated: set[str] = field(default_factory=set)

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
        #: (side, kind, local namespace) -> objects held.
        self._counts: dict[tuple[str, str, str], int] = {}
        #: local namespace -> the Ingress annotations its provider publishes as allowed (absent: none).
        self._ingress_annotations: dict[str, tuple[str, ...]] = {}
        #: Status Events on NamespaceOffloadings (bounded, rate-limited).
        self.events = EventRelay(local_api, settings.provider, COMPONENT, settings.event_limits)
        self._queue: WorkQueue[Key] = WorkQueue(f"reflection-{settings.provider}")
        self._tg: asyncio.TaskGroup | None = None
        self._pending: dict[str, str] = {}
        self._log = structlog.get_logger().bind(remote_cluster=settings.provider)
        self.reports = ReflectionReports(local_api, self.events, settings.provider, settings.max_objects, self._log)
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
            tg.create_task(self.events.run())
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
                self.reports.forget(obj["metadata"].get("uid"))
        self._counts = {k: v for k, v in self._counts.items() if k[2] != local_ns}
        self._ingress_annotations.pop(local_ns, None)
        self.reports.forget_namespace(local_ns)
        self._log.info("reflection stopped", namespace=local_ns)

    def namespace_annotations(self, local_ns: str) -> Mapping[str, str]:
        """The annotations of a reflected namespace as last seen (policy input); empty when unknown."""
        state = self._ns.get(local_ns)
        return state.annotations if state is not None else {}

    def namespaces(self) -> dict[str, str]:
        """Reflected local namespace -> twin namespace."""
        return {ns: s.twin for ns, s in self._ns.items()}

    def set_ingress_annotations(self, local_ns: str, allowed: Sequence[str] | None) -> None:
        """The Ingress annotations the provider publishes as allowed in `local_ns`'s twin (None: it
        publishes none; only the class annotation is sent). Kept until the namespace stops."""
        new = tuple(allowed or ())
        if self._ingress_annotations.get(local_ns, ()) == new:
            return
        self._ingress_annotations[local_ns] = new
        for ns, name in list(self._local[INGRESS.kind]):
            if ns == local_ns:
                self._queue.add((INGRESS.kind, ns, name))

    def held_object(self, side: str, kind: str, local_ns: str, name: str) -> Mapping[str, Any] | None:
        """The object of `kind` named `name` as the watch of `side` (LOCAL: in `local_ns`, REMOTE: the
        copy in its twin namespace) last delivered it; None when none is held (absent, past the
        bound, or its watch not listed yet)."""
        cache = (self._local if side == LOCAL else self._remote).get(kind)
        return cache.get((local_ns, name)) if cache is not None else None

    def held(self, side: str, kind: str, local_ns: str) -> int:
        """Objects of `kind` held for `local_ns` on `side` (LOCAL or REMOTE)."""
        return self._counts.get((side, kind, local_ns), 0)

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
            except _SaturatedError:
                if on_synced is not None:
                    on_synced()  # what it listed is let go: nothing more to wait for
                return
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
            self.reports.watch_failed(local_ns, message)

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
                        _path(kind, local_ns),
                        self._local_handler(kind, local_ns),
                        f"local {kind.plural} in {local_ns}",
                        synced(f"local-{kind.kind}"),
                        report=report,
                    )
                )
                tg.create_task(
                    self._watch_forever(
                        self.remote,
                        _path(kind, state.twin),
                        self._remote_handler(kind, local_ns, state),
                        f"remote {kind.plural} in {state.twin}",
                        synced(f"remote-{kind.kind}"),
                        # Only what claims to be ours: the provider's own objects (however many) are
                        # neither listed nor held; a create reads its name first (`_reconcile`).
                        {"labelSelector": f"{ORIGIN_CLUSTER_LABEL}={self.settings.consumer},!{TOKEN_FOR_POD_LABEL}"},
                        report=report,
                    )
                )

    def _local_handler(self, kind: Kind, local_ns: str) -> Callable[[str, dict[str, Any]], None]:
        def handle(t: str, obj: dict[str, Any]) -> None:
            if local_ns not in self._ns:
                return
            name = obj["metadata"]["name"]
            if t == "DELETED":
                self._forget(LOCAL, kind, local_ns, name)
                self.reports.forget(obj["metadata"].get("uid"))
            else:
                obj.setdefault("kind", kind.kind)
                obj.setdefault("apiVersion", kind.api_version)
                if not self._hold(LOCAL, kind, local_ns, name, obj):
                    self._over_limit(LOCAL, kind.kind, local_ns)
                    return
            self._queue.add((kind.kind, local_ns, name))
            if kind is SERVICE:  # a Service's reflection decides whether its slices are reflected
                for slice_ns, slice_name in self._slices_of(local_ns, name):
                    self._queue.add((ENDPOINT_SLICE.kind, slice_ns, slice_name))

        return handle

    def _remote_handler(self, kind: Kind, local_ns: str, state: _Namespace) -> Callable[[str, dict[str, Any]], None]:
        def handle(t: str, obj: dict[str, Any]) -> None:
            if self._ns.get(local_ns) is not state or kind.kind in state.saturated:
                return
            labels = obj["metadata"].get("labels") or {}
            if TOKEN_FOR_POD_LABEL in labels:
                return  # remote.tokens' Secrets have no local counterpart
            name = obj["metadata"]["name"]
            if not is_dns_subdomain(str(name)):
                return  # no local object can have that name: nothing to reconcile
            if t == "DELETED":
                self._forget(REMOTE, kind, local_ns, name)
            elif not self._hold(REMOTE, kind, local_ns, name, obj):
                self._saturate(kind, local_ns, state)
                raise _SaturatedError(kind.kind)
            self._queue.add((kind.kind, local_ns, name))

        return handle

    def _hold(self, side: str, kind: Kind, local_ns: str, name: str, obj: dict[str, Any]) -> bool:
        """Hold `obj` in `side`'s cache unless its namespace holds `max_objects` of the kind already;
        False when it is not held (the caller says what that means)."""
        cache = (self._local if side == LOCAL else self._remote)[kind.kind]
        key = (local_ns, name)
        count_key = (side, kind.kind, local_ns)
        if key not in cache:
            if self._counts.get(count_key, 0) >= self.settings.max_objects:
                return False
            self._counts[count_key] = self._counts.get(count_key, 0) + 1
        cache[key] = obj
        return True

    def _saturate(self, kind: Kind, local_ns: str, state: _Namespace) -> None:
        """Let go of `kind`'s remote copies of `local_ns` and read them when reconciled from now on."""
        state.saturated.add(kind.kind)
        cache = self._remote[kind.kind]
        names = [k for k in cache if k[0] == local_ns]
        for key in names:
            del cache[key]
        self._counts.pop((REMOTE, kind.kind, local_ns), None)
        self._over_limit(REMOTE, kind.kind, local_ns, len(names) + 1)
        for name in {n for ns, n in self._local[kind.kind] if ns == local_ns}:
            self._queue.add((kind.kind, local_ns, name))

    def _forget(self, side: str, kind: Kind, local_ns: str, name: str) -> None:
        cache = (self._local if side == LOCAL else self._remote)[kind.kind]
        if cache.pop((local_ns, name), None) is not None:
            count_key = (side, kind.kind, local_ns)
            self._counts[count_key] = max(self._counts.get(count_key, 0) - 1, 0)

    def _over_limit(self, side: str, kind: str, local_ns: str, ignored: int = 1) -> None:
        IGNORED.labels(self.settings.provider, kind, side).inc(ignored)
        twin = self._ns[local_ns].twin if local_ns in self._ns else local_ns
        self.reports.limit(side, kind, local_ns, twin)

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
        elif name in self._classes or len(self._classes) < self.settings.max_objects:
            self._classes[name] = obj
        else:
            IGNORED.labels(self.settings.provider, _INGRESS_CLASS, REMOTE).inc()
            self._log.warning("reflection limit reached: no longer watching the provider's IngressClasses")
            raise _SaturatedError(_INGRESS_CLASS)  # the classes held so far stay
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

    def _want(self, kind: Kind, local: Mapping[str, Any], local_ns: str, state: _Namespace) -> forge.IngressOutcome:
        """The remote copy `local` should have (body None: none), and why not when None (every kind
        answers in an `IngressOutcome`; only an Ingress's can have `dropped` annotations)."""
        decision = forge.policy(local, state.annotations)
        if not decision.reflect:
            return forge.IngressOutcome(None, decision.reason, decision.message)
        target = Target(self.settings.consumer, "", state.twin, self.settings.provider)
        if kind is CONFIG_MAP:
            return forge.IngressOutcome(forge.remote_config_map(local, target), "", "")
        if kind is SECRET:
            return forge.IngressOutcome(forge.remote_secret(local, target), "", "")
        if kind is SERVICE:
            return forge.IngressOutcome(forge.remote_service(local, target), "", "")
        if kind is ENDPOINT_SLICE:
            services = self._reflected_service(local_ns, local, state)
            body = forge.remote_endpoint_slice(local, target, self.translator.to_remote_ip, services)
            return forge.IngressOutcome(body, "", "")
        if not self._classes_known:
            return forge.IngressOutcome(None, "", "")  # not yet known: the class watch enqueues again
        allowed = self._ingress_annotations.get(local_ns, ())
        return forge.remote_ingress(local, target, set(self._classes), self._default_class(), allowed)

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
        outcome = self._want(kind, local, local_ns, state) if local is not None else forge.IngressOutcome(None, "", "")
        want = outcome.body
        url = _path(kind, state.twin, name)
        saturated = kind.kind in state.saturated
        if remote is None and (want is not None or saturated):
            # Not watched: an object of that name the provider's users made (never applied over), or
            # any copy of a kind no longer watched here.
            remote = await rest.get(self.remote, url)
        if remote is not None and not forge.reflection_owned(remote, self.settings.consumer):
            if want is not None and local is not None:
                await self.reports.collision(kind, local, remote, state.twin)
            return None
        if want is None:
            if local is not None and outcome.reason == "IngressClassMissing":
                await self.reports.report_once(local, outcome.reason, outcome.message, outcome.reason)
            if remote is not None:
                await self._delete(kind, remote, url)
            return None
        assert local is not None  # a wanted copy always has its local object
        if outcome.dropped:
            await self.reports.report_once(
                local,
                ANNOTATIONS_DROPPED,
                f"annotations {self.settings.provider} does not let this cluster set on Ingresses were left out of "
                f"the copy in {state.twin}: {', '.join(outcome.dropped)} (allowed there: kubernetes.io/ingress.class"
                f"{''.join(', ' + a for a in self._ingress_annotations.get(local_ns, ()))}; the provider's "
                "Tenant spec.policy.ingressAnnotations decides)",
                ",".join(outcome.dropped),
            )
        if remote is not None and not forge.needs_apply(want, remote):
            return None
        if remote is not None and forge.needs_recreate(want, remote):
            await self._delete(kind, remote, url)  # e.g. an immutable ConfigMap changed: apply cannot
        try:
            applied = await rest.apply(self.remote, url, want, what=f"reflect {kind.kind} {local_ns}/{name}")
        except KubeError as e:
            if e.transient:
                raise
            if e.status == 403:
                if await self.reports.refusal(local, kind, e) != "RBAC":
                    return None  # deterministic: tried again when it changes or at the next resync
                raise
            await self.reports.report_once(
                local, "ReflectionFailed", f"cannot reflect to {self.settings.provider}: {e}", f"{e.status}:{e}"
            )
            raise
        self.writes += 1
        if not saturated:
            self._hold(REMOTE, kind, local_ns, name, applied)  # when full, its watch event saturates the kind
        return None

    async def _delete(self, kind: Kind, remote: Mapping[str, Any], url: str) -> None:
        meta = remote["metadata"]
        try:
            await rest.delete(self.remote, url, uid=meta.get("uid"), what=f"unreflect {kind.kind} {meta['name']}")
        except KubeError as e:
            if not e.conflict:  # conflict: the UID precondition failed, that copy is gone already
                raise
        self.writes += 1

    # ---- status

    def _announce(self, local_ns: str, state: _Namespace) -> None:
        counts = ", ".join(f"{self.held(LOCAL, k.kind, local_ns)} {k.plural}" for k in KINDS)
        mode = "allow-list" if state.annotations.get(forge.ALLOW_ANNOTATION, "").lower() == "true" else "all"
        self._enqueue_namespace(local_ns)
        self.reports.status_event(
            local_ns,
            "Normal",
            "Reflecting",
            f"reflecting into {state.twin} on {self.settings.provider} ({mode}; local objects: {counts})",
        )


__all__ = ["KINDS", "Kind", "Reflection", "ReflectionSettings"]
