"""The kubelet HTTPS API of a virtual node: what `kubectl logs/exec/attach/port-forward/top` reach.

Owns the aiohttp server on the address and port the Node publishes
(`status.addresses`, `daemonEndpoints.kubeletEndpoint.Port`), with the routes of a kubelet:

- `GET /containerLogs/{ns}/{pod}/{container}` — follow, previous, timestamps, tailLines,
  limitBytes, sinceSeconds, sinceTime (exclusive with sinceSeconds), stream; validated like the
  kubelet (400 with the reason), streamed with a flush per chunk while the provider produces;
- `/exec/{ns}/{pod}[/{uid}]/{container}`, `/attach/…` (query `command`, `input`, `output`,
  `error`, `tty`) and `/portForward/{ns}/{pod}[/{uid}]` — upgraded to SPDY/3.1 with the
  `v5…v2.channel.k8s.io` / `portforward.k8s.io` protocols (`streams` speaks them). WebSocket is not
  offered: the node does not declare `ExtendWebSocketsToKubelet`, so API servers translate
  WebSocket clients to SPDY before they reach us;
- `GET /pods` (PodList of the pods bound to this node), `/runningpods/` (those whose twin runs at
  the provider, each with only its name, namespace, UID and containers, as a kubelet lists what its
  runtime runs), `/healthz`, `/stats/summary` (stats/v1alpha1
  Summary) and `/metrics/resource` (Prometheus text with the names and labels metrics-server reads:
  node_/container_cpu_usage_seconds_total, node_/container_memory_working_set_bytes,
  container_start_time_seconds; `container`, `pod`, `namespace` labels), from `pod_usage`.

Every request — `/healthz` and `/metrics/resource` included — is authenticated and authorised
first (`auth`): anonymous 401, not allowed 403, an unknown bearer token beyond its source's review
budget 429 (no TokenReview made). A pod not bound to this node (or unknown, or whose UID differs
from the URL's) is 404 — this door never reaches pods of other nodes. Provider refusals map to 404
(NotFound), 400 (InvalidInput) or 502 with the provider's message.

Does not: obtain its certificate (`servingcert`), or reach the provider itself (`StreamingProvider`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpufed.kube.client import KubeError
from gpufed.kube.times import parse_rfc3339, rfc3339
from vkprovider.kubelet import streams
from vkprovider.kubelet.auth import (
    Authenticator,
    Authorizer,
    ReviewLimitedError,
    User,
    attributes,
    user_from_peercert,
)
from vkprovider.kubelet.servingcert import ServingTLS
from vkprovider.node.provider import (
    INVALID_INPUT,
    NOT_FOUND,
    LogOptions,
    PodUsage,
    ProviderError,
    StreamingProvider,
)
from vkprovider.spdy.session import Session

#: Seconds between checks whether the container of a followed log has ended, and the time its
#: last lines get to arrive after it did.
LOG_POLL_S = 1.0
LOG_DRAIN_S = 2.0
#: Seconds a port-forward connection may stay without any forwarded stream (kubelet: 4 h).
DEFAULT_STREAM_IDLE_S = 4 * 3600.0
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})


USER = web.RequestKey("user", User)


class PodSource(Protocol):
    """The local pods bound to this node (the pod controller's view)."""

    def bound_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def bound_pods(self) -> list[Mapping[str, Any]]: ...

    def running_pods(self) -> list[Mapping[str, Any]]:
        """The bound pods whose twin runs at the provider (what a kubelet's container runtime runs)."""
        ...


@dataclass(frozen=True)
class KubeletAPISettings:
    node: str
    host: str
    port: int
    stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_S


def running_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as a kubelet's `/runningpods/` lists it: what its container runtime knows (name,
    namespace, UID, and each container's name and image), not the API object."""
    meta = pod.get("metadata") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
        "spec": {"containers": [{k: c[k] for k in ("name", "image") if k in c} for c in containers]},
        "status": {},
    }


class BadRequestError(Exception):
    pass


def _bool(q: Mapping[str, str], name: str) -> bool:
    v = q.get(name)
    if v is None or v == "":
        return False
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise BadRequestError(f"invalid value for {name}: {v!r}")


def _int(q: Mapping[str, str], name: str, minimum: int) -> int | None:
    v = q.get(name)
    if v is None or v == "":
        return None
    try:
        n = int(v)
    except ValueError:
        raise BadRequestError(f"invalid value for {name}: {v!r}") from None
    if n < minimum:
        raise BadRequestError(f"{name} must be >= {minimum}, got {n}")
    return n


