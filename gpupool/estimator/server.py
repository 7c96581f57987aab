"""The provider's capacity estimator: live, aggregated GPU capacity over gRPC with mutual TLS.

Owns:
- the inventory: watches of the cluster's Nodes and Pods (all namespaces), and where the cluster
  serves resource.k8s.io/v1 its ResourceSlices, DeviceClasses and ResourceClaims (DRA devices,
  `gpupool.devices`), feeding a `gpupool.inventory.Inventory`; after each effective change
  (debounced by `debounce_s`) a new snapshot is computed and, when any aggregate differs,
  published under the next revision;
- the service `gpufed.estimator.v1.Estimator` (estimator.proto): GetCapacity, CanPlace,
  MaxReplicas, and Watch (the current snapshot at once, then one per published revision, and a
  heartbeat — the same figures with a fresh `observed_at` — after `heartbeat_s` without one);
- who may ask: TLS with client certificates REQUIRED, trusted only when issued by the cluster's
  client CA (`client-ca-file` of ConfigMap kube-system/extension-apiserver-authentication, what the
  API server and aggregated API servers trust; watched, and a new CA is used from the next
  handshake on); a caller is served only when its certificate names a consumer identity
  (CN `gpufed:consumer:<cluster-id>`, O `gpufed:consumers`, see `peering.handshake`) AND that
  consumer's Tenant exists here with phase Authenticated (a watch cache; checked on every call and
  before every message of a Watch stream, so unpeering ends a stream). Others get
  UNAUTHENTICATED / PERMISSION_DENIED with a sentence saying why;
- the serving certificate: self-signed (its own CA) for the advertised host, key and certificate
  kept in Secret gpufed/gpufed-estimator-tls and reused across restarts; re-issued when it expires
  within `renew_before`, does not name the advertised host, or does not load;
- the ConfigMap gpufed/gpufed-estimator (`endpoint`: the advertised host:port, `ca.crt`: the
  serving certificate), server-side applied at start, on renewal and every `renew_check_s`; every
  consumer may read it (deploy/rbac/consumer.yaml).

Metrics: `gpufed_estimator_requests_total{method,outcome}` (outcome "ok", or the refusal's code in
lower case: "unauthenticated", "permission_denied"; a Watch counts "ok" once when it opens, and a
refusal when it is refused, at its start or later) and `gpufed_estimator_watch_streams` (open Watch
streams). No consumer label: the figures are the same for every consumer.

Invariants: answers are aggregates only — never node names, pod names or objects; the private key
never leaves the Secret and this process and is never logged; `ready` is set once the caches are
synced, the server listens and the ConfigMap is published.

Does not: decide grants (`peering.grants`), or limit what a consumer may use (quotas do): the
figures are the whole cluster's, the same for every consumer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

import grpc
import grpc.aio
import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID
from prometheus_client import Counter, Gauge

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    DRA_API_PATH,
    ESTIMATOR_CONFIGMAP,
    ESTIMATOR_TLS_SECRET,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    parse_cluster_id,
)
from gpufed.errors import GpufedError
from gpufed.kube import rest, servingtls
from gpufed.kube.servingtls import TLSMaterial
from gpufed.kube.watch import watch
from gpupool.capacity import Snapshot
from gpupool.estimator import estimator_pb2 as pb
from gpupool.estimator import wire
from gpupool.inventory import Inventory
from peering.handshake import CONSUMER_GROUP, consumer_user

DEFAULT_DEBOUNCE_S = 0.2
DEFAULT_HEARTBEAT_S = 10.0
#: Lifetime of a newly issued serving certificate.
DEFAULT_CERT_DAYS = servingtls.DEFAULT_CERT_DAYS
#: Re-issue the serving certificate when less than this is left.
DEFAULT_RENEW_BEFORE = servingtls.DEFAULT_RENEW_BEFORE
#: Seconds between renewal checks (which also re-apply the ConfigMap).
DEFAULT_RENEW_CHECK_S = 3600.0
#: Seconds in-flight calls get to finish when the server stops.
STOP_GRACE_S = 1.0
CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
CLIENT_CA_KEY = "client-ca-file"
AUTHENTICATED = "Authenticated"
#: `gpufed:consumer:` — the CN prefix of every consumer identity.
CONSUMER_PREFIX = consumer_user(ClusterID(""))
REQUESTS = Counter(
    "gpufed_estimator_requests_total",
    "Calls to the capacity estimator by method and outcome (ok, unauthenticated, permission_denied).",
    ["method", "outcome"],
)
WATCH_STREAMS = Gauge("gpufed_estimator_watch_streams", "Capacity Watch streams open at the estimator.")
_UNSPECIFIED_HOSTS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 -- recognised to be refused as an advertised host


class EstimatorConfigError(GpufedError, ValueError):
    """The settings cannot work (e.g. an advertised address that is not host:port)."""


@dataclass(frozen=True)
class EstimatorServerSettings:
    #: TCP port to listen on (0: any free port; the advertised endpoint then names the bound one).
    port: int
    #: Address to listen on (an IP address or a host name; 0.0.0.0 / :: for every interface).
    host: str = "127.0.0.1"
    #: host:port consumers reach the estimator on (ConfigMap `endpoint`, in the certificate's SAN);
    #: None: `host` and the bound port (then `host` must be a specific address).
    address: str | None = None
    #: Seconds changes are coalesced before a new snapshot is computed and streamed.
    debounce_s: float = DEFAULT_DEBOUNCE_S
    #: Seconds without a change after which a Watch stream gets a heartbeat snapshot.
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    #: Lifetime in days of a newly issued serving certificate.
    cert_days: int = DEFAULT_CERT_DAYS
    #: Re-issue the serving certificate when less than this is left.
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE
    #: Seconds between renewal checks.
    renew_check_s: float = DEFAULT_RENEW_CHECK_S


# ---- endpoints


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; EstimatorConfigError otherwise."""
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise EstimatorConfigError(f"{endpoint!r}: write IPv6 addresses in brackets, e.g. [fd00::1]:7443")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EstimatorConfigError(f"{endpoint!r} is not host:port (e.g. 10.0.0.5:7443 or estimator.example:7443)")
    return host, int(port)


