"""The offloading admission webhook: HTTPS server, its certificate, and its registration.

Owns:
- `Webhook.run()`: a TLS certificate (self-signed CA + serving certificate for `host`, kept in
  Secret `gpufed/gpufed-webhook-tls`, reused across restarts, re-issued 30 days before it expires,
  also while running), an aiohttp HTTPS server on `port` answering `POST /mutate-pods` with
  AdmissionReview v1 responses (JSONPatch from `vkprovider.forge.offloading.mutate`, plus its
  `gate` for pods of a group: a pod a Job controls is judged with that Job, and a JobSet's pod with
  its JobSet (named by the pod's JobSet labels, `gpupool.gang.jobset_owner`; its Job when the JobSet
  is gone), each read once and kept a minute, `JobCache`; where the pod's claims keep their data,
  read live, `ClaimPlaces`: a pod is pinned to the provider its claims are bound on, or to local
  nodes for the cluster's own storage) and
  `POST /mutate-workloads` for Jobs and JobSets queued to Kueue (`kueue.x-k8s.io/queue-name`): their
  multi-GPU pod templates get the node affinity of `vkprovider.forge.queued`, so Kueue never admits
  one to a flavor whose pool cannot hold its pod (failure policy Ignore: without it a Job is admitted
  as Kueue alone would);
  `GET /healthz`, and the MutatingWebhookConfiguration `gpufed-offloading` that points the API
  server at both (server-side applied on start and whenever the certificate changes);
- a watch cache of NamespaceOffloadings: a namespace whose offloading is being deleted (or that has
  none) gets no patch; a cache miss is checked with one live read, since the namespace label the
  webhook is selected by may be set before this watch has seen the new object.

Failure policy: **Fail**. The webhook's namespaceSelector (`gpufed.io/offloading Exists`) limits it
to namespaces that were offloaded on purpose, and in those a pod admitted without it would silently
ignore the namespace's strategy (a Local namespace's pod could land on a virtual node; a Remote
namespace's pod would stay local or Pending without the toleration). The consequence: while the
controller is down, pod creation in offloaded namespaces is refused with an error that names the
webhook ("failed calling webhook pods.offloading.gpufed.io"); other namespaces are unaffected.
Recovery: restart `gpufed controller`; or, to create pods without it, remove the namespace's label
(`kubectl label namespace NS gpufed.io/offloading-`; the controller puts it back when it returns)
or delete the configuration (`kubectl delete mutatingwebhookconfiguration gpufed-offloading`; it is
re-applied at the next start).

Invariants: the private keys never leave the Secret and this process (never logged); a malformed
review is answered 400; a pod outside offloaded namespaces is allowed unchanged; readiness (`ready`)
is set only once the server answers on the address the API server uses and the configuration is
applied.

Does not: decide the mutation (`vkprovider.forge.offloading`) or label namespaces (the offloading
controller does).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import json
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    JOBSET_API_VERSION,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAMESPACE_OFFLOADING,
    OFFLOADING_LABEL,
    SYSTEM_NAMESPACE,
)
from gpufed.kube import rest, servingtls
from gpufed.kube.client import KubeError
from gpufed.kube.servingtls import TLSMaterial
from gpufed.kube.watch import watch
from gpupool.gang import JOBSET_KIND, GroupError, job_owner, jobset_owner
from vkprovider.forge.claims import claim_names, data_place
from vkprovider.forge.offloading import (
    NOT_ON_VIRTUAL,
    STRATEGIES,
    ClaimConflictError,
    claim_pin,
    gate,
    mark_kept_local,
    mutate,
)
from vkprovider.forge.queued import fit_affinity_patch

WEBHOOK_CONFIGURATION = "gpufed-offloading"
WEBHOOK_NAME = "pods.offloading.gpufed.io"
TLS_SECRET = "gpufed-webhook-tls"  # noqa: S105 -- a Secret's name, not a password
MUTATE_PATH = "/mutate-pods"
#: The webhook for queued Jobs and JobSets (their GPU pod templates' fit affinity), and its path.
WORKLOADS_WEBHOOK_NAME = "workloads.offloading.gpufed.io"
MUTATE_WORKLOADS_PATH = "/mutate-workloads"
#: Without it a queued Job is only admitted as Kueue alone would (no fit affinity): not worth refusing it.
WORKLOADS_FAILURE_POLICY = "Ignore"
#: Lifetime of the CA and serving certificate.
DEFAULT_CERT_DAYS = servingtls.DEFAULT_CERT_DAYS
#: Re-issue the certificate when it has less than this left.
DEFAULT_RENEW_BEFORE = servingtls.DEFAULT_RENEW_BEFORE
#: Seconds between checks whether the certificate must be re-issued while running.
DEFAULT_RENEW_CHECK_S = 3600.0
#: Seconds the API server waits for an answer (the configuration's timeoutSeconds).
TIMEOUT_SECONDS = 5
FAILURE_POLICY = "Fail"
#: Largest AdmissionReview accepted (a pod is far smaller).
MAX_BODY = 8 * 1024 * 1024


@dataclass(frozen=True)
class WebhookServerSettings:
    #: TCP port of the HTTPS server.
    port: int
    #: Host (IP address or DNS name) the API server reaches the webhook on; in the certificate and the URL.
    host: str = "127.0.0.1"
    #: Lifetime in days of a newly issued certificate.
    cert_days: int = DEFAULT_CERT_DAYS
    #: Re-issue the certificate when less than this is left.
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE
    #: Seconds between renewal checks while running.
    renew_check_s: float = DEFAULT_RENEW_CHECK_S
    #: In a cluster: the Service (namespace, name, port) in front of the replicas; the API server
    #: reaches it by a service reference, the certificate names `<name>.<namespace>.svc`, and the
    #: server listens on every interface. None: `host` in a URL (the local environment).
    service: tuple[str, str, int] | None = None

    @property
    def dns_name(self) -> str:
        """The name in the certificate (and in the URL when no service is used)."""
        if self.service is not None:
            return f"{self.service[1]}.{self.service[0]}.svc"
        return self.host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def webhook_configuration(
    host: str, port: int, ca_pem: bytes, *, service: tuple[str, str, int] | None = None
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration that sends pod creations in offloaded namespaces to us, and
    creations of Jobs and JobSets queued to Kueue there (through `service` (namespace, name, port)
    when given, else `https://host:port`). The pods' webhook comes first (`gpufed doctor` checks it)."""
    url_host = f"[{host}]" if _is_ip(host) and ":" in host else host

    def client_config(path: str) -> dict[str, Any]:
        config: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode()}
        if service is not None:
            config["service"] = {"namespace": service[0], "name": service[1], "port": service[2], "path": path}
        else:
            config["url"] = f"https://{url_host}:{port}{path}"
        return config

    common = {
        "namespaceSelector": {"matchExpressions": [{"key": OFFLOADING_LABEL, "operator": "Exists"}]},
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": TIMEOUT_SECONDS,
        "reinvocationPolicy": "IfNeeded",
    }
    group, version = JOBSET_API_VERSION.split("/")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": client_config(MUTATE_PATH),
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": FAILURE_POLICY,
                **common,
            },
            {
                "name": WORKLOADS_WEBHOOK_NAME,
                "clientConfig": client_config(MUTATE_WORKLOADS_PATH),
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": ["batch"],
                        "apiVersions": ["v1"],
                        "resources": ["jobs"],
                        "scope": "Namespaced",
                    },
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [group],
                        "apiVersions": [version],
                        "resources": ["jobsets"],
                        "scope": "Namespaced",
                    },
                ],
                "objectSelector": {"matchExpressions": [{"key": KUEUE_QUEUE_LABEL, "operator": "Exists"}]},
                "failurePolicy": WORKLOADS_FAILURE_POLICY,
                **common,
            },
        ],
    }


