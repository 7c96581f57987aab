"""`gpufed doctor` (gpufed.ops.doctor, gpufed.cli.doctor) against in-memory API servers: a
consumer with one peered provider reached through the stored credentials, a real TLS webhook, and
one thing broken at a time — each FAIL names what is wrong and how to fix it; the CLI's exit codes,
JSON and errors."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from typer.testing import CliRunner

from gpufed.apis.models import API_VERSION, GROUP, KINDS
from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, SYSTEM_NAMESPACE, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.cli import app
from gpufed.kube import servingtls
from gpufed.ops import doctor
from gpufed.ops.doctor import Check, DoctorSettings, Report, diagnose
from tests.unit.fakes import FakeApiServer

CONSUMER = "consumer-1234abcd"
PROVIDER = "gpu-a-5678ef01"
NODE = f"gpufed-{PROVIDER}"
NS = SYSTEM_NAMESPACE
T = TypeVar("T")


def _stamp(seconds_ago: float, micro: bool = False) -> str:
    t = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


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


def _kubeconfig(server: str, user: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def populate(server: FakeApiServer, sc: Scenario, provider_url: str, webhook_url: str, webhook_ca: bytes) -> bytes:
    """The consumer's objects; returns the stored client key (which must never be printed)."""
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
    kc = _kubeconfig(provider_url, {"client-certificate-data": b64(cert), "client-key-data": b64(key)})
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
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if sc.node_ready else "False",
                        "reason": "KubeletReady" if sc.node_ready else "ProviderUnreachable",
                        "message": "provider answers" if sc.node_ready else "the provider's API does not answer",
                    }
                ]
            },
        },
    )
    server.create(
        "leases",
        {
            "metadata": {"name": NODE, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": _stamp(sc.lease_age_s, True)},
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
                    "latestHandshake": None if handshake is None else _stamp(handshake),
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
        )
        runner, port = await _site(_api_app(consumer, []))
        stack.push_async_callback(runner.cleanup)
        stack.callback(consumer.stop_watches)
        url = f"http://127.0.0.1:{port}"
        kubeconfig = tmp_path / "consumer.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(_kubeconfig(url, {"token": "not-a-real-token"})))
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


# ---------------------------------------------------------------------------------------- OK


async def test_a_healthy_peering_is_ok_except_the_missing_fabric(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        report = await run(env)
    checks = by_name(report)
    assert [(c.peer, c.name) for c in report.checks] == [
        ("", "install"),
        ("", "identity"),
        ("", "controller"),
        ("", "webhook"),
        (PROVIDER, "peering"),
        (PROVIDER, "credentials"),
        (PROVIDER, "api"),
        (PROVIDER, "grant"),
        (PROVIDER, "virtual-nodes"),
        (PROVIDER, "tunnel"),
        (PROVIDER, "estimator"),
    ]
    assert {n: c.status for n, c in checks.items() if c.status != "OK"} == {"tunnel": "WARN"}, report
    assert report.status == "WARN" and not report.failed
    assert report.cluster_id == CONSUMER
    assert "/version answered in" in checks["api"].finding and "v1.31.0-fake" in checks["api"].finding
    assert (
        "valid until" in checks["credentials"].finding
        and f"gpufed:consumer:{CONSUMER}" in checks["credentials"].finding
    )
    assert "nvidia.com/gpu 8/8" in checks["grant"].finding
    assert f"{NODE} Ready, lease renewed" in checks["virtual-nodes"].finding
    assert "answers over TLS verified with the caBundle" in checks["webhook"].finding
    assert "webhook answers" in checks["controller"].finding
    assert checks["tunnel"].finding == "no network fabric: pods cannot reach each other across clusters"
    assert checks["tunnel"].fix.startswith(f"create it: gpufed network connect --kubeconfig {env.kubeconfig}")
    assert "--remote-kubeconfig" in checks["tunnel"].fix
    assert all(c.fix == "" for c in report.checks if c.status == "OK")


async def test_a_slow_provider_api_is_a_warn(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        report = await run(env, slow_api_ms=0.001)
    api = by_name(report)["api"]
    assert api.status == "WARN" and api.finding.startswith("slow: GET http"), api
    assert "/version answered in" in api.finding


async def test_a_fresh_tunnel_is_ok_and_its_mtu_is_judged(tmp_path: Path) -> None:
    began = time.monotonic()
    async with environment(tmp_path, Scenario(fabric=(20, "Connected", 1420))) as env:
        checks = by_name(await run(env))
    elapsed = time.monotonic() - began  # the handshake was stamped 20 s before "now" while setting up
    assert checks["tunnel"].status == "OK"
    found = re.fullmatch(r"Connected \(Client\), handshake (\d+) s ago, RTT 0\.40 ms", checks["tunnel"].finding)
    assert found is not None, checks["tunnel"].finding
    assert 20 <= int(found[1]) <= 21 + elapsed, checks["tunnel"].finding
    assert checks["mtu"].status == "OK" and "MTU 1420 (automatic)" in checks["mtu"].finding


def test_mtu_must_leave_room_for_the_wireguard_overhead() -> None:
    def gw(mtu: int, endpoint: str = "192.0.2.7:51820", configured: int = 0) -> dict[str, Any]:
        return {"spec": {"endpoint": endpoint, "mtu": configured}, "status": {"mtu": mtu}}

    def judge(g: dict[str, Any], underlay: int = 1500) -> Check:
        return doctor.judge_mtu(PROVIDER, g, underlay_mtu=underlay, connect_cmd="gpufed network connect X")

    assert judge(gw(1440)).status == "OK", "IPv4 underlay: 60 B of overhead"
    bad = judge(gw(1440, "[fd00::7]:51820"))
    assert bad.status == "WARN" and "80 B WireGuard-over-IPv6" in bad.finding
    assert bad.fix.startswith("lower it: gpufed network connect X --mtu 1420")
    assert judge(gw(1480)).status == "WARN"
    assert judge(gw(8920), underlay=9000).status == "OK"
    assert judge(gw(1200)).status == "FAIL"
    assert judge(gw(1400, configured=1380)).status == "WARN", "configured and applied differ"
    assert judge(gw(0)).status == "WARN", "nothing applied yet"


# ---------------------------------------------------------------------------------------- FAILs


async def test_expired_credentials_fail_with_a_renewal_and_no_secret_is_shown(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(cert_days=-2)) as env:
        report = await run(env)
    c = by_name(report)["credentials"]
    assert c.status == "FAIL" and "expired 2 days ago" in c.finding, c
    assert "authGeneration" in c.fix and "gpufed peer --kubeconfig" in c.fix
    assert report.failed
    dumped = json.dumps(report.to_dict())
    assert "PRIVATE KEY" not in dumped and b64(env.key_pem) not in dumped and "not-a-real-token" not in dumped


async def test_credentials_expiring_within_a_week_warn(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(cert_days=3)) as env:
        c = by_name(await run(env))["credentials"]
    assert c.status == "WARN" and "expires in" in c.finding and "authGeneration" in c.fix


async def test_a_denied_slice_fails_with_its_reason_and_what_to_change(tmp_path: Path) -> None:
    sc = Scenario(slice_condition=("False", "PolicyLimit", "the tenant may use at most 4 nvidia.com/gpu"))
    async with environment(tmp_path, sc) as env:
        c = by_name(await run(env))["grant"]
    assert c.status == "FAIL"
    assert c.finding == f"slice {PROVIDER} Denied (PolicyLimit): the tenant may use at most 4 nvidia.com/gpu"
    assert "spec.policy.maxResources" in c.fix and f"edit tenant.gpufed.io {CONSUMER}" in c.fix


async def test_a_partial_grant_warns(tmp_path: Path) -> None:
    sc = Scenario(slice_condition=("True", "PartialGrant", "4 of 8"), granted_gpus="4")
    async with environment(tmp_path, sc) as env:
        c = by_name(await run(env))["grant"]
    assert c.status == "WARN" and "nvidia.com/gpu 4/8" in c.finding and "ask for less" in c.fix


async def test_a_not_ready_virtual_node_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(node_ready=False)) as env:
        c = by_name(await run(env))["virtual-nodes"]
    assert c.status == "FAIL"
    assert f"{NODE} NotReady (ProviderUnreachable: the provider's API does not answer)" in c.finding
    assert f"describe node {NODE}" in c.fix


async def test_a_stale_node_lease_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(lease_age_s=300)) as env:
        c = by_name(await run(env))["virtual-nodes"]
    assert c.status == "FAIL" and "renewed 5 min ago (expires after 40 s)" in c.finding
    assert "virtual kubelet" in c.fix and "gpufed controller" in c.fix


def test_a_node_without_a_lease_is_fine_only_just_after_it_registered() -> None:
    now = dt.datetime.now(dt.UTC)
    ready = {"type": "Ready", "status": "True"}

    def node(seconds_ago: float) -> dict[str, Any]:
        return {"metadata": {"name": NODE, "creationTimestamp": _stamp(seconds_ago)}, "status": {"conditions": [ready]}}

    fresh = doctor.judge_nodes(PROVIDER, [node(5)], {NODE: None}, now)
    assert fresh.status == "OK" and "lease not created yet" in fresh.finding
    old = doctor.judge_nodes(PROVIDER, [node(300)], {NODE: None}, now)
    assert old.status == "FAIL" and "renewed never" in old.finding


async def test_a_stale_or_missing_handshake_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(fabric=(600, "Down", 1420))) as env:
        c = by_name(await run(env))["tunnel"]
    assert c.status == "FAIL" and "last WireGuard handshake 10 min ago (stale after 180 s)" in c.finding
    assert f"gpufed gateway --name {PROVIDER}" in c.fix and "192.0.2.7:51820" in c.fix
    async with environment(tmp_path, Scenario(fabric=(None, "Pending", 0))) as env:
        c = by_name(await run(env))["tunnel"]
    assert c.status == "FAIL" and c.finding.startswith(f"no WireGuard handshake with {PROVIDER} ever")


async def test_a_missing_webhook_configuration_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(webhook=False)) as env:
        report = await run(env)
    checks = by_name(report)
    assert checks["webhook"].status == "FAIL"
    assert "MutatingWebhookConfiguration gpufed-offloading is missing" in checks["webhook"].finding
    assert "--webhook-port" in checks["webhook"].fix
    assert checks["controller"].status == "WARN", "no Lease and no webhook: the controller cannot be confirmed"


