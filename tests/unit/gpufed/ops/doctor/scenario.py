"""The clusters `gpufed doctor`'s tests check, served in memory: a consumer (fake API server plus
GET /version) with one peered provider reached through the stored credentials, and the consumer's
offloading webhook serving /healthz over real TLS. Every default of `Scenario` is healthy; a test
breaks one thing at a time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client

from gpufed.apis.kinds import KINDS
from gpufed.apis.meta import API_VERSION, GROUP
from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, SYSTEM_NAMESPACE, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import servingtls
from gpufed.kube.times import rfc3339
from gpufed.ops.doctor.checks import Check, Report
from gpufed.ops.doctor.report import diagnose
from gpufed.ops.doctor.settings import DoctorSettings
from tests.unit.fakes import FakeApiServer

CONSUMER = "consumer-1234abcd"
PROVIDER = "gpu-a-5678ef01"
NODE = f"gpufed-{PROVIDER}"
NS = SYSTEM_NAMESPACE


def stamp(seconds_ago: float, micro: bool = False) -> str:
    """A Kubernetes timestamp `seconds_ago` before now (MicroTime with `micro`)."""
    return rfc3339(time.time() - seconds_ago, micro=micro)


def certificate(days_left: float, cn: str = f"gpufed:consumer:{CONSUMER}") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM): self-signed, valid from 30 days ago for `days_left` more days."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now + dt.timedelta(days=days_left))
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), pem


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


@dataclass
class Scenario:
    """What the consumer looks like; every default is healthy."""

    cert_days: float = 90
    provider_url: str | None = None  # None: the fake provider
    slice_condition: tuple[str, str, str] = ("True", "Granted", "granted in full")
    granted_gpus: str = "8"
    node_ready: bool = True
    lease_age_s: float = 3
    webhook: bool = True
    #: None: no fabric; else (handshake seconds ago or None, phase, applied MTU).
    fabric: tuple[float | None, str, int] | None = None
    hang_provider: bool = False
    #: Lifetime of the certificate the virtual node's kubelet API serves, and its age.
    serving_days: int = 30
    serving_age_days: float = 0


@dataclass
class Env:
    consumer: FakeApiServer
    api: Any
    url: str
    kubeconfig: Path
    key_pem: bytes
    #: host:port of the TLS server (the webhook's) and its CA.
    tls_endpoint: str
    tls_ca: bytes
    provider_hits: list[str] = field(default_factory=list)

    def settings(self, **kw: Any) -> DoctorSettings:
        return DoctorSettings(kubeconfig=self.kubeconfig, **kw)


async def _site(app_: web.Application, ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app_, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    return runner, int(runner.addresses[0][1])


def _api_app(server: FakeApiServer | None, hits: list[str]) -> web.Application:
    """The fake API server plus GET /version (which FakeApiServer does not serve)."""

    async def version(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"gitVersion": "v1.31.0-fake"})

    async def other(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        if server is None:
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        return await server.handle(request)

    a = web.Application()
    a.router.add_get("/version", version)
    a.router.add_route("*", "/{tail:.*}", other)
    return a


def kubeconfig_of(server: str, user: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def populate(
    server: FakeApiServer,
    sc: Scenario,
    provider_url: str,
    webhook_url: str,
    webhook_ca: bytes,
    kubelet_port: int | None = None,
) -> bytes:
    """The consumer's objects (the virtual node's kubelet API at 127.0.0.1:`kubelet_port`); returns the
    stored client key (which must never be printed)."""
    for kind in KINDS:
        server.create("customresourcedefinitions", {"metadata": {"name": f"{kind.plural}.{GROUP}"}})
    for role in ("gpufed-consumer-workloads", "gpufed-consumer-control"):
        server.create("clusterroles", {"metadata": {"name": role}})
    server.create(
        "configmaps",
        {
            "metadata": {"name": "gpufed-identity", "namespace": NS},
            "data": {"clusterId": CONSUMER, "fingerprint": "ab"},
        },
    )
    server.create(
        "foreignclusters",
        {
            "metadata": {"name": PROVIDER},
            "spec": {"clusterId": PROVIDER, "roles": ["Provider"], "apiServerUrl": provider_url},
            "status": {
                "phase": "Peered",
                "conditions": [
                    {"type": "Authentication", "status": "True", "reason": "Authenticated", "message": "holding"}
                ],
            },
        },
        api_version=API_VERSION,
    )
    cert, key = certificate(sc.cert_days)
    kc = kubeconfig_of(provider_url, {"client-certificate-data": b64(cert), "client-key-data": b64(key)})
    server.create(
        "secrets",
        {
            "metadata": {"name": f"gpufed-remote-{PROVIDER}", "namespace": NS},
            "data": {"kubeconfig": b64(yaml.safe_dump(kc)), "tls.crt": b64(cert), "tls.key": b64(key)},
        },
    )
    status, reason, message = sc.slice_condition
    server.create(
        "resourceslices",
        {
            "metadata": {"name": PROVIDER, "namespace": NS, "generation": 1},
            "spec": {"providerClusterId": PROVIDER, "resources": {"nvidia.com/gpu": "8", "cpu": "16"}},
            "status": {
                "conditions": [
                    {
                        "type": "Resources",
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "observedGeneration": 1,
                    }
                ],
                "granted": {"nvidia.com/gpu": sc.granted_gpus, "cpu": "16"} if status == "True" else {},
            },
        },
        api_version=API_VERSION,
    )
    server.create(
        "nodes",
        {
            "metadata": {"name": NODE, "labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE, REMOTE_CLUSTER_LABEL: PROVIDER}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port or 0}},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if sc.node_ready else "False",
                        "reason": "KubeletReady" if sc.node_ready else "ProviderUnreachable",
                        "message": "provider answers" if sc.node_ready else "the provider's API does not answer",
                    }
                ],
            },
        },
    )
    server.create(
        "leases",
        {
            "metadata": {"name": NODE, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": stamp(sc.lease_age_s, True)},
        },
        api_version="coordination.k8s.io/v1",
    )
    if sc.webhook:
        server.create(
            "mutatingwebhookconfigurations",
            {
                "metadata": {"name": "gpufed-offloading"},
                "webhooks": [
                    {
                        "name": "pods.offloading.gpufed.io",
                        "clientConfig": {"url": webhook_url, "caBundle": b64(webhook_ca)},
                    }
                ],
            },
            api_version="admissionregistration.k8s.io/v1",
        )
    if sc.fabric is not None:
        handshake, phase, mtu = sc.fabric
        server.create(
            "gateways",
            {
                "metadata": {"name": PROVIDER, "namespace": NS},
                "spec": {"clusterId": PROVIDER, "role": "Client", "endpoint": "192.0.2.7:51820", "mtu": 0},
                "status": {"driver": "wireguard-go", "mtu": mtu},
            },
            api_version=API_VERSION,
        )
        server.create(
            "connections",
            {
                "metadata": {"name": PROVIDER, "namespace": NS},
                "spec": {"clusterId": PROVIDER},
                "status": {
                    "phase": phase,
                    "reason": "ProbeSucceeded" if phase == "Connected" else "HandshakeStale",
                    "message": "peer answers" if phase == "Connected" else "the underlay may be cut",
                    "rttMs": 0.4,
                    "latestHandshake": None if handshake is None else stamp(handshake),
                },
            },
            api_version=API_VERSION,
        )
    return key


@contextlib.asynccontextmanager
async def environment(tmp_path: Path, sc: Scenario | None = None) -> AsyncIterator[Env]:
    """A consumer (fake API + /version), a provider (fake API + /version, or a port that accepts and
    never answers), and the consumer's offloading webhook serving /healthz over TLS."""
    sc = sc or Scenario()
    async with contextlib.AsyncExitStack() as stack:
        material = servingtls.issue("127.0.0.1", days=30)
        (tmp_path / "tls.crt").write_bytes(material.cert_pem)
        (tmp_path / "tls.key").write_bytes(material.key_pem)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

        async def healthz(_r: web.Request) -> web.Response:
            return web.Response(text="ok")

        hook = web.Application()
        hook.router.add_get("/healthz", healthz)
        hook_runner, hook_port = await _site(hook, ctx)
        stack.push_async_callback(hook_runner.cleanup)

        # the virtual node's kubelet API: only its serving certificate is looked at
        issued = dt.datetime.now(dt.UTC) - dt.timedelta(days=sc.serving_age_days)
        kubelet = servingtls.issue("127.0.0.1", days=sc.serving_days, now=issued)
        (tmp_path / "kubelet.crt").write_bytes(kubelet.cert_pem)
        (tmp_path / "kubelet.key").write_bytes(kubelet.key_pem)
        kubelet_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        kubelet_ctx.load_cert_chain(tmp_path / "kubelet.crt", tmp_path / "kubelet.key")
        kubelet_runner, kubelet_port = await _site(web.Application(), kubelet_ctx)
        stack.push_async_callback(kubelet_runner.cleanup)

        hits: list[str] = []
        if sc.hang_provider:

            async def hang(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                await r.read()  # never answers; returns when the client gives up and closes
                w.close()

            srv = await asyncio.start_server(hang, "127.0.0.1", 0)
            stack.push_async_callback(srv.wait_closed)
            stack.callback(srv.close)
            provider_url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        else:
            prov_runner, prov_port = await _site(_api_app(None, hits))
            stack.push_async_callback(prov_runner.cleanup)
            provider_url = f"http://127.0.0.1:{prov_port}"
        consumer = FakeApiServer()
        key = populate(
            consumer,
            sc,
            sc.provider_url or provider_url,
            f"https://127.0.0.1:{hook_port}/mutate-pods",
            material.ca_pem,
            kubelet_port,
        )
        runner, port = await _site(_api_app(consumer, []))
        stack.push_async_callback(runner.cleanup)
        stack.callback(consumer.stop_watches)
        url = f"http://127.0.0.1:{port}"
        kubeconfig = tmp_path / "consumer.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_of(url, {"token": "not-a-real-token"})))
        api = client.ApiClient(client.Configuration(host=url))
        stack.push_async_callback(api.close)
        yield Env(consumer, api, url, kubeconfig, key, f"127.0.0.1:{hook_port}", material.ca_pem, hits)


def by_name(report: Report) -> dict[str, Check]:
    return {c.name: c for c in report.checks}


async def run(env: Env, **kw: Any) -> Report:
    # Everything (fake API servers, TLS, the doctor) shares one event loop here: on a slow machine the
    # product's 10 s per check and 1 s "slow API" line are too tight for that; the tests that are about
    # them pass their own.
    defaults = {"check_timeout_s": 60.0, "slow_api_ms": 30_000.0}
    return await diagnose(env.api, env.settings(**{**defaults, **kw}), api_server=env.url)
