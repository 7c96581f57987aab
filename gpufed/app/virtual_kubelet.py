"""`gpufed virtual-kubelet`: the virtual nodes backed by one peered provider.

Owns: wiring — the consumer client (with a kubelet-like request budget), the cluster identity,
the provider credentials from Secret `gpufed/gpufed-remote-<provider>` (waiting for them with a
clear log line; then re-read every `credentials_reload_s`, and renewed ones swapped in without a
restart: `CredentialsFollower`), the provider client (same budget; a
`gpufed.kube.reloadable.ReloadableClient`), and under one TaskGroup: one `RemoteProvider`,
one `Reflection` (started and stopped per twin namespace by the provider's TwinNamespace watch,
for the namespaces the consumer's NamespaceOffloadings offload to this provider),
the `CapacityFeed` of the provider's capacity estimator (unless capacity is static), and the
`PoolManager` running one node + pod controller + kubelet API per GPU pool node; with a metrics
port, the Prometheus metrics of all of them (`gpufed.kube.metrics`, from the start, so /healthz
answers while credentials are awaited). The Nodes are
owned by the provider's ForeignCluster: when that is deleted (unpeer) this process removes them and
exits; an ordinary stop (SIGTERM, crash, kill -9) leaves the Nodes and their pods in place for the
next start to adopt.

Joins vkprovider and netfabric (which never import each other): `FabricAddresses` is the fabric's
live remapper as the IP translator of `vkprovider.remote` and as its `PodAddresses` check (a
twin's reported address must lie in THIS provider's pod range; anything else, e.g. an address of
the consumer's own pods or exposed services, is refused). Without a fabric for the peering no range
is known and addresses are shown as reported (they are not routed to the provider then either).
The provider's node labels pass the allow-list of `forge.pools` plus the keys the ForeignCluster's
`gpufed.io/allowed-node-labels` annotation (or `node_label_allow`) names.

Does not: pick ports or restart itself (the controller's supervisor does, or a Deployment).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
import yaml

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    CAPACITY_ANNOTATION,
    DRA_API_PATH,
    GPU_POOLS_ANNOTATION,
    IDENTITY_CONFIGMAP,
    NODE_LABELS_ANNOTATION,
    SYSTEM_NAMESPACE,
    ClusterID,
    remote_kubeconfig_secret,
)
from gpufed.app.pools import DeviceSide, PoolManager, PoolSettings
from gpufed.defaults import METRICS_HOST as DEFAULT_METRICS_HOST
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.budget import set_budget
from gpufed.kube.client import KubeError, api_client, client_from_dict
from gpufed.kube.metrics import serving
from gpufed.kube.reloadable import ReloadableClient
from gpufed.kube.watch import watch
from gpufed.ops.doctor.verdicts import client_certificate
from netfabric.controllers.translator import LiveRemapper
from vkprovider import defaults
from vkprovider.forge.tokens import DEFAULT_REFRESH_FRACTION
from vkprovider.kubelet.server import DEFAULT_STREAM_IDLE_S
from vkprovider.kubelet.servingcert import ServingCertSettings
from vkprovider.node.pods import PodSettings
from vkprovider.remote.capacity import CapacityFeed
from vkprovider.remote.devices import ClaimCache, SlicePublisher
from vkprovider.remote.dra_claims import ClaimOffloader
from vkprovider.remote.events_relay import EventRelay
from vkprovider.remote.provider import COMPONENT as PROVIDER_COMPONENT
from vkprovider.remote.provider import RemoteProvider, RemoteSettings
from vkprovider.remote.reflection import DEFAULT_RESYNC_S, Reflection, ReflectionSettings
from vkprovider.remote.reservations import GangReservations
from vkprovider.remote.streaming import RemoteStreaming
from vkprovider.remote.tokens import PodTokens, TokenSettings
from vkprovider.remote.translate import IPTranslator, PodAddresses
from vkprovider.remote.volumes import ClaimProvisioner

#: Client budget towards each API server (vkprovider.defaults says why).
DEFAULT_QPS = defaults.VIRTUAL_KUBELET_QPS
DEFAULT_BURST = defaults.VIRTUAL_KUBELET_BURST
#: Seconds between checks for the provider credentials while they do not exist yet.
CREDENTIALS_POLL_S = 2.0
#: Seconds between reads of the provider credentials once running: renewed ones are in use within this.
CREDENTIALS_RELOAD_S = 10.0


class VirtualKubeletError(GpufedError):
    """Cannot start: the message says what is missing."""


class SettingsChangedError(VirtualKubeletError):
    """The peering's settings (ForeignCluster annotations) changed: restart to apply them."""