def log_options(q: Mapping[str, str]) -> LogOptions:
    """LogOptions from the kubelet's query parameters, validated like the kubelet (BadRequestError)."""
    since_time = q.get("sinceTime") or None
    if since_time is not None:
        try:
            parse_rfc3339(since_time)
        except ValueError:
            raise BadRequestError(f"invalid sinceTime {since_time!r}: not RFC 3339") from None
    opts = LogOptions(
        follow=_bool(q, "follow"),
        previous=_bool(q, "previous"),
        timestamps=_bool(q, "timestamps"),
        tail_lines=_int(q, "tailLines", 0),
        limit_bytes=_int(q, "limitBytes", 1),
        since_seconds=_int(q, "sinceSeconds", 1),
        since_time=since_time,
        stream=q.get("stream") or None,
    )
    if opts.since_seconds is not None and opts.since_time is not None:
        raise BadRequestError("at most one of sinceSeconds or sinceTime may be specified")
    if opts.stream not in (None, "All", "Stdout", "Stderr"):
        raise BadRequestError(f"invalid stream {opts.stream!r}")
    return opts


def command_request(q: Any) -> streams.CommandRequest:
    req = streams.CommandRequest(
        stdin=_bool(q, "input"), stdout=_bool(q, "output"), stderr=_bool(q, "error"), tty=_bool(q, "tty")
    )
    if not (req.stdin or req.stdout or req.stderr):
        raise BadRequestError("you must specify at least 1 of stdin, stdout, stderr")
    if req.tty and req.stderr:
        raise BadRequestError("tty and stderr cannot both be true")
    return req


# ---- metrics


class _Usage:
    """A custom prometheus_client collector over one set of samples."""

    def __init__(self, usage: Sequence[PodUsage]) -> None:
        self.usage = usage

    def collect(self) -> list[Metric]:
        ccpu = CounterMetricFamily(
            "container_cpu_usage_seconds",
            "[ALPHA] Cumulative cpu time consumed by the container in core-seconds",
            labels=["container", "pod", "namespace"],
        )
        cmem = GaugeMetricFamily(
            "container_memory_working_set_bytes",
            "[ALPHA] Current working set of the container in bytes",
            labels=["container", "pod", "namespace"],
        )
        cstart = GaugeMetricFamily(
            "container_start_time_seconds",
            "[ALPHA] Start time of the container since unix epoch in seconds",
            labels=["container", "pod", "namespace"],
        )
        pcpu = CounterMetricFamily(
            "pod_cpu_usage_seconds",
            "[ALPHA] Cumulative cpu time consumed by the pod in core-seconds",
            labels=["pod", "namespace"],
        )
        pmem = GaugeMetricFamily(
            "pod_memory_working_set_bytes",
            "[ALPHA] Current working set of the pod in bytes",
            labels=["pod", "namespace"],
        )
        ncpu = CounterMetricFamily(
            "node_cpu_usage_seconds", "[ALPHA] Cumulative cpu time consumed by the node in core-seconds"
        )
        nmem = GaugeMetricFamily("node_memory_working_set_bytes", "[ALPHA] Current working set of the node in bytes")
        total_cpu, total_mem, latest = 0.0, 0, 0.0
        for p in self.usage:
            for c in p.containers:
                labels = [c.name, p.name, p.namespace]
                ccpu.add_metric(labels, c.cpu_seconds, timestamp=p.timestamp)
                cmem.add_metric(labels, float(c.memory_working_set_bytes), timestamp=p.timestamp)
                cstart.add_metric(labels, c.start_time, timestamp=p.timestamp)
            cpu = sum(c.cpu_seconds for c in p.containers)
            mem = sum(c.memory_working_set_bytes for c in p.containers)
            pcpu.add_metric([p.name, p.namespace], cpu, timestamp=p.timestamp)
            pmem.add_metric([p.name, p.namespace], float(mem), timestamp=p.timestamp)
            total_cpu, total_mem, latest = total_cpu + cpu, total_mem + mem, max(latest, p.timestamp)
        if self.usage:
            ncpu.add_metric([], total_cpu, timestamp=latest)
            nmem.add_metric([], float(total_mem), timestamp=latest)
        return [cstart, ccpu, cmem, pcpu, pmem, ncpu, nmem]