def join_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised_host(settings: EstimatorServerSettings) -> str:
    """The host consumers connect to (what the serving certificate must name)."""
    if settings.address is not None:
        return split_endpoint(settings.address)[0]
    if settings.host in _UNSPECIFIED_HOSTS:
        raise EstimatorConfigError(
            f"the estimator listens on every interface ({settings.host or 'no host'}): "
            "give the address consumers reach it on (--estimator-address host:port)"
        )
    return settings.host


# ---- who may ask


class RefusalError(Exception):
    """A call that is not served; `code` is the gRPC status it ends with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def consumer_of(cert_pem: bytes) -> ClusterID:
    """The consumer a client certificate (already verified against the client CA) stands for."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise RefusalError(grpc.StatusCode.UNAUTHENTICATED, f"the client certificate cannot be read: {e}") from e
    cns = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    refusal = RefusalError(
        grpc.StatusCode.PERMISSION_DENIED,
        f"the client certificate's subject {cert.subject.rfc4514_string()!r} is not a gpufed consumer "
        f"(expected CN={CONSUMER_PREFIX}<cluster-id>, O={CONSUMER_GROUP})",
    )
    if len(cns) != 1 or not cns[0].startswith(CONSUMER_PREFIX) or CONSUMER_GROUP not in orgs:
        raise refusal
    try:
        consumer = parse_cluster_id(cns[0][len(CONSUMER_PREFIX) :])
    except ValueError as e:
        raise refusal from e
    return consumer


def authorize(auth_context: Mapping[str, Iterable[bytes]], tenants: Mapping[str, str]) -> ClusterID:
    """The consumer a call comes from, if it may be served: its certificate names a consumer whose
    Tenant (`tenants`: consumer -> phase) is Authenticated. Raises RefusalError otherwise."""
    pems = list(auth_context.get("x509_pem_cert", ()))
    if not pems:
        raise RefusalError(
            grpc.StatusCode.UNAUTHENTICATED,
            "a client certificate is required: use the consumer credentials this cluster issued when peering",
        )
    consumer = consumer_of(pems[0])
    phase = tenants.get(consumer)
    if phase is None:
        raise RefusalError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"consumer {consumer} is not peered with this cluster (there is no Tenant for it)",
        )
    if phase != AUTHENTICATED:
        raise RefusalError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"consumer {consumer} is not authenticated here (its Tenant is {phase}, not {AUTHENTICATED})",
        )
    return consumer