def peering_settings(fc: dict[str, Any], settings: VirtualKubeletSettings) -> tuple[str, bool]:
    """(capacity mode, per-product pools) from the ForeignCluster's annotations over the flags."""
    ann = fc["metadata"].get("annotations") or {}
    capacity = ann.get(CAPACITY_ANNOTATION) or settings.capacity
    pools = ann.get(GPU_POOLS_ANNOTATION) or ("per-product" if settings.per_product_pools else "provider")
    if capacity not in ("live", "static"):
        raise VirtualKubeletError(f"{CAPACITY_ANNOTATION}={capacity!r} on ForeignCluster: use live or static")
    if pools not in ("per-product", "provider"):
        raise VirtualKubeletError(f"{GPU_POOLS_ANNOTATION}={pools!r} on ForeignCluster: use per-product or provider")
    return capacity, pools == "per-product"


def node_label_allow(fc: dict[str, Any], settings: VirtualKubeletSettings) -> tuple[str, ...]:
    """The provider labels allowed beyond the GPU ones: the flags' and the ForeignCluster annotation's."""
    ann = (fc["metadata"].get("annotations") or {}).get(NODE_LABELS_ANNOTATION) or ""
    return _entries((*settings.node_label_allow, *ann.split(",")))


def _entries(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({v.strip() for v in values if v.strip()}))


class FabricAddresses:
    """The fabric's live remapper as `vkprovider.remote`'s IPTranslator and PodAddresses."""

    def __init__(self, remapper: LiveRemapper) -> None:
        self.remapper = remapper

    def to_local_ip(self, ip: str) -> str:
        return self.remapper.to_local_ip(ip)

    def to_remote_ip(self, ip: str) -> str:
        return self.remapper.to_remote_ip(ip)

    def refuse_pod_ip(self, remote_ip: str) -> str | None:
        """Why an address the provider reports for a twin is not that pod's; None when it lies in
        the provider's own pod range (the only addresses its pods have, as the fabric routes them)."""
        current = self.remapper.current
        if current is None:
            return None  # no fabric for this peering: no range is known, nothing is routed there
        pods = current.peer_pod.real
        try:
            addr = ipaddress.IPv4Address(remote_ip)
        except ValueError:
            return f"{remote_ip!r} is no IPv4 address in the provider's pod range {pods}"
        if current.peer_pod.contains_real(addr):
            return None
        if current.local_pod.contains_mapped(addr):
            return f"it is an address of this cluster's own pods (as the provider reaches them), not in {pods}"
        if current.local_external is not None and current.local_external.contains_mapped(addr):
            return f"it is an address this cluster exposes to the provider, not in the provider's pod range {pods}"
        if current.peer_external is not None and current.peer_external.contains_real(addr):
            return f"it is in the provider's external range, not in its pod range {pods}"
        return f"it is outside the provider's pod range {pods}"