async def test_a_webhook_that_does_not_answer_fails_and_says_how_to_unblock_pods(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:

        def dead(cfg: dict[str, Any]) -> None:
            cfg["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:1/mutate-pods"

        env.consumer.update("mutatingwebhookconfigurations", "", "gpufed-offloading", dead)
        c = by_name(await run(env))["webhook"]
    assert c.status == "FAIL" and "https://127.0.0.1:1/healthz does not answer" in c.finding
    assert "delete mutatingwebhookconfiguration gpufed-offloading" in c.fix


async def test_the_estimator_this_cluster_serves_answers_tls_with_its_published_ca(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(webhook=False)) as env:
        cm = {"metadata": {"name": "gpufed-estimator", "namespace": NS}, "data": {"endpoint": env.tls_endpoint}}
        cm["data"]["ca.crt"] = env.tls_ca.decode()
        env.consumer.create("configmaps", cm)
        checks = by_name(await run(env))
        assert checks["estimator-server"].status == "OK", checks["estimator-server"]
        assert "certificate verified with the published ca.crt" in checks["estimator-server"].finding
        assert checks["controller"].status == "OK" and "capacity estimator answers" in checks["controller"].finding

        def other_ca(obj: dict[str, Any]) -> None:
            obj["data"]["ca.crt"] = servingtls.issue("127.0.0.1", days=1).ca_pem.decode()

        env.consumer.update("configmaps", NS, "gpufed-estimator", other_ca)
        c = by_name(await run(env))["estimator-server"]
    assert c.status == "FAIL" and "certificate not signed by the published ca.crt" in c.finding
    assert "--estimator-port" in c.fix


async def test_a_stale_controller_lease_fails(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        env.consumer.create(
            "leases",
            {
                "metadata": {"name": "gpufed-controller", "namespace": NS},
                "spec": {"holderIdentity": "ctl-0", "leaseDurationSeconds": 15, "renewTime": _stamp(100, True)},
            },
        )
        began = time.monotonic()
        c = by_name(await run(env))["controller"]
        elapsed = time.monotonic() - began
    found = re.search(r"last renewed (\d+) s ago by ctl-0", c.finding)
    assert c.status == "FAIL" and found is not None, c
    assert 100 <= int(found[1]) <= 101 + elapsed, c
    assert "gpufed controller --kubeconfig" in c.fix


async def test_an_unreachable_provider_fails_within_its_check_timeout(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(hang_provider=True)) as env:
        started = time.monotonic()
        report = await run(env, check_timeout_s=0.5)
        took = time.monotonic() - started
    checks = by_name(report)
    assert took < 2.5, f"the report took {took:.1f} s"
    assert checks["api"].status == "FAIL" and checks["api"].finding == "no answer within 0.5 s"
    assert "reachable" in checks["api"].fix
    assert checks["grant"].status == "OK", "checks that read only the consumer are unaffected"


async def test_a_refused_connection_to_the_provider_fails_with_the_address(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(provider_url="http://127.0.0.1:1")) as env:
        c = by_name(await run(env))["api"]
    assert c.status == "FAIL" and "cannot reach http://127.0.0.1:1 from here" in c.finding
    assert "--remote-api-server" in c.fix


async def test_missing_credentials_and_an_unknown_peer(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        env.consumer.remove("secrets", NS, f"gpufed-remote-{PROVIDER}")
        checks = by_name(await run(env))
        assert (
            checks["credentials"].status == "FAIL" and "Secret gpufed/gpufed-remote-" in checks["credentials"].finding
        )
        assert "gpufed peer" in checks["credentials"].fix
        assert checks["api"].status == "FAIL"
        report = await run(env, remote_cluster_id="gpu-z-00000000")
    c = report.checks[-1]
    assert (c.name, c.status, c.peer) == ("peering", "FAIL", "gpu-z-00000000")
    assert f"its peers: {PROVIDER}" in c.finding and "gpufed peer" in c.fix


async def test_a_cluster_without_gpufed_fails_the_install_checks(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        for key in [k for k in env.consumer.objects if k[0] in ("customresourcedefinitions", "configmaps")]:
            env.consumer.remove(*key)
        checks = by_name(await run(env))
    assert checks["install"].status == "FAIL" and "CRD foreignclusters.gpufed.io" in checks["install"].finding
    assert "deploy/crds/" in checks["install"].fix
    assert checks["identity"].status == "FAIL" and "gpufed controller --kubeconfig" in checks["identity"].fix


async def test_the_provider_side_view(tmp_path: Path) -> None:
    cert, _key = certificate(90)
    async with environment(tmp_path) as env:
        s = env.consumer
        for key in [k for k in s.objects if k[0] in ("foreignclusters", "resourceslices", "nodes")]:
            s.remove(*key)
        s.create(
            "foreignclusters",
            {"metadata": {"name": "consumer-99"}, "spec": {"clusterId": "consumer-99", "roles": ["Consumer"]}},
        )
        s.create(
            "tenants",
            {
                "metadata": {"name": "consumer-99"},
                "spec": {"consumerClusterId": "consumer-99", "authGeneration": 2},
                "status": {
                    "phase": "Authenticated",
                    "namespace": "gpufed-tenant-consumer-99",
                    "certificate": cert.decode(),
                },
            },
        )
        s.create(
            "resourceslices",
            {
                "metadata": {"name": "gpu-a", "namespace": "gpufed-tenant-consumer-99"},
                "spec": {"providerClusterId": CONSUMER, "resources": {"nvidia.com/gpu": "2"}},
                "status": {"conditions": [{"type": "Resources", "status": "False", "reason": "InsufficientCapacity"}]},
            },
        )
        report = await run(env)
    assert [(c.name, c.status) for c in report.checks if c.peer == "consumer-99"] == [
        ("tunnel", "WARN"),
        ("tenant", "OK"),
        ("tenant-certificate", "OK"),
        ("tenant-grant", "FAIL"),
    ]
    assert [(p.cluster_id, p.role) for p in report.peers] == [("consumer-99", "consumer")]
    tunnel = next(c for c in report.checks if c.name == "tunnel")
    assert tunnel.fix.endswith(f"--remote-kubeconfig {env.kubeconfig}"), "run from the consumer, pointing at us"
    assert by_name(report)["webhook"].status == "OK"


# ---------------------------------------------------------------------------------------- the CLI


class Background:
    """An event loop in a thread serving an `environment`, so the CLI can run its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def start(self, tmp_path: Path, sc: Scenario | None = None) -> Env:
        return self.call(self.stack.enter_async_context(environment(tmp_path, sc)))

    def close(self) -> None:
        self.call(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


runner = CliRunner()


def test_cli_json_and_table_of_a_healthy_peering(tmp_path: Path, background: Background) -> None:
    env = background.start(tmp_path)
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(env.kubeconfig), "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["clusterId"] == CONSUMER and data["status"] == "WARN"
    assert {c["name"]: c["status"] for c in data["checks"]}["api"] == "OK"
    assert data["peers"] == [{"clusterId": PROVIDER, "role": "provider"}]

    res = runner.invoke(app, ["doctor", "--kubeconfig", str(env.kubeconfig)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "gpufed doctor: cluster" in text and "no network fabric" in text and "WARN: 10 OK, 1 WARN, 0 FAIL" in text


def test_cli_exits_1_on_a_fail(tmp_path: Path, background: Background) -> None:
    env = background.start(tmp_path, Scenario(webhook=False))
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(env.kubeconfig), "-o", "json"])
    assert res.exit_code == 1, res.output
    webhook = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "webhook")
    assert webhook["status"] == "FAIL" and "--webhook-port" in webhook["fix"]


def test_cli_bad_usage_exits_2(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "-o", "yaml"])
    assert res.exit_code == 2 and "--output must be table or json" in res.output
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--timeout", "0"])
    assert res.exit_code == 2 and "--timeout must be" in res.output
    for bad in ("0", "nan"):
        res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--slow-api-ms", bad])
        assert res.exit_code == 2 and "--slow-api-ms must be a positive number" in res.output, bad
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--remote-cluster-id", "Bad_ID"])
    assert res.exit_code == 2 and "invalid cluster ID" in " ".join(res.output.split())
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc)])
    assert res.exit_code == 1 and "does not exist" in " ".join(res.output.split())
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_cli_unreadable_clusters_are_one_line_errors(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(_kubeconfig("http://127.0.0.1:1", {"token": "x"})))
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--timeout", "2"])
    out = " ".join(res.output.split())
    assert res.exit_code == 1 and "cannot reach the API server http://127.0.0.1:1" in out, out
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--context", "nope"])
    assert res.exit_code == 1 and "nope" in " ".join(res.output.split())
    kc.write_text("not: [a kubeconfig")
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc)])
    assert res.exit_code == 1 and "cannot load kubeconfig" in " ".join(res.output.split())