# ---- the server

_Fetcher = Callable[[], grpc.ServerCertificateConfiguration]


class EstimatorServer:
    """Serves the estimator until cancelled; `ready` once it serves and is published."""

    def __init__(self, api: Any, settings: EstimatorServerSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.inventory = Inventory()
        self.ready = asyncio.Event()
        #: The advertised host:port, once listening.
        self.endpoint: str | None = None
        #: consumer ClusterID -> its Tenant's phase (Tenants being deleted are left out).
        self.tenants: dict[str, str] = {}
        self.snapshot: Snapshot | None = None
        self.client_ca: bytes | None = None
        self.cert: TLSMaterial | None = None
        self._seen_changes = -1
        self._dirty = asyncio.Event()
        self._published = asyncio.Event()
        self._synced: dict[str, asyncio.Event] = {w: asyncio.Event() for w in ("nodes", "pods", "tenants", "ca")}
        # The TLS configuration grpc picks up at the next handshake (None: unchanged). grpc calls
        # the fetcher from its own threads, hence the lock.
        self._next_config: grpc.ServerCertificateConfiguration | None = None
        self._config_lock = threading.Lock()
        self._log = structlog.get_logger().bind(component="estimator")

    # ---- informers

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.inventory.delete_node(str(obj["metadata"]["name"]))
        else:
            self.inventory.set_node(obj)
        self._touch()

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if kind == "DELETED":
            self.inventory.delete_pod(str(meta.get("namespace") or ""), str(meta["name"]))
        else:
            self.inventory.set_pod(obj)
        self._touch()

    def _on_slice(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.inventory.devices.delete_slice(str(obj["metadata"]["name"]))
        else:
            self.inventory.devices.set_slice(obj)
        self._touch()

    def _on_class(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.inventory.devices.delete_class(str(obj["metadata"]["name"]))
        else:
            self.inventory.devices.set_class(obj)
        self._touch()

    def _on_claim(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if kind == "DELETED":
            self.inventory.devices.delete_claim(str(meta.get("namespace") or ""), str(meta["name"]))
        else:
            self.inventory.devices.set_claim(obj)
        self._touch()

    def _changes(self) -> int:
        return self.inventory.changes + self.inventory.devices.changes

    def _touch(self) -> None:
        if self._changes() != self._seen_changes:
            self._dirty.set()

    def _on_tenant(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        consumer = str((obj.get("spec") or {}).get("consumerClusterId") or meta.get("name") or "")
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            self.tenants.pop(consumer, None)
        else:
            self.tenants[consumer] = str((obj.get("status") or {}).get("phase") or "Pending")

    def _on_client_ca(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._log.warning("client CA ConfigMap deleted; keeping the CA loaded before")
            return
        ca = str((obj.get("data") or {}).get(CLIENT_CA_KEY) or "").encode()
        if not ca or ca == self.client_ca:
            return
        try:
            x509.load_pem_x509_certificates(ca)
        except ValueError as e:
            self._log.warning("client CA unreadable; keeping the one loaded before", error=str(e))
            return
        self.client_ca = ca
        self._synced["ca"].set()
        if self.cert is not None:
            self._reconfigure()
            self._log.info("client CA reloaded")

    # ---- TLS

    def _config(self) -> grpc.ServerCertificateConfiguration:
        assert self.cert is not None and self.client_ca is not None
        return grpc.ssl_server_certificate_configuration(
            [(self.cert.key_pem, self.cert.cert_pem)], root_certificates=self.client_ca
        )

    def _reconfigure(self) -> None:
        config = self._config()
        with self._config_lock:
            self._next_config = config

    def _fetch_config(self) -> grpc.ServerCertificateConfiguration | None:
        with self._config_lock:
            config, self._next_config = self._next_config, None
        return config

    async def _serving_cert(self, host: str) -> tuple[TLSMaterial, bool]:
        """The stored certificate when usable, else a new one, stored; (material, whether new)."""
        return await servingtls.ensure(
            self.api,
            SYSTEM_NAMESPACE,
            ESTIMATOR_TLS_SECRET,
            host,
            days=self.settings.cert_days,
            renew_before=self.settings.renew_before,
            ca_name="gpufed-estimator-ca",
        )

    async def _publish_configmap(self) -> None:
        assert self.endpoint is not None and self.cert is not None
        await rest.apply(
            self.api,
            rest.path("v1", "configmaps", ESTIMATOR_CONFIGMAP, namespace=SYSTEM_NAMESPACE),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": ESTIMATOR_CONFIGMAP,
                    "namespace": SYSTEM_NAMESPACE,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                },
                "data": {"endpoint": self.endpoint, "ca.crt": self.cert.ca_pem.decode()},
            },
        )

    async def _renewals(self, host: str) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_check_s)
            cert, new = await self._serving_cert(host)
            if new or cert != self.cert:
                self.cert = cert
                self._reconfigure()
            await self._publish_configmap()

    # ---- snapshots

    def refresh(self) -> Snapshot:
        """Recompute the snapshot; a new revision only when an aggregate changed."""
        self._seen_changes = self._changes()
        current = self.snapshot
        revision = current.revision if current is not None else 0
        snap = self.inventory.snapshot(revision + 1, self.clock())
        if current is None or (snap.products, snap.devices) != (current.products, current.devices):
            self.snapshot = snap
            published, self._published = self._published, asyncio.Event()
            published.set()
        assert self.snapshot is not None
        return self.snapshot

    async def _publisher(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.debounce_s)
            self._dirty.clear()
            self.refresh()

    def _current(self) -> Snapshot:
        return self.snapshot if self.snapshot is not None else self.refresh()

    # ---- RPCs

    async def _authorize(self, context: grpc.aio.ServicerContext[Any, Any], what: str) -> ClusterID:
        try:
            return authorize(context.auth_context(), self.tenants)
        except RefusalError as r:
            self._log.warning("estimator call refused", call=what, peer=context.peer(), reason=r.message)
            REQUESTS.labels(what, r.code.name.lower()).inc()
            await context.abort(r.code, r.message)

    async def _get_capacity(
        self, request: pb.CapacityRequest, context: grpc.aio.ServicerContext[pb.CapacityRequest, pb.Snapshot]
    ) -> pb.Snapshot:
        await self._authorize(context, "GetCapacity")
        REQUESTS.labels("GetCapacity", "ok").inc()
        return wire.snapshot_to_pb(self._current())

    async def _can_place(
        self, request: pb.PodShape, context: grpc.aio.ServicerContext[pb.PodShape, pb.Placement]
    ) -> pb.Placement:
        await self._authorize(context, "CanPlace")
        REQUESTS.labels("CanPlace", "ok").inc()
        return wire.placement_to_pb(self.inventory.can_place(wire.shape_from_pb(request)))

    async def _max_replicas(
        self, request: pb.PodShape, context: grpc.aio.ServicerContext[pb.PodShape, pb.Replicas]
    ) -> pb.Replicas:
        await self._authorize(context, "MaxReplicas")
        REQUESTS.labels("MaxReplicas", "ok").inc()
        return wire.replicas_to_pb(*self.inventory.max_replicas(wire.shape_from_pb(request)))

    async def _watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext[pb.WatchRequest, pb.Snapshot]
    ) -> AsyncIterator[pb.Snapshot]:
        consumer = await self._authorize(context, "Watch")
        self._log.info("capacity watch opened", remote_cluster=consumer)
        REQUESTS.labels("Watch", "ok").inc()
        WATCH_STREAMS.inc()
        try:
            sent = self._current()
            yield wire.snapshot_to_pb(sent)
            while True:
                published = self._published
                current = self._current()
                if current.revision == sent.revision:
                    try:
                        async with asyncio.timeout(self.settings.heartbeat_s):
                            await published.wait()
                    except TimeoutError:
                        await self._authorize(context, "Watch")
                        yield wire.snapshot_to_pb(replace(sent, observed_at=self.clock()), heartbeat=True)
                    continue
                await self._authorize(context, "Watch")
                sent = current
                yield wire.snapshot_to_pb(sent)
        finally:
            WATCH_STREAMS.dec()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            wire.SERVICE,
            {
                "GetCapacity": grpc.unary_unary_rpc_method_handler(
                    self._get_capacity,
                    request_deserializer=pb.CapacityRequest.FromString,
                    response_serializer=pb.Snapshot.SerializeToString,
                ),
                "CanPlace": grpc.unary_unary_rpc_method_handler(
                    self._can_place,
                    request_deserializer=pb.PodShape.FromString,
                    response_serializer=pb.Placement.SerializeToString,
                ),
                "MaxReplicas": grpc.unary_unary_rpc_method_handler(
                    self._max_replicas,
                    request_deserializer=pb.PodShape.FromString,
                    response_serializer=pb.Replicas.SerializeToString,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self._watch,
                    request_deserializer=pb.WatchRequest.FromString,
                    response_serializer=pb.Snapshot.SerializeToString,
                ),
            },
        )

    # ---- run

    def _synced_cb(self, what: str) -> Callable[[], None]:
        return self._synced[what].set

    def _ca_listed(self) -> None:
        if self.client_ca is None:
            ns, name = CLIENT_CA_CONFIGMAP
            self._log.warning(
                "no client CA yet: the estimator waits for it", configmap=f"{ns}/{name}", key=CLIENT_CA_KEY
            )

    async def run(self) -> None:
        host = advertised_host(self.settings)
        listen = join_endpoint(self.settings.host or "0.0.0.0", self.settings.port)  # noqa: S104 -- no host: every interface
        ca_ns, ca_name = CLIENT_CA_CONFIGMAP
        server: grpc.aio.Server | None = None
        watches: list[tuple[str, Callable[[str, dict[str, Any]], None], str, dict[str, str] | None]] = [
            ("/api/v1/nodes", self._on_node, "nodes", None),
            ("/api/v1/pods", self._on_pod, "pods", None),
        ]
        if await rest.serves(self.api, DRA_API_PATH):
            for plural, on_event in (
                ("resourceslices", self._on_slice),
                ("deviceclasses", self._on_class),
                ("resourceclaims", self._on_claim),
            ):
                self._synced[plural] = asyncio.Event()
                watches.append((f"{DRA_API_PATH}/{plural}", on_event, plural, None))
        else:
            self._log.info("the cluster serves no resource.k8s.io/v1: DRA devices are not estimated")
        try:
            async with asyncio.TaskGroup() as tg:
                for path_, handler, what, params in (
                    *watches,
                    (rest.path(API_VERSION, "tenants"), self._on_tenant, "tenants", None),
                    (
                        rest.path("v1", "configmaps", namespace=ca_ns),
                        self._on_client_ca,
                        "ca",
                        {"fieldSelector": f"metadata.name={ca_name}"},
                    ),
                ):
                    synced = self._synced_cb(what) if what != "ca" else self._ca_listed
                    tg.create_task(
                        watch(self.api, path_, handler, what=f"estimator-{what}", params=params, on_synced=synced)
                    )
                for event in self._synced.values():
                    await event.wait()
                self.cert, _new = await self._serving_cert(host)
                self.refresh()
                server = grpc.aio.server()
                server.add_generic_rpc_handlers([self.handler()])
                credentials = grpc.dynamic_ssl_server_credentials(
                    self._config(),
                    # grpc documents None as "keep the current configuration"; the stub's return type omits it.
                    cast(_Fetcher, self._fetch_config),
                    require_client_authentication=True,
                )
                try:
                    port = server.add_secure_port(listen, credentials)
                except RuntimeError as e:  # grpc's "Failed to bind to address"
                    raise EstimatorConfigError(f"the estimator cannot listen on {listen} (port in use?): {e}") from e
                await server.start()
                self.endpoint = self.settings.address or join_endpoint(host, port)
                await self._publish_configmap()
                self._log.info(
                    "capacity estimator serving", endpoint=self.endpoint, listen=join_endpoint(self.settings.host, port)
                )
                self.ready.set()
                tg.create_task(self._publisher())
                tg.create_task(self._renewals(host))
        finally:
            if server is not None:
                await asyncio.shield(server.stop(STOP_GRACE_S))


__all__ = [
    "EstimatorConfigError",
    "EstimatorServer",
    "EstimatorServerSettings",
    "RefusalError",
    "authorize",
    "consumer_of",
    "join_endpoint",
    "split_endpoint",
]