@dataclass(frozen=True)
class VirtualKubeletSettings:
    #: kubeconfig of the virtual kubelet's identity on the consumer; None: the pod's service account.
    kubeconfig: Path | None
    #: ClusterID of the provider behind this virtual node.
    provider: str
    #: Name of the provider's node (default gpufed-<provider>); per-product pools append the product.
    node_name: str
    context: str | None = None
    #: Address the nodes publish, and the kubelet ports of their APIs (one per pool node).
    node_address: str = "127.0.0.1"
    kubelet_ports: tuple[int, int] = (10250, 10250)
    #: Live capacity from the provider's estimator ("live") or the grant alone ("static": one node,
    #: capacity = grant, no fit check — the baseline peers use).
    capacity: str = "live"
    #: One pool node per GPU product when the provider has several.
    per_product_pools: bool = True
    #: Address the kubelet API listens on (default: the node address).
    listen_address: str | None = None
    #: Where the kubelet API's serving certificate comes from (CSR by default).
    serving_cert: ServingCertSettings = field(default_factory=ServingCertSettings)
    #: Seconds a port-forward connection may stay without streams.
    stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_S
    #: Request budget per API server (queries per second, burst).
    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST
    pods: PodSettings = field(default_factory=PodSettings)
    #: host:port offloaded pods use to reach the consumer's API (KUBERNETES_SERVICE_HOST/PORT);
    #: None: the server of `kubeconfig`, through the IP translator.
    consumer_api_server: str | None = None
    #: Fraction of a consumer-issued token's lifetime after which it is renewed.
    token_refresh_fraction: float = DEFAULT_REFRESH_FRACTION
    #: Seconds between full resyncs of reflected objects.
    reflection_resync_s: float = DEFAULT_RESYNC_S
    #: Seconds between reads of the provider credentials Secret (renewed credentials are swapped in
    #: without a restart).
    credentials_reload_s: float = CREDENTIALS_RELOAD_S
    version: str = "v0.0.0-gpufed"
    #: Port of the Prometheus metrics server (GET /metrics, /healthz); None: no metrics server.
    metrics_port: int | None = None
    #: Address the metrics server listens on.
    metrics_host: str = DEFAULT_METRICS_HOST
    #: Provider node labels allowed on its virtual nodes beyond the GPU ones (keys, or prefixes
    #: ending in `/` or `*`); the ForeignCluster's `gpufed.io/allowed-node-labels` adds to them.
    node_label_allow: tuple[str, ...] = ()


async def _cluster_id(api: Any) -> str:
    cm = await rest.get(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE))
    if cm is None or not (cm.get("data") or {}).get("clusterId"):
        raise VirtualKubeletError(
            f"no cluster identity (ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP}): is `gpufed controller` running?"
        )
    return str(cm["data"]["clusterId"])


async def _read_credentials(api: Any, provider: str) -> str | None:
    """The base64 kubeconfig in the provider's credentials Secret; None while there is none."""
    name = remote_kubeconfig_secret(ClusterID(provider))
    try:
        secret = await rest.get(api, rest.path("v1", "secrets", name, namespace=SYSTEM_NAMESPACE))
    except KubeError as e:
        if not e.forbidden:
            raise
        # The controller grants the read per peering; its grant may not have reached the API
        # server's authorizer yet (a virtual kubelet started while the controller upgrades).
        return None
    data = (secret or {}).get("data") or {}
    return str(data["kubeconfig"]) if data.get("kubeconfig") else None


def _kubeconfig(data: str) -> dict[str, Any]:
    return dict(yaml.safe_load(base64.b64decode(data)))


async def _credentials(api: Any, provider: str, log: Any) -> tuple[dict[str, Any], str]:
    """The provider credentials (kubeconfig, and the Secret's data it came from), once they exist."""
    waited = False
    while True:
        data = await _read_credentials(api, provider)
        if data is not None:
            return _kubeconfig(data), data
        if not waited:
            name = remote_kubeconfig_secret(ClusterID(provider))
            log.info("waiting for the provider credentials", secret=f"{SYSTEM_NAMESPACE}/{name}")
            waited = True
        await asyncio.sleep(CREDENTIALS_POLL_S)


def _expiry(cfg: dict[str, Any]) -> float | None:
    """Unix time the kubeconfig's client certificate expires (None: none, or unreadable)."""
    try:
        cert = client_certificate(cfg)
    except ValueError:
        return None
    return cert.not_valid_after_utc.timestamp() if cert is not None else None


