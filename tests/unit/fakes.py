"""In-memory stand-ins for the virtual kubelet's tests: a provider and a small Kubernetes API server.

- `FakeProvider`: a PodProvider + NodeProvider holding twins in a dict, keyed by the LOCAL pod's
  namespace/name, implementing the contract in `vkprovider.node.provider` (checked by
  `provider_conformance`). Tests drive it with `set_phase`, `vanish`, `seed`, `refuse` and `state`,
  and read what the controllers asked of it from `creates`, `updates` and `deletes`.
- `offloaded_here`: the consumer's record (its NamespaceOffloadings) that a `RemoteProvider` driven
  without `run` follows TwinNamespaces by.
- `FakeApiServer`: aiohttp on 127.0.0.1, served to a real kubernetes_asyncio ApiClient. It knows
  just what NodeController and PodController use: create/get/put/delete, JSON merge and strategic
  merge patches (lists merged by their merge key, `null` deletes, `{"$patch": "replace"}`), JSON
  patches (RFC 6902: add, remove, replace, test),
  server-side apply approximated (creates a missing object, else a JSON merge of the applied fields), the
  status subresource, pod deletion with grace period and UID precondition, list+watch with
  fieldSelector and equality labelSelector, and a resourceVersion bumped on every write; review kinds (TokenReview,
  SubjectAccessReview) answered by functions the test sets in `reviewers`. Every request is recorded.

Not a conformant API server: no validation, admission, defaulting, pagination or garbage collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from gpufed.apis.wire import NAMESPACE_OFFLOADING, ORIGIN_UID_LABEL
from gpufed.kube.times import rfc3339
from vkprovider.forge.pods import TERMINAL_PHASES, local_status
from vkprovider.node.provider import NodeState, Notify, ProviderError, Twin

Key = tuple[str, str]


# ---------------------------------------------------------------------------------------- provider


def node_state(*, ready: bool = True, gpus: str = "4", labels: Mapping[str, str] | None = None) -> NodeState:
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": gpus}
    return NodeState(
        capacity=resources,
        allocatable=resources,
        labels=dict(labels or {}),
        ready=ready,
        reason="KubeletReady" if ready else "ProviderUnreachable",
        message="provider answers" if ready else "the provider's API does not answer",
    )


class FakeProvider:
    """Twins in memory. A delete with grace 0 removes at once; with a grace period the twin is
    `deleting` until the test calls `vanish` (or at once when `finish_deletes` is set)."""

    def __init__(self, *, host_ip: str = "192.0.2.10", state: NodeState | None = None) -> None:
        self.state_reads = 0
        self.ready = asyncio.Event()
        self.host_ip = host_ip
        self.state = state or node_state()
        #: (ns, name) -> the twin "pod" (metadata with origin uid, spec, status).
        self.pods: dict[Key, dict[str, Any]] = {}
        #: (ns, name) -> the error create_pod raises for that key (until removed).
        self.refuse: dict[Key, ProviderError] = {}
        self.finish_deletes = False
        self.creates: list[tuple[str, str, str]] = []  # (ns, name, uid), each successful creation
        self.create_attempts: dict[Key, int] = {}
        self.updates: list[Key] = []
        self.deletes: list[tuple[str, str, str, int]] = []  # (ns, name, uid, grace), each call
        self.notified: list[Key] = []
        self.subscribers: list[Notify] = []

    # ---- driving the backend (tests)

    def seed(self, namespace: str, name: str, origin_uid: str, phase: str = "Running") -> None:
        """A twin that already exists (e.g. before a restart of the virtual kubelet)."""
        self.pods[(namespace, name)] = self._new(namespace, name, origin_uid)
        self.set_phase(namespace, name, phase)

    def set_phase(
        self, namespace: str, name: str, phase: str, pod_ip: str = "10.244.1.7", waiting: str = "ContainerCreating"
    ) -> None:
        pod = self.pods[(namespace, name)]
        status: dict[str, Any] = {"phase": phase}
        if phase != "Pending":
            status["podIP"] = pod_ip
            status["podIPs"] = [{"ip": pod_ip}]
            status["startTime"] = "2024-01-01T00:00:00Z"
        names = [c.get("name", "c") for c in pod["spec"].get("containers") or [{"name": "c"}]]
        if phase == "Running":
            state: dict[str, Any] = {"running": {"startedAt": "2024-01-01T00:00:01Z"}}
        elif phase in TERMINAL_PHASES:
            code = 0 if phase == "Succeeded" else 1
            state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
        else:
            state = {"waiting": {"reason": waiting}}
        status["containerStatuses"] = [
            {"name": n, "image": "img", "imageID": "", "restartCount": 0, "ready": phase == "Running", "state": state}
            for n in names
        ]
        pod["status"] = status
        self._changed(namespace, name)

    def unplaced(self, namespace: str, name: str, since: float | None) -> None:
        """The provider has not placed the twin since `since` (unix time; None: placed)."""
        self.pods[(namespace, name)]["unplaced_since"] = since
        self._changed(namespace, name)

    def vanish(self, namespace: str, name: str) -> None:
        """The twin is gone at the provider (deleted, evicted, garbage-collected)."""
        if self.pods.pop((namespace, name), None) is not None:
            self._changed(namespace, name)

    def _new(self, namespace: str, name: str, origin_uid: str, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "metadata": {
                "namespace": f"{namespace}-twin",
                "name": name,
                "uid": str(uuid.uuid4()),
                "labels": {ORIGIN_UID_LABEL: origin_uid},
            },
            "spec": copy.deepcopy(dict(spec or {})),
            "status": {"phase": "Pending"},
        }

    def _changed(self, namespace: str, name: str) -> None:
        self.notified.append((namespace, name))
        self._tell(namespace, name)

    def _tell(self, namespace: str, name: str) -> None:
        for notify in self.subscribers:
            notify(namespace, name)

    # ---- PodProvider

    def subscribe(self, notify: Notify) -> None:
        self.subscribers.append(notify)

    async def run(self) -> None:
        for key in list(self.pods):
            self._tell(*key)
        self.ready.set()
        await asyncio.Event().wait()

    def _twin(self, key: Key, pod: Mapping[str, Any]) -> Twin:
        return Twin(
            namespace=key[0],
            name=key[1],
            origin_uid=pod["metadata"]["labels"][ORIGIN_UID_LABEL],
            terminal=pod["status"].get("phase") in TERMINAL_PHASES,
            deleting=bool(pod["metadata"].get("deletionTimestamp")),
            unplaced_since=pod.get("unplaced_since"),
            raw=pod,
        )

    def twins(self) -> list[Twin]:
        return [self._twin(k, p) for k, p in self.pods.items()]

    def twin(self, namespace: str, name: str) -> Twin | None:
        pod = self.pods.get((namespace, name))
        return None if pod is None else self._twin((namespace, name), pod)

    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        self.create_attempts[key] = self.create_attempts.get(key, 0) + 1
        refusal = self.refuse.get(key)
        if refusal is not None:
            raise refusal
        existing = self.pods.get(key)
        if existing is not None:
            if existing["metadata"]["labels"][ORIGIN_UID_LABEL] == meta["uid"]:
                return
            raise ProviderError(
                "an earlier twin with this name is still being removed; retrying", reason="TwinConflict"
            )
        self.pods[key] = self._new(key[0], key[1], meta["uid"], pod.get("spec"))
        self.creates.append((key[0], key[1], meta["uid"]))
        self._changed(*key)

    async def update_pod(self, pod: Mapping[str, Any], twin: Twin) -> None:
        self.updates.append((twin.namespace, twin.name))

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None:
        self.deletes.append((namespace, name, uid, grace_period_s))
        pod = self.pods.get((namespace, name))
        if pod is None or pod["metadata"]["labels"][ORIGIN_UID_LABEL] != uid:
            return
        if grace_period_s == 0 or self.finish_deletes:
            self.vanish(namespace, name)
        elif not pod["metadata"].get("deletionTimestamp"):
            pod["metadata"]["deletionTimestamp"] = rfc3339()
            self._changed(namespace, name)

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        return local_status(twin.raw, pod, host_ip=self.host_ip)

    # ---- NodeProvider

    async def node_state(self) -> NodeState:
        self.state_reads += 1  # one per round of the node controller
        return self.state


# ---------------------------------------------------------------------------------------- API server

#: Merge keys of the lists a strategic-merge patch merges item by item (the rest are replaced).
MERGE_KEYS = {
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
    "addresses": "type",
}
REPLACE = {"$patch": "replace"}
KINDS = {"nodes": "Node", "pods": "Pod", "leases": "Lease", "events": "Event"}
#: Pods deleted without a grace period get the default of their spec, else this (as the API server).
DEFAULT_GRACE_S = 30

ObjKey = tuple[str, str, str]  # (resource, namespace, name)


def json_patch(target: dict[str, Any], ops: Any) -> None:
    """Apply RFC 6902 operations (add, remove, replace, test) onto `target` (all or nothing: a failed
    `test` or a missing path raises before anything changes)."""
    work = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent: Any = work
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent[last]
            if here != op["value"]:
                raise ValueError(f"test of {op['path']} failed")
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                else:
                    parent.insert(int(last), op["value"]) if op["op"] == "add" else parent.__setitem__(
                        int(last), op["value"]
                    )
            else:
                if op["op"] == "replace" and last not in parent:
                    raise KeyError(op["path"])
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"unsupported JSON patch operation {op['op']!r}")
    target.clear()
    target.update(work)


def merge(target: dict[str, Any], patch: Mapping[str, Any], *, strategic: bool) -> dict[str, Any]:
    """Apply a JSON merge patch (RFC 7386), or a strategic-merge patch, onto `target` (in place)."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, Mapping):
            old = target.get(k)
            target[k] = merge(old if isinstance(old, dict) else {}, v, strategic=strategic)
        elif isinstance(v, list) and strategic and k in MERGE_KEYS:
            if v and v[0] == REPLACE:
                target[k] = copy.deepcopy(v[1:])
                continue
            mk = MERGE_KEYS[k]
            items: list[dict[str, Any]] = list(target.get(k) or [])
            for item in v:
                found = next((i for i in items if i.get(mk) == item.get(mk)), None)
                if found is None:
                    items.append(merge({}, item, strategic=True))
                else:
                    merge(found, item, strategic=True)
            target[k] = items
        else:
            target[k] = copy.deepcopy(v)
    return target


