"""`gpufed virtual-kubelet`: one virtual node backed by one peered provider.

Owns: wiring — the consumer client (with a kubelet-like request budget), the cluster identity,
the provider credentials from Secret `gpufed/gpufed-remote-<provider>` (waiting for them with a
clear log line), the provider client (same budget), and `RemoteProvider` + `NodeController` +
`PodController` + `Reflection` (started and stopped per twin namespace by the provider's
TwinNamespace watch) + the kubelet API (`KubeletAPI` over `RemoteStreaming`, its certificate from
`ServingCertManager`) under one TaskGroup. The Node is owned by the provider's ForeignCluster: when
that is deleted (unpeer) this process removes its Node and exits; an ordinary stop (SIGTERM,
crash, kill -9) leaves the Node and its pods in place for the next start to adopt.

Does not: pick ports or restart itself (the controller's supervisor does, or a Deployment).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml

from netfabric.controllers.translator import LiveRemapper
from peering.ids import IDENTITY_CONFIGMAP, SYSTEM_NAMESPACE, ClusterID, remote_kubeconfig_secret
from peering.kube import rest
from peering.kube.budget import set_budget
from peering.kube.client import KubeError, api_client, client_from_dict
from peering.kube.watch import watch
from peering.models import API_VERSION
from vkprovider.forge.tokens import DEFAULT_REFRESH_FRACTION
from vkprovider.node.kubeletapi import DEFAULT_STREAM_IDLE_S, KubeletAPI, KubeletAPISettings
from vkprovider.node.node import NodeController, NodeSettings
from vkprovider.node.pods import PodController, PodSettings
from vkprovider.node.servingcert import ServingCertManager, ServingCertSettings, ServingTLS
from vkprovider.remote.provider import RemoteProvider, RemoteSettings
from vkprovider.remote.reflection import DEFAULT_RESYNC_S, Reflection, ReflectionSettings
from vkprovider.remote.streaming import RemoteStreaming
from vkprovider.remote.tokens import PodTokens, TokenSettings
from vkprovider.remote.translate import IPTranslator

#: Client budget towards each API server: a kubelet runs with 50 QPS / burst 100; one virtual
#: kubelet stands for a whole provider, so it gets more (it is still bounded).
DEFAULT_QPS = 200.0
DEFAULT_BURST = 400
#: Seconds between checks for the provider credentials while they do not exist yet.
CREDENTIALS_POLL_S = 2.0


class VirtualKubeletError(Exception):
    """Cannot start: the message says what is missing."""


@dataclass(frozen=True)
class VirtualKubeletSettings:
    #: kubeconfig of the virtual kubelet's identity on the consumer.
    kubeconfig: Path
    #: ClusterID of the provider behind this virtual node.
    provider: str
    #: Node name (default gpufed-<provider>).
    node_name: str
    context: str | None = None
    #: Address and kubelet port the node publishes.
    node_address: str = "127.0.0.1"
    kubelet_port: int = 10250
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
    version: str = "v0.0.0-gpufed"


async def _cluster_id(api: Any) -> str:
    cm = await rest.get(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE))
    if cm is None or not (cm.get("data") or {}).get("clusterId"):
        raise VirtualKubeletError(
            f"no cluster identity (ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP}): is `gpufed controller` running?"
        )
    return str(cm["data"]["clusterId"])


async def _credentials(api: Any, provider: str, log: Any) -> dict[str, Any]:
    name = remote_kubeconfig_secret(ClusterID(provider))
    waited = False
    while True:
        secret = await rest.get(api, rest.path("v1", "secrets", name, namespace=SYSTEM_NAMESPACE))
        if secret is not None and (secret.get("data") or {}).get("kubeconfig"):
            return dict(yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"])))
        if not waited:
            log.info("waiting for the provider credentials", secret=f"{SYSTEM_NAMESPACE}/{name}")
            waited = True
        await asyncio.sleep(CREDENTIALS_POLL_S)


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
    log = structlog.get_logger().bind(node=settings.node_name, remote_cluster=settings.provider)
    async with api_client(settings.kubeconfig, settings.context) as api:
        set_budget(api, settings.qps, settings.burst)
        consumer = await _cluster_id(api)
        fc = await rest.get(api, rest.path(API_VERSION, "foreignclusters", settings.provider))
        if fc is None or fc["metadata"].get("deletionTimestamp"):
            raise VirtualKubeletError(
                f"provider {settings.provider} is not peered (no ForeignCluster {settings.provider})"
            )
        cfg = await _credentials(api, settings.provider, log)
        remote_api = await client_from_dict(cfg)
        try:
            set_budget(remote_api, settings.qps, settings.burst)
            translator = LiveRemapper(api, settings.provider)
            await translator.load()
            api_host, api_port = api_endpoint(settings.consumer_api_server or api.configuration.host, translator)
            tokens = PodTokens(
                api,
                remote_api,
                consumer,
                TokenSettings(api_host, api_port, refresh_fraction=settings.token_refresh_fraction),
            )
            provider = RemoteProvider(
                api,
                remote_api,
                RemoteSettings(consumer, settings.provider, settings.node_name, settings.node_address),
                translator,
                tokens,
            )
            node = NodeController(
                api,
                provider,
                NodeSettings(
                    name=settings.node_name,
                    address=settings.node_address,
                    kubelet_port=settings.kubelet_port,
                    owner_references=(rest.owner_ref(fc),),
                    version=settings.version,
                ),
            )
            pods = PodController(api, provider, settings.node_name, settings.pods)
            reflection = Reflection(
                api,
                remote_api,
                ReflectionSettings(consumer, settings.provider, resync_s=settings.reflection_resync_s),
                translator,
            )

            def on_namespace(local: str, twin: str | None) -> None:
                if twin is None:
                    reflection.stop_namespace(local)
                else:
                    reflection.start_namespace(local, twin)

            provider.namespace_listeners.append(on_namespace)
            provider.namespace_annotations = reflection.namespace_annotations
            tls = ServingTLS()
            certs = ServingCertManager(api, settings.node_name, settings.node_address, tls, settings.serving_cert)
            kubelet = KubeletAPI(
                api,
                KubeletAPISettings(
                    node=settings.node_name,
                    host=settings.listen_address or settings.node_address,
                    port=settings.kubelet_port,
                    stream_idle_timeout_s=settings.stream_idle_timeout_s,
                ),
                pods,
                RemoteStreaming(remote_api, settings.provider, provider.twin_ref),
                tls,
            )
            unpeered = asyncio.Event()
            fc_uid = fc["metadata"]["uid"]

            def on_fc(kind: str, obj: dict[str, Any]) -> None:
                meta = obj["metadata"]
                if meta.get("uid") == fc_uid and (kind == "DELETED" or meta.get("deletionTimestamp")):
                    unpeered.set()

            log.info("virtual kubelet starting", consumer=consumer)
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(node.run()),
                    tg.create_task(pods.run()),
                    tg.create_task(reflection.run()),
                    tg.create_task(certs.run()),
                    tg.create_task(kubelet.run()),
                    tg.create_task(translator.run()),
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
                await unpeered.wait()
                log.info("provider unpeered; removing the virtual node")
                for t in tasks:
                    t.cancel()
            with contextlib.suppress(KubeError):
                await node.remove()
        finally:
            await remote_api.close()