class CredentialsFollower:
    """Keeps the provider client on the credentials the Secret holds now.

    Reads the Secret every `reload_s`; when its kubeconfig changed (renewed by the controller, or
    replaced by a new handshake), builds a client from it, swaps it into `remote` (requests in
    flight finish on the old one, which is closed afterwards, at the latest when its certificate
    expires) and tells `listeners` (e.g. the capacity feed, which presents the certificate to the
    estimator). A Secret that does not load leaves the current client in place and is logged."""

    def __init__(
        self,
        api: Any,
        provider: str,
        remote: ReloadableClient,
        cfg: dict[str, Any],
        data: str,
        *,
        reload_s: float = CREDENTIALS_RELOAD_S,
        listeners: Iterable[Callable[[dict[str, Any]], None]] = (),
    ) -> None:
        self.api = api
        self.provider = provider
        self.remote = remote
        self.cfg = cfg
        self.data = data
        self.reload_s = reload_s
        self.listeners = list(listeners)
        self._log = structlog.get_logger().bind(remote_cluster=provider, component="credentials")

    async def check(self) -> bool:
        """Read the Secret once; True when new credentials were swapped in."""
        data = await _read_credentials(self.api, self.provider)
        if data is None or data == self.data:
            return False
        try:
            cfg = _kubeconfig(data)
            new = await client_from_dict(cfg)
        except (KubeError, yaml.YAMLError, ValueError, TypeError) as e:
            self._log.warning("renewed provider credentials do not load; keeping the current ones", error=str(e))
            self.data = data
            return False
        retire_by = _expiry(self.cfg)
        self.remote.swap(new, retire_by=retire_by)
        self.cfg, self.data = cfg, data
        try:
            cert = client_certificate(cfg)
        except ValueError:
            cert = None
        # The certificate's public serial and expiry identify which credentials are in use; never the key.
        self._log.info(
            "provider credentials reloaded",
            generation=self.remote.generation,
            serial=f"{cert.serial_number:x}" if cert is not None else None,
            expires=cert.not_valid_after_utc.isoformat() if cert is not None else None,
        )
        for listener in self.listeners:
            listener(cfg)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.reload_s)
            try:
                await self.check()
            except KubeError as e:
                self._log.warning("cannot read the provider credentials", error=str(e))


def api_endpoint(server: str, translator: IPTranslator) -> tuple[str, int]:
    """(host, port) of an API server URL or host:port, the host as the provider's pods reach it."""
    parsed = urllib.parse.urlsplit(server if "://" in server else f"https://{server}")
    if not parsed.hostname:
        raise VirtualKubeletError(f"no host in the consumer API server {server!r}")
    host = parsed.hostname
    with contextlib.suppress(ValueError):
        host = translator.to_remote_ip(str(ipaddress.ip_address(host)))
    return host, parsed.port or 443


async def run(settings: VirtualKubeletSettings) -> None:
    async with serving(settings.metrics_port, settings.metrics_host):
        await _run(settings)