def _field(obj: Mapping[str, Any], dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        path, _, want = term.partition("=")
        if str(_field(obj, path) or "") != want:
            return False
    return True


def _labelled(obj: Mapping[str, Any], selector: str) -> bool:
    """Equality-based label selectors: `k=v`, `k==v`, `k!=v`, `k` (exists), `!k` (absent)."""
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            ok = labels.get(k) != v
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            ok = labels.get(k) == v
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class _Watcher:
    resource: str
    namespace: str
    selector: str
    labels: str = ""
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)


class FakeApiServer:
    """Objects by (resource, namespace, name); a log of every watch event for watches to resume from."""

    def __init__(self) -> None:
        self.objects: dict[ObjKey, dict[str, Any]] = {}
        self.requests: list[Request] = []
        #: Every event ever: (resourceVersion, resource, type, object).
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self._rv = itertools.count(100)
        self.rv = next(self._rv)
        self._watchers: list[_Watcher] = []
        #: Cleared, watch streams hold their events back (a watch lagging behind the writes).
        self.flowing = asyncio.Event()
        self.flowing.set()
        #: Virtual resources answered by a function instead of stored (e.g. "tokenreviews":
        #: request body -> the review with its status).
        self.reviewers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        #: Whether pods/binding is served (binds the pod) or refused (403).
        self.bindings = True
        #: resource -> how many of the next creates of it lose a race for the namespace's quota (409
        #: Conflict, nothing stored), as kube-apiserver's ResourceQuota admission answers under a burst.
        self.contend: dict[str, int] = {}

    # ---- state (tests use these directly; they emit watch events like the HTTP verbs)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((resource, namespace, name))

    def items(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [o for (r, ns, _), o in self.objects.items() if r == resource and namespace in (None, ns)]

    def create(self, resource: str, obj: Mapping[str, Any], api_version: str = "v1") -> dict[str, Any]:
        new = copy.deepcopy(dict(obj))
        new.setdefault("apiVersion", api_version)
        new.setdefault("kind", KINDS.get(resource, resource))
        meta = new.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", rfc3339())
        if "name" not in meta and meta.get("generateName"):
            meta["name"] = meta["generateName"] + meta["uid"][:5]
        self.objects[(resource, meta.get("namespace") or "", meta["name"])] = new
        self._emit(resource, "ADDED", new)
        return new

    def update(self, resource: str, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        obj = self.objects[(resource, namespace, name)]
        change(obj)
        self._emit(resource, "MODIFIED", obj)

    def remove(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects.pop((resource, namespace, name))
        self._emit(resource, "DELETED", obj)
        return obj

    def deleted(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as it was when it was removed (the last DELETED event), if it was."""
        for _rv, r, t, obj in reversed(self.history):
            meta: dict[str, Any] = obj["metadata"]
            if r == resource and t == "DELETED" and (meta.get("namespace") or "", meta["name"]) == (namespace, name):
                found: dict[str, Any] = obj
                return found
        return None

    def calls(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path == path]

    def _emit(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        self.rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        snapshot = copy.deepcopy(obj)
        self.history.append((self.rv, resource, kind, snapshot))
        for w in self._watchers:
            if self._watched(w, resource, snapshot):
                w.queue.put_nowait((kind, snapshot))

    @staticmethod
    def _watched(w: _Watcher, resource: str, obj: Mapping[str, Any]) -> bool:
        ns = obj["metadata"].get("namespace") or ""
        return (
            resource == w.resource
            and w.namespace in ("", ns)
            and _selected(obj, w.selector)
            and _labelled(obj, w.labels)
        )

    # ---- HTTP

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = json.loads(await request.text()) if request.can_read_body else {}
        self.requests.append(
            Request(request.method, request.path, dict(request.query), request.content_type, copy.deepcopy(body))
        )
        parts = request.path.strip("/").split("/")
        api_version = parts[1] if parts[0] == "api" else f"{parts[1]}/{parts[2]}"
        parts = parts[2:] if parts[0] == "api" else parts[3:]
        namespace = ""
        if parts and parts[0] == "namespaces" and len(parts) > 2:
            namespace, parts = parts[1], parts[2:]
        if not parts:
            return _status(404, "NotFound", "no such path")
        resource = parts[0]
        name = parts[1] if len(parts) > 1 else ""
        sub = parts[2] if len(parts) > 2 else ""
        if not name:
            if request.method == "POST" and resource in self.reviewers:
                return web.json_response(self.reviewers[resource](body), status=201)
            if request.method == "POST":
                meta = body.setdefault("metadata", {})
                if namespace:
                    meta["namespace"] = namespace
                if (resource, namespace, meta.get("name")) in self.objects:
                    return _status(409, "AlreadyExists", f'{resource} "{meta.get("name")}" already exists')
                if self.contend.get(resource, 0) > 0:
                    self.contend[resource] -= 1
                    return _status(
                        409,
                        "Conflict",
                        'Operation cannot be fulfilled on resourcequotas "gpufed-grant": the object has been '
                        "modified; please apply your changes to the latest version and try again",
                    )
                return web.json_response(self.create(resource, body, api_version), status=201)
            if request.query.get("watch") == "true":
                return await self._watch(request, resource, namespace)
            selection = _Watcher(
                resource, namespace, request.query.get("fieldSelector", ""), request.query.get("labelSelector", "")
            )
            items = [o for o in self.items(resource) if self._watched(selection, resource, o)]
            meta = {"resourceVersion": str(self.rv)}
            kind = KINDS.get(resource, resource) + "List"
            return web.json_response({"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items})
        key = (resource, namespace, name)
        obj = self.objects.get(key)
        apply = request.method == "PATCH" and request.content_type == "application/apply-patch+yaml"
        if obj is None and apply and not sub:  # server-side apply creates
            body.setdefault("metadata", {}).update(name=name, **({"namespace": namespace} if namespace else {}))
            return web.json_response(self.create(resource, body, api_version), status=201)
        if obj is None:
            return _status(404, "NotFound", f'{resource} "{name}" not found')
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "DELETE":
            return self._delete(key, obj, body)
        if request.method == "POST" and resource == "pods" and sub == "binding":
            if not self.bindings:
                return _status(403, "Forbidden", "bindings are refused here")
            if (obj.get("spec") or {}).get("nodeName"):
                return _status(409, "Conflict", f'pod {name} is already assigned to node "{obj["spec"]["nodeName"]}"')
            obj.setdefault("spec", {})["nodeName"] = (body.get("target") or {}).get("name", "")
            self._emit(resource, "MODIFIED", obj)
            return web.json_response({"kind": "Status", "status": "Success"}, status=201)
        if request.method == "PATCH" and request.content_type == "application/json-patch+json":
            try:
                json_patch(obj, body)
            except (KeyError, IndexError, ValueError) as e:
                return _status(422, "Invalid", f"the JSON patch cannot be applied: {e}")
            self._emit(resource, "MODIFIED", obj)
            return web.json_response(obj)
        want_rv = (body.get("metadata") or {}).pop("resourceVersion", None)
        if want_rv is not None and want_rv != obj["metadata"]["resourceVersion"]:
            return _status(
                409, "Conflict", "the object has been modified; please apply your changes to the latest version"
            )
        if request.method == "PUT":
            body["metadata"] = {**body["metadata"], "uid": obj["metadata"]["uid"]}
            obj.clear()
            obj.update(body)
        elif request.method == "PATCH":
            strategic = request.content_type == "application/strategic-merge-patch+json"
            if sub == "status":
                merge(obj, {"status": body.get("status") or {}}, strategic=strategic)
            else:
                merge(obj, {k: v for k, v in body.items() if k != "status"}, strategic=strategic)
        else:
            return _status(405, "MethodNotAllowed", request.method)
        self._emit(resource, "MODIFIED", obj)
        return web.json_response(obj)

    def _delete(self, key: ObjKey, obj: dict[str, Any], options: Mapping[str, Any]) -> web.Response:
        meta = obj["metadata"]
        want_uid = (options.get("preconditions") or {}).get("uid")
        if want_uid is not None and want_uid != meta["uid"]:
            message = f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: {meta['uid']}"
            return _status(409, "Conflict", message)
        grace = options.get("gracePeriodSeconds")
        if key[0] == "pods" and grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        if key[0] == "pods" and grace:
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = rfc3339()
                meta["deletionGracePeriodSeconds"] = grace
                self._emit(key[0], "MODIFIED", obj)
            return web.json_response(obj)
        self.remove(*key)
        return web.json_response(obj)

    async def _watch(self, request: web.Request, resource: str, namespace: str) -> web.StreamResponse:
        w = _Watcher(
            resource, namespace, request.query.get("fieldSelector", ""), request.query.get("labelSelector", "")
        )
        since = int(request.query.get("resourceVersion") or 0)
        # Replay and subscribe with no await in between: nothing written meanwhile is lost.
        for rv, r, kind, obj in self.history:
            if rv > since and self._watched(w, r, obj):
                w.queue.put_nowait((kind, obj))
        self._watchers.append(w)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        try:
            await resp.prepare(request)
            while (item := await w.queue.get()) is not None:
                await self.flowing.wait()
                await resp.write(json.dumps({"type": item[0], "object": item[1]}).encode() + b"\n")
        except ConnectionResetError:
            pass
        finally:
            self._watchers.remove(w)
        return resp

    def stop_watches(self) -> None:
        self.flowing.set()
        for w in self._watchers:
            w.queue.put_nowait(None)


@contextlib.asynccontextmanager
async def serve(server: FakeApiServer | None = None) -> AsyncIterator[tuple[FakeApiServer, Any]]:
    """The fake API server on a free local port and a kubernetes_asyncio ApiClient talking to it."""
    server = server or FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        yield server, api
    finally:
        server.stop_watches()
        await api.close()
        await runner.cleanup()


async def until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll `predicate` until it holds; AssertionError (naming `what`) after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running(coro: Any) -> AsyncIterator[asyncio.Task[Any]]:
    """Run `coro` as a task for the block; cancelled (and its failure, if any, raised) on exit."""
    task: asyncio.Task[Any] = asyncio.create_task(coro)
    try:
        yield task
    finally:
        failure = task.exception() if task.done() and not task.cancelled() else None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if failure is not None:
            raise failure


class Recorder:
    """A `Reporter` (peering.ops) that keeps the progress lines a command would print."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, text: str) -> None:
        self.lines.append(f"step {text}")

    def done(self, text: str) -> None:
        self.lines.append(f"done {text}")


def offloaded_here(provider: Any, *namespaces: str) -> None:
    """Tell a `vkprovider.remote.provider.RemoteProvider` that is not running (tests that drive its
    handlers directly) what the consumer's NamespaceOffloadings say: `namespaces` are offloaded to
    its provider. Without this, the provider's TwinNamespaces for them are claims it does not follow."""
    record = provider.offloaded
    for namespace in namespaces:
        entry = {"clusterId": record.provider, "namespace": f"{namespace}-twin", "phase": "Ready"}
        obj = {
            "metadata": {"name": NAMESPACE_OFFLOADING, "namespace": namespace},
            "status": {"remoteNamespaces": [entry]},
        }
        record._on_event("ADDED", obj)
    record._on_synced()