def metrics_text(usage: Sequence[PodUsage]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Usage(usage))
    return generate_latest(registry)


def stats_summary(node: str, start_time: float, usage: Sequence[PodUsage]) -> dict[str, Any]:
    """A stats/v1alpha1 Summary of the pods' usage (the node's own figures are their sums)."""

    def cpu(t: float, cores: float, seconds: float) -> dict[str, Any]:
        return {"time": rfc3339(t), "usageNanoCores": int(cores * 1e9), "usageCoreNanoSeconds": int(seconds * 1e9)}

    def mem(t: float, ws: int) -> dict[str, Any]:
        return {"time": rfc3339(t), "workingSetBytes": ws, "usageBytes": ws}

    pods = []
    now = time.time()
    for p in usage:
        pods.append(
            {
                "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                "startTime": rfc3339(min((c.start_time for c in p.containers), default=p.timestamp)),
                "containers": [
                    {
                        "name": c.name,
                        "startTime": rfc3339(c.start_time),
                        "cpu": cpu(p.timestamp, c.cpu_cores, c.cpu_seconds),
                        "memory": mem(p.timestamp, c.memory_working_set_bytes),
                    }
                    for c in p.containers
                ],
                "cpu": cpu(
                    p.timestamp, sum(c.cpu_cores for c in p.containers), sum(c.cpu_seconds for c in p.containers)
                ),
                "memory": mem(p.timestamp, sum(c.memory_working_set_bytes for c in p.containers)),
            }
        )
    return {
        "node": {
            "nodeName": node,
            "startTime": rfc3339(start_time),
            "cpu": cpu(
                now,
                sum(c.cpu_cores for p in usage for c in p.containers),
                sum(c.cpu_seconds for p in usage for c in p.containers),
            ),
            "memory": mem(now, sum(c.memory_working_set_bytes for p in usage for c in p.containers)),
        },
        "pods": pods,
    }


# ---- the server


class _Feeder:
    """Hands the bytes of an upgraded connection to an asyncio.StreamReader (aiohttp parser slot)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.reader.feed_data(data)
        return False, b""

    def feed_eof(self) -> None:
        self.reader.feed_eof()


class _TransportWriter:
    """ByteWriter over the transport of an upgraded aiohttp request."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.protocol = cast(Any, request.protocol)

    def write(self, data: bytes) -> None:
        t = self.request.transport
        if t is None or t.is_closing():
            raise ConnectionResetError("connection closed")
        t.write(data)

    async def drain(self) -> None:
        await self.protocol._drain_helper()

    def close(self) -> None:
        t = self.request.transport
        if t is not None:
            t.close()