async def _run(settings: VirtualKubeletSettings) -> None:
    log = structlog.get_logger().bind(node=settings.node_name, remote_cluster=settings.provider)
    async with api_client(settings.kubeconfig, settings.context) as api:
        set_budget(api, settings.qps, settings.burst)
        consumer = await _cluster_id(api)
        fc = await rest.get(api, rest.path(API_VERSION, "foreignclusters", settings.provider))
        if fc is None or fc["metadata"].get("deletionTimestamp"):
            raise VirtualKubeletError(
                f"provider {settings.provider} is not peered (no ForeignCluster {settings.provider})"
            )
        capacity, per_product = peering_settings(fc, settings)
        cfg, cfg_data = await _credentials(api, settings.provider, log)
        remote_api = ReloadableClient(await client_from_dict(cfg))
        try:
            set_budget(remote_api, settings.qps, settings.burst)
            remapper = LiveRemapper(api, settings.provider)
            await remapper.load()
            translator = FabricAddresses(remapper)
            pod_addresses: PodAddresses = translator
            label_allow = node_label_allow(fc, settings)
            api_host, api_port = api_endpoint(settings.consumer_api_server or api.configuration.host, translator)
            remote_settings = RemoteSettings(
                consumer,
                settings.provider,
                settings.node_name,
                settings.node_address,
                node_label_allow=label_allow,
            )
            # one bounded relay for every Event this provider's view causes (the provider runs it)
            events = EventRelay(api, settings.provider, PROVIDER_COMPONENT, remote_settings.event_limits)
            tokens = PodTokens(
                api,
                remote_api,
                consumer,
                TokenSettings(api_host, api_port, refresh_fraction=settings.token_refresh_fraction),
                provider=settings.provider,
                events=events,
            )
            feed = CapacityFeed(remote_api, cfg, remote_cluster=settings.provider) if capacity == "live" else None
            reflection = Reflection(
                api,
                remote_api,
                ReflectionSettings(consumer, settings.provider, resync_s=settings.reflection_resync_s),
                translator,
            )
            # Dynamic Resource Allocation: devices published on pool nodes, claims of offloaded pods.
            devices = (
                DeviceSide(ClaimCache(api), SlicePublisher(api, (rest.owner_ref(fc),)))
                if await rest.serves(api, DRA_API_PATH)
                else None
            )
            provider = RemoteProvider(
                api,
                remote_api,
                remote_settings,
                translator,
                tokens,
                placement=feed.can_place if feed is not None else None,
                reflection=reflection,
                pod_addresses=pod_addresses,
                events=events,
                dra=ClaimOffloader(
                    api,
                    remote_api,
                    devices.claims if devices is not None else None,
                    settings.provider,
                    consumer,
                    events,
                )
                if devices is not None
                else None,
                capacity=(lambda: feed.snapshot) if feed is not None else None,
            )
            if feed is not None:
                feed.listeners.append(provider.capacity_changed)
            pools = PoolManager(
                api,
                provider,
                feed,
                RemoteStreaming(remote_api, settings.provider, provider.twin_ref),
                PoolSettings(
                    node_address=settings.node_address,
                    kubelet_ports=settings.kubelet_ports,
                    listen_address=settings.listen_address,
                    per_product=per_product,
                    version=settings.version,
                    owner_references=(rest.owner_ref(fc),),
                    # Static capacity is the baseline of other federations: no fail-back either.
                    pods=settings.pods if feed is not None else replace(settings.pods, unplaced_timeout_s=None),
                    serving_cert=settings.serving_cert,
                    stream_idle_timeout_s=settings.stream_idle_timeout_s,
                ),
                devices=devices,
                reservations=GangReservations(api),
            )
            volumes = ClaimProvisioner(
                api,
                remote_api,
                consumer,
                settings.provider,
                nodes=lambda: {settings.node_name, *provider.pool_products},
                twin_namespace=provider.twin_ns.get,
                offers=lambda: provider.grants.grant().storage,
                events=events,
            )
            provider.slice_listeners.append(volumes.grant_changed)
            follower = CredentialsFollower(
                api,
                settings.provider,
                remote_api,
                cfg,
                cfg_data,
                reload_s=settings.credentials_reload_s,
                listeners=[feed.use_credentials] if feed is not None else [],
            )
            unpeered = asyncio.Event()
            changed = asyncio.Event()
            fc_uid = fc["metadata"]["uid"]

            def on_fc(kind: str, obj: dict[str, Any]) -> None:
                meta = obj["metadata"]
                if meta.get("uid") != fc_uid:
                    return
                if kind == "DELETED" or meta.get("deletionTimestamp"):
                    unpeered.set()
                    return
                with contextlib.suppress(VirtualKubeletError):
                    if peering_settings(obj, settings) != (capacity, per_product):
                        changed.set()
                if node_label_allow(obj, settings) != label_allow:
                    changed.set()

            log.info("virtual kubelet starting", consumer=consumer, capacity=capacity, gpu_pools=per_product)
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(pools.run()),
                    tg.create_task(reflection.run()),
                    tg.create_task(remapper.run()),
                    tg.create_task(volumes.run()),
                    tg.create_task(follower.run()),
                    tg.create_task(
                        watch(
                            api,
                            rest.path(API_VERSION, "foreignclusters"),
                            on_fc,
                            what="foreignclusters",
                            params={"fieldSelector": f"metadata.name={settings.provider}"},
                        )
                    ),
                ]
                waiters = [tg.create_task(unpeered.wait()), tg.create_task(changed.wait())]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for t in tasks + waiters:
                    t.cancel()
            if not unpeered.is_set():
                log.info("peering settings changed; restarting to apply them")
                raise SettingsChangedError("the peering's settings changed; restarting to apply them")
            log.info("provider unpeered; removing its virtual nodes")
            await pools.remove_nodes()
        finally:
            await remote_api.close()