def _request_of(review: Any) -> dict[str, Any]:
    """The request of an AdmissionReview; ValueError when it is malformed (answered 400)."""
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise ValueError("not an AdmissionReview")
    req = review.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise ValueError("an AdmissionReview without request.uid")
    return req


def _answer(review: Mapping[str, Any], response: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The AdmissionReview that answers `review` with `response`, patched by `ops` when there are any."""
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {
        "apiVersion": review.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


def workloads_response(review: Any) -> dict[str, Any]:
    """The AdmissionReview answer for a queued Job or JobSet: the fit affinity of its multi-GPU pod
    templates (`forge.queued`). Raises ValueError for a malformed review (answered 400)."""
    req = _request_of(review)
    obj, kind = req.get("object"), req.get("kind") or {}
    ops: list[dict[str, Any]] = []
    if isinstance(obj, dict) and isinstance(kind, dict) and kind.get("kind") in ("Job", "JobSet"):
        ops = fit_affinity_patch({**obj, "kind": kind["kind"]})
    return _answer(review, {"uid": req["uid"], "allowed": True}, ops)


def review_response(
    review: Any,
    offloading: Mapping[str, Any] | None,
    job: Mapping[str, Any] | None = None,
    places: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answer for `review` given the namespace's NamespaceOffloading (or None),
    the Job that controls the pod (or None) and where its claims keep their data (`places`: claim ->
    provider, or None for this cluster's own storage; `forge.offloading.claim_pin`). A group
    declaration that cannot be honoured (a size that is no whole number of pods), or claims bound in
    different clusters, refuse the pod with the reason; a pod its claims keep local in a namespace
    whose pods all go remote is admitted with a warning (it stays Pending).

    Raises ValueError for a malformed review (answered 400).
    """
    req = _request_of(review)
    response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    obj = req.get("object")
    kind = req.get("kind") or {}
    ops: list[dict[str, Any]] = []
    if offloading is not None and isinstance(obj, dict) and isinstance(kind, dict) and kind.get("kind") == "Pod":
        spec = offloading.get("spec") or {}
        strategy = str(spec.get("podOffloadingStrategy") or "LocalAndRemote")
        if strategy in STRATEGIES:
            try:
                pinned = claim_pin(places or {})
                ops = mutate(obj, strategy, spec.get("clusterSelector"), pinned)
                if NOT_ON_VIRTUAL in pinned:
                    # kept local by its claims: labelled for the controller's Event, never gated (a
                    # group is placed on virtual nodes only)
                    ops += mark_kept_local(obj, strategy)
                else:
                    ops += gate(obj, strategy, job)
                if strategy == "Remote" and NOT_ON_VIRTUAL in pinned:
                    response["warnings"] = [
                        "gpufed: the pod's claims are bound to this cluster's own storage, so it can run on "
                        "local nodes only, and the namespace's pods run remotely only: it stays Pending"
                    ]
            except (GroupError, ClaimConflictError) as e:
                response.update(allowed=False, status={"code": 422, "reason": "Invalid", "message": f"gpufed: {e}"})
                ops = []
    return _answer(review, response, ops)


class OffloadingCache:
    """namespace -> its live NamespaceOffloading (None while it is being deleted), from a watch."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.items: dict[str, dict[str, Any] | None] = {}

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("name") != NAMESPACE_OFFLOADING:
            return
        ns = str(meta.get("namespace"))
        if kind == "DELETED":
            self.items.pop(ns, None)
        else:
            self.items[ns] = None if meta.get("deletionTimestamp") else obj

    async def lookup(self, namespace: str) -> dict[str, Any] | None:
        if namespace in self.items:
            return self.items[namespace]
        obj = await rest.get(self.api, rest.path(API_VERSION, "namespaceoffloadings", NAMESPACE_OFFLOADING, namespace))
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return None
        return obj


class JobCache:
    """The workloads (Jobs; with `api_version` and `plural` another kind, JobSets) that pods being
    admitted belong to, read once per object and kept for `ttl_s` (a workload's pods are created
    together; its shape is what matters here). A lookup that names a `uid` the kept object does not
    have reads again (the object was deleted and created anew under the same name)."""

    def __init__(
        self, api: Any, ttl_s: float = 60.0, size: int = 1024, *, api_version: str = "batch/v1", plural: str = "jobs"
    ) -> None:
        self.api = api
        self.ttl_s = ttl_s
        self.size = size
        self.api_version = api_version
        self.plural = plural
        self._items: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    async def lookup(self, namespace: str, name: str, uid: str = "") -> dict[str, Any] | None:
        now = asyncio.get_running_loop().time()
        key = (namespace, name)
        hit = self._items.get(key)
        if hit is not None and now - hit[0] < self.ttl_s and (not uid or _uid(hit[1]) == uid):
            return hit[1]
        obj = await rest.get(self.api, rest.path(self.api_version, self.plural, name, namespace=namespace))
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (now, obj)
        return obj


def _uid(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


#: At most this many claims of one pod are looked up (a pod names few; Kubernetes allows many volumes).
MAX_CLAIMS = 16


class ClaimPlaces:
    """Where the claims of a pod being admitted keep their data (`forge.claims.data_place`): each
    claim and its volume read live (a claim is bound between one pod and the next), StorageClasses'
    provisioners kept for `ttl_s`."""

    def __init__(self, api: Any, ttl_s: float = 60.0) -> None:
        self.api = api
        self.ttl_s = ttl_s
        self._classes: dict[str, tuple[float, str]] = {}

    async def _provisioner(self, name: str) -> str:
        now = asyncio.get_running_loop().time()
        hit = self._classes.get(name)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        sc = await rest.get(self.api, rest.path("storage.k8s.io/v1", "storageclasses", name)) if name else None
        value = str((sc or {}).get("provisioner") or "")
        if len(self._classes) >= 256:
            self._classes.clear()
        self._classes[name] = (now, value)
        return value

    async def lookup(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, str | None]:
        places: dict[str, str | None] = {}
        for name in claim_names(pod)[:MAX_CLAIMS]:
            claim = await rest.get(self.api, rest.path("v1", "persistentvolumeclaims", name, namespace=namespace))
            volume_name = str(((claim or {}).get("spec") or {}).get("volumeName") or "")
            volume = (
                await rest.get(self.api, rest.path("v1", "persistentvolumes", volume_name)) if volume_name else None
            )
            cls = str(((claim or {}).get("spec") or {}).get("storageClassName") or "")
            decides, provider = data_place(claim, volume, await self._provisioner(cls) if claim else "")
            if decides:
                places[name] = provider
        return places


class Webhook:
    """Serves the offloading webhook until cancelled; `ready` once it answers and is registered."""

    def __init__(self, api: Any, settings: WebhookServerSettings) -> None:
        self.api = api
        self.settings = settings
        self.cache = OffloadingCache(api)
        self.jobs = JobCache(api)
        self.jobsets = JobCache(api, api_version=JOBSET_API_VERSION, plural="jobsets")
        self.claims = ClaimPlaces(api)
        self.ready = asyncio.Event()
        self.material: TLSMaterial | None = None
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._log = structlog.get_logger().bind(component="webhook", port=settings.port)

    # ---- HTTP

    async def _mutate(self, request: web.Request) -> web.Response:
        try:
            review = json.loads(await request.read())
            req = review.get("request") if isinstance(review, dict) else None
            namespace = str((req or {}).get("namespace") or "") if isinstance(req, dict) else ""
            offloading = await self.cache.lookup(namespace) if namespace else None
            pod = (req or {}).get("object") if isinstance(req, dict) else None
            job = await self._workload(namespace, pod) if offloading is not None and isinstance(pod, dict) else None
            places = (
                await self.claims.lookup(namespace, pod) if offloading is not None and isinstance(pod, dict) else {}
            )
            answer = review_response(review, offloading, job, places)
        except (ValueError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"malformed AdmissionReview: {e}"}, status=400)
        except RecursionError:  # json.loads (or a deep copy) of absurdly nested input
            return web.json_response({"error": "malformed AdmissionReview: nested too deeply"}, status=400)
        except KubeError as e:
            # Fail closed (see the failure policy): the API server refuses the pod with this message.
            self._log.warning("offloading lookup failed", error=str(e)[:300])
            uid = review["request"]["uid"] if isinstance(review.get("request"), dict) else ""
            answer = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": uid,
                    "allowed": False,
                    "status": {"code": 503, "message": f"gpufed cannot read the namespace's offloading: {e}"},
                },
            }
        resp = answer["response"]
        if "patch" in resp:
            self._log.info("pod mutated", namespace=namespace, pod=_pod_name(review))
        return web.json_response(answer)

    async def _workload(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """What the pod is judged with: its JobSet (with `kind`, which tells it from a Job) when its
        labels name one that exists, else the Job that controls it, else None. A JobSet's labels that
        are not what JobSet's controller writes are judged with the Job: the webhook refuses them then
        (`review_response`) only where the Job alone would."""
        try:
            ref = jobset_owner(pod)
        except GroupError:
            ref = None
        if ref is not None:
            jobset = await self.jobsets.lookup(namespace, ref.name, ref.uid)
            if jobset is not None and (not ref.uid or _uid(jobset) == ref.uid):
                return {**jobset, "kind": JOBSET_KIND}
        owner = job_owner(pod)
        return await self.jobs.lookup(namespace, owner) if owner else None

    async def _mutate_workloads(self, request: web.Request) -> web.Response:
        try:
            review = json.loads(await request.read())
            answer = workloads_response(review)
        except (ValueError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"malformed AdmissionReview: {e}"}, status=400)
        except RecursionError:
            return web.json_response({"error": "malformed AdmissionReview: nested too deeply"}, status=400)
        if "patch" in answer["response"]:
            self._log.info("queued workload given its pods' fit affinity", object=_pod_name(review))
        return web.json_response(answer)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # ---- TLS

    async def _tls(self) -> tuple[TLSMaterial, bool]:
        """The stored material when usable, else newly issued and stored; (material, whether new)."""
        return await servingtls.ensure(
            self.api,
            SYSTEM_NAMESPACE,
            TLS_SECRET,
            self.settings.dns_name,
            days=self.settings.cert_days,
            renew_before=self.settings.renew_before,
            ca_name="gpufed-webhook-ca",
        )

    async def _load(self, material: TLSMaterial) -> None:
        """Load `material` into the server's TLS context (new connections use it at once)."""

        def load() -> None:
            with tempfile.TemporaryDirectory(prefix="gpufed-webhook-") as d:
                cert, key = Path(d) / "tls.crt", Path(d) / "tls.key"
                cert.write_bytes(material.cert_pem)
                key.touch(mode=0o600)
                key.write_bytes(material.key_pem)
                self._ssl.load_cert_chain(cert, key)

        await asyncio.to_thread(load)
        self.material = material

    async def _register(self, material: TLSMaterial) -> None:
        await rest.apply(
            self.api,
            rest.path("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", WEBHOOK_CONFIGURATION),
            webhook_configuration(
                self.settings.host, self.settings.port, material.ca_pem, service=self.settings.service
            ),
        )

    async def _serving(self, material: TLSMaterial) -> None:
        """Wait until the server answers (on the address the API server uses, or — behind a Service —
        on this replica, for the Service's name), trusting only our CA."""
        ctx = ssl.create_default_context(cadata=material.ca_pem.decode())
        if self.settings.service is not None:
            url, server_hostname = f"https://127.0.0.1:{self.settings.port}/healthz", self.settings.dns_name
        else:
            url_host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
            url, server_hostname = f"https://{url_host}:{self.settings.port}/healthz", None
        last: object = "no answer"
        for _attempt in range(50):
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(url, ssl=ctx, server_hostname=server_hostname, timeout=aiohttp.ClientTimeout(total=2)) as r,
                ):
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                last = e
            await asyncio.sleep(0.1)
        raise KubeError(f"the webhook does not answer on {url}: {last}")

    async def _renewals(self) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_check_s)
            material, new = await self._tls()
            if new or material != self.material:
                await self._load(material)
                await self._register(material)

    # ---- run

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(MUTATE_PATH, self._mutate)
        app.router.add_post(MUTATE_WORKLOADS_PATH, self._mutate_workloads)
        app.router.add_get("/healthz", self._healthz)
        return app

    async def run(self) -> None:
        material, _new = await self._tls()
        await self._load(material)
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        # A DNS name or a Service in front: every interface.
        bind = self.settings.host if _is_ip(self.settings.host) and self.settings.service is None else "0.0.0.0"  # noqa: S104
        try:
            await web.TCPSite(runner, bind, self.settings.port, ssl_context=self._ssl).start()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(
                    watch(
                        self.api,
                        rest.path(API_VERSION, "namespaceoffloadings"),
                        self.cache.on_event,
                        what="webhook-offloadings",
                    )
                )
                await self._serving(material)
                await self._register(material)
                self._log.info("webhook serving", host=self.settings.host, failure_policy=FAILURE_POLICY)
                self.ready.set()
                tg.create_task(self._renewals())
        finally:
            await asyncio.shield(runner.cleanup())


def _pod_name(review: Mapping[str, Any]) -> str:
    obj = (review.get("request") or {}).get("object") or {}
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")