class KubeletAPI:
    def __init__(
        self,
        api: Any,
        settings: KubeletAPISettings,
        pods: PodSource,
        provider: StreamingProvider,
        tls: ServingTLS,
    ) -> None:
        self.settings = settings
        self.pods = pods
        self.provider = provider
        self.tls = tls
        self.authn = Authenticator(api)
        self.authz = Authorizer(api, settings.node)
        self.ready = asyncio.Event()
        self.started = time.time()
        self._log = structlog.get_logger().bind(node=settings.node)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024)
        app.add_routes(
            [
                web.get("/healthz", self._healthz),
                web.get("/pods", self._pods),
                web.get("/pods/", self._pods),
                web.get("/runningpods", self._running_pods),
                web.get("/runningpods/", self._running_pods),
                web.get("/containerLogs/{namespace}/{pod}/{container}", self._logs),
                web.get("/stats/summary", self._summary),
                web.get("/stats/summary/", self._summary),
                web.get("/metrics/resource", self._metrics),
                web.get("/metrics/resource/", self._metrics),
            ]
        )
        for verb in ("exec", "attach"):
            for tail in ("{container}", "{uid}/{container}"):
                path = f"/{verb}/{{namespace}}/{{pod}}/{tail}"
                app.router.add_route("POST", path, self._command)
                app.router.add_route("GET", path, self._command)
        for path in ("/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"):
            app.router.add_route("POST", path, self._port_forward)
            app.router.add_route("GET", path, self._port_forward)
        return app

    async def run(self) -> None:
        await self.tls.ready.wait()
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.settings.host, self.settings.port, ssl_context=self.tls.context)
            await site.start()
            self._log.info("kubelet API serving", address=f"{self.settings.host}:{self.settings.port}")
            self.ready.set()
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(runner.cleanup())

    # ---- authn/authz

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        transport = request.transport
        user: User | None = user_from_peercert(transport.get_extra_info("peercert") if transport else None)
        if user is None:
            header = request.headers.get("Authorization", "")
            if header[:7].lower() == "bearer " and header[7:].strip():
                try:
                    user = await self.authn.from_token(header[7:].strip(), request.remote or "")
                except ReviewLimitedError:
                    return web.Response(
                        status=429,
                        headers={"Retry-After": "1"},
                        text="Too many requests with unknown tokens: retry later\n",
                    )
                except KubeError as e:
                    self._log.warning("token review failed", error=str(e))
                    return web.Response(status=401, text="Unauthorized: the token could not be verified\n")
        if user is None:
            return web.Response(status=401, text="Unauthorized\n")
        verb, subresources = attributes(request.method, request.path)
        try:
            allowed = await self.authz.allowed_any(user, verb, subresources)
        except KubeError as e:
            self._log.warning("access review failed", error=str(e), user=user.name)
            return web.Response(status=500, text="Authorization error: access review failed\n")
        if not allowed:
            self._log.info("kubelet API access denied", user=user.name, verb=verb, subresource=subresources[-1])
            return web.Response(
                status=403,
                text=f"Forbidden (user={user.name}, verb={verb}, resource=nodes, subresource={subresources[-1]})\n",
            )
        request[USER] = user
        return await handler(request)

    # ---- helpers

    def _pod(self, request: web.Request) -> Mapping[str, Any]:
        ns, name = request.match_info["namespace"], request.match_info["pod"]
        if not _NAME.match(ns) or not _NAME.match(name):
            raise web.HTTPBadRequest(text=f"invalid pod reference {ns!r}/{name!r}\n")
        pod = self.pods.bound_pod(ns, name)
        uid = request.match_info.get("uid")
        if pod is None or (uid and pod["metadata"].get("uid") != uid):
            raise web.HTTPNotFound(text=f"pod {ns}/{name} not found on node {self.settings.node}\n")
        return pod

    @staticmethod
    def _container(pod: Mapping[str, Any], container: str) -> str:
        spec = pod.get("spec") or {}
        names = {
            c.get("name")
            for key in ("containers", "initContainers", "ephemeralContainers")
            for c in spec.get(key) or []
        }
        if container not in names:
            meta = pod["metadata"]
            raise web.HTTPNotFound(
                text=f"container {container!r} not found in pod {meta['namespace']}/{meta['name']}\n"
            )
        return container

    @staticmethod
    def _provider_error(e: ProviderError) -> web.HTTPException:
        text = f"{e}\n"
        if e.reason == NOT_FOUND:
            return web.HTTPNotFound(text=text)
        if e.reason == INVALID_INPUT:
            return web.HTTPBadRequest(text=text)
        return web.HTTPBadGateway(text=text)

    # ---- simple routes

    async def _healthz(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def _pods(self, _request: web.Request) -> web.StreamResponse:
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(self.pods.bound_pods())}
        return web.json_response(body)

    async def _running_pods(self, _request: web.Request) -> web.StreamResponse:
        body = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": [running_pod(p) for p in self.pods.running_pods()],
        }
        return web.json_response(body)

    async def _usage(self) -> list[PodUsage]:
        running = [p for p in self.pods.bound_pods() if (p.get("status") or {}).get("phase") == "Running"]
        try:
            return await self.provider.pod_usage(running)
        except ProviderError as e:
            raise self._provider_error(e) from e

    async def _summary(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(stats_summary(self.settings.node, self.started, await self._usage()))

    async def _metrics(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=metrics_text(await self._usage()), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    # ---- logs

    def _container_done(self, namespace: str, name: str, container: str, uid: str) -> bool:
        """The container will write no more: terminated, its pod finished, or the pod is gone."""
        pod = self.pods.bound_pod(namespace, name)
        if pod is None or pod["metadata"].get("uid") != uid:
            return True
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return True
        for key in ("containerStatuses", "initContainerStatuses"):
            for cs in status.get(key) or []:
                if cs.get("name") == container and (cs.get("state") or {}).get("terminated"):
                    return True
        return False

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        meta = pod["metadata"]
        container = self._container(pod, request.match_info["container"])
        try:
            opts = log_options(request.query)
        except BadRequestError as e:
            raise web.HTTPBadRequest(text=f"{e}\n") from e
        chunks: AsyncIterator[bytes] = self.provider.container_logs(pod, container, opts)
        try:
            try:
                first = await anext(chunks)
            except StopAsyncIteration:
                first = b""
            except ProviderError as e:
                raise self._provider_error(e) from e
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            if first:
                await resp.write(first)

            async def copy() -> None:
                try:
                    async for chunk in chunks:
                        await resp.write(chunk)
                except ProviderError as e:
                    self._log.info("log stream ended by the provider", pod=meta["name"], error=str(e))

            copier = asyncio.create_task(copy())
            try:
                # Like a kubelet, a followed log ends when the container does (the provider's
                # stream may stay open: a remote API server cannot tell, kwok never does).
                while opts.follow and not copier.done():
                    await asyncio.wait({copier}, timeout=LOG_POLL_S)
                    if not copier.done() and self._container_done(
                        meta["namespace"], meta["name"], container, meta["uid"]
                    ):
                        await asyncio.wait({copier}, timeout=LOG_DRAIN_S)
                        copier.cancel()
                await asyncio.wait({copier})
            finally:
                copier.cancel()
            if not copier.cancelled() and (failure := copier.exception()) is not None:
                self._log.info("log stream to the client ended", pod=meta["name"], error=repr(failure))
                return resp
            await resp.write_eof()
            return resp
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    # ---- streams

    def _upgrade_protocol(self, request: web.Request, supported: tuple[str, ...]) -> str:
        upgrade = request.headers.get("Upgrade", "")
        if upgrade.lower() == "websocket":
            raise web.HTTPBadRequest(text="WebSocket streams are not served by this node; use SPDY/3.1\n")
        if upgrade.lower() != "spdy/3.1":
            raise web.HTTPBadRequest(text="this endpoint needs an upgrade to SPDY/3.1\n")
        offered = ",".join(request.headers.getall("X-Stream-Protocol-Version", []))
        protocol = streams.negotiate(offered, supported)
        if protocol is None:
            raise web.HTTPForbidden(
                text=f"protocol negotiation failed: offered {offered!r}, supported {', '.join(supported)}\n"
            )
        return protocol

    async def _upgrade(self, request: web.Request, protocol: str) -> tuple[web.StreamResponse, Session]:
        reader = asyncio.StreamReader()
        cast(Any, request.protocol).set_parser(_Feeder(reader))
        resp = web.StreamResponse(
            status=101,
            headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": protocol},
        )
        resp.force_close()
        await resp.prepare(request)
        return resp, Session(reader, _TransportWriter(request), client=False)

    async def _command(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        container = self._container(pod, request.match_info["container"])
        attach = request.path.startswith("/attach/")
        try:
            req = command_request(request.query)
        except BadRequestError as e:
            raise web.HTTPBadRequest(text=f"{e}\n") from e
        command = request.query.getall("command", [])
        if not attach and not command:
            raise web.HTTPBadRequest(text="no command given\n")
        protocol = self._upgrade_protocol(request, streams.REMOTE_COMMAND_PROTOCOLS)
        resp, session = await self._upgrade(request, protocol)
        what = f"{'attach' if attach else 'exec'} {pod['metadata']['namespace']}/{pod['metadata']['name']}/{container}"
        user = request[USER]
        self._log.info("stream opened", what=what, user=user.name, protocol=protocol)
        run: streams.RunCommand = (
            partial(self.provider.attach_to_container, pod, container)
            if attach
            else partial(self.provider.exec_in_container, pod, container, command)
        )
        await streams.serve_remote_command(session, protocol, req, run, what=what)
        self._log.info("stream closed", what=what, user=user.name)
        return resp

    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        protocol = self._upgrade_protocol(request, (streams.PORT_FORWARD_PROTOCOL,))
        resp, session = await self._upgrade(request, protocol)
        what = f"port-forward {pod['metadata']['namespace']}/{pod['metadata']['name']}"
        user = request[USER]
        self._log.info("stream opened", what=what, user=user.name)
        await streams.serve_port_forward(
            session,
            lambda port, conn: self.provider.port_forward(pod, port, conn),
            what=what,
            idle_timeout_s=self.settings.stream_idle_timeout_s,
        )
        self._log.info("stream closed", what=what, user=user.name)
        return resp


__all__ = ["KubeletAPI", "KubeletAPISettings", "PodSource", "log_options", "metrics_text", "stats_summary"]
