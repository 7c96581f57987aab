"""`gpufed doctor`'s probes: the reading behind each check, against this cluster and its peers.

Owns: `Probes`, one coroutine per check that reads what it needs and returns its `Check`s (this
cluster's install, controller Lease, offloading webhook and capacity estimator; per provider its
authentication, stored credentials, API round trip, grant, virtual nodes, estimator; per consumer
its Tenant; per peer the tunnel), `ProviderLink` (the stored credentials of one provider and the
API client made from them), and the reads they share. Probes whose findings depend on how the
reading went (a TLS handshake, an HTTP status) decide them here; the others hand what they read
to `verdicts`.

Read-only: nothing is written anywhere; of stored credentials only the certificate's public fields
reach a finding. Does not: bound a probe's time or turn its exceptions into FAILs (`report` does).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml
from cryptography import x509

from gpufed.apis.kinds import KINDS
from gpufed.apis.meta import API_VERSION, GROUP
from gpufed.apis.wire import (
    CONSUMER_CONTROL_ROLE,
    CONSUMER_LABEL,
    CONSUMER_WORKLOADS_ROLE,
    ESTIMATOR_CONFIGMAP,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    remote_kubeconfig_secret,
    tenant_namespace,
)
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.ops.doctor.checks import FAIL, OK, THIS_CLUSTER, WARN, Check
from gpufed.ops.doctor.settings import DoctorSettings
from gpufed.ops.doctor.verdicts import (
    CONTROLLER_LEASE,
    client_certificate,
    condition,
    judge_certificate,
    judge_grant,
    judge_install,
    judge_mtu,
    judge_nodes,
    judge_serving_certificates,
    judge_tunnel,
    one_line,
)
from gpupool.estimator.client import EstimatorError, from_provider
from vkprovider.webhook.server import WEBHOOK_CONFIGURATION

#: A probe as `report` runs it: a coroutine returning its checks.
Probe = Callable[[], Awaitable[list[Check]]]
#: Makes an API client from a provider's kubeconfig (gpufed.kube.client.client_from_dict; tests pass fakes).
ClientFactory = Callable[[dict[str, Any]], Awaitable[Any]]


def webhook_target(cfg: Mapping[str, Any]) -> tuple[str, str, str | None, Mapping[str, Any] | None]:
    """(webhook name, caBundle PEM or "", the /healthz URL for a `url` clientConfig, the `service`
    reference otherwise) of the configuration's first webhook; ValueError when it has none."""
    hooks = cfg.get("webhooks") or []
    if not hooks:
        raise ValueError(f"MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} has no webhooks")
    hook = hooks[0]
    client = hook.get("clientConfig") or {}
    ca = ""
    if client.get("caBundle"):
        try:
            ca = base64.b64decode(str(client["caBundle"]), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise ValueError(f"the caBundle is not base64 PEM: {e}") from e
    url = client.get("url")
    health = None
    if url:
        parts = urlsplit(str(url))
        health = f"{parts.scheme}://{parts.netloc}/healthz"
    return str(hook.get("name") or ""), ca, health, client.get("service")


@dataclass
class ProviderLink:
    """The consumer's credentials for one provider and an API client made from them (lazily, once)."""

    api: Any
    provider: str
    factory: ClientFactory
    _secret: dict[str, Any] | None = None
    _read: bool = False
    _client: Any = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def secret(self) -> dict[str, Any] | None:
        async with self._lock:
            if not self._read:
                self._secret = await rest.get(
                    self.api,
                    rest.path("v1", "secrets", remote_kubeconfig_secret(ClusterID(self.provider)), SYSTEM_NAMESPACE),
                )
                self._read = True
            return self._secret

    async def kubeconfig(self) -> dict[str, Any]:
        secret = await self.secret()
        name = f"{SYSTEM_NAMESPACE}/{remote_kubeconfig_secret(ClusterID(self.provider))}"
        raw = ((secret or {}).get("data") or {}).get("kubeconfig")
        if secret is None or not raw:
            raise LookupError(f"no credentials for {self.provider}: Secret {name} is missing or holds no kubeconfig")
        try:
            cfg = yaml.safe_load(base64.b64decode(str(raw)))
        except (binascii.Error, ValueError, yaml.YAMLError) as e:
            raise LookupError(f"Secret {name} holds no usable kubeconfig ({type(e).__name__})") from e
        if not isinstance(cfg, dict):
            raise LookupError(f"Secret {name} holds no usable kubeconfig")
        return cfg

    async def client(self) -> Any:
        cfg = await self.kubeconfig()
        async with self._lock:
            if self._client is None:
                self._client = await self.factory(cfg)
            return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


async def get_object(api: Any, path: str) -> dict[str, Any] | None:
    """The object at `path`; None when it does not exist."""
    return await rest.get(api, path)


async def list_objects(api: Any, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every item; [] when the kind is not served at all (a missing CRD shows in the install check)."""
    try:
        return await rest.list_items(api, path, params=params)
    except KubeError as e:
        if e.not_found:
            return []
        raise


def issued_renewals(csrs: list[dict[str, Any]], consumer: str) -> list[x509.Certificate]:
    """The certificates issued for `consumer`'s renewal requests among `csrs` (filed by its own user)."""
    out: list[x509.Certificate] = []
    for csr in csrs:
        issued = (csr.get("status") or {}).get("certificate")
        if (csr.get("spec") or {}).get("username") != f"gpufed:consumer:{consumer}" or not issued:
            continue
        with contextlib.suppress(ValueError, binascii.Error):
            out.append(x509.load_pem_x509_certificate(base64.b64decode(str(issued), validate=True)))
    return out


class Probes:
    """The probes of one run: the cluster behind `api`, judged at `now`. Probes of this cluster
    record what of the controller answered (`answering`), the controller verdict's evidence when
    there is no leader Lease; `cluster_id` is this cluster's, once its identity was read."""

    def __init__(self, api: Any, settings: DoctorSettings, now: dt.datetime) -> None:
        self.api = api
        self.s = settings
        self.now = now
        self.cluster_id = ""
        #: What the controller serves that answered (evidence that it runs).
        self.answering: list[str] = []

    def restart(self, flag: str) -> str:
        """The fix that restarts this cluster's controller with `flag`."""
        return f"restart the controller with {flag}: gpufed controller {self.s.flags} {flag}"

    def peer_cmd(self) -> str:
        """The handshake with a provider, run against this cluster."""
        return f"gpufed peer {self.s.flags} --remote-kubeconfig <provider kubeconfig>"

    def connect_cmd(self, peer: str, role: str) -> str:
        """The command that creates the fabric with `peer`, as whoever holds both kubeconfigs runs it."""
        if role == "consumer":  # checked from the provider: the consumer's kubeconfig is the --kubeconfig
            return (
                f"gpufed network connect --kubeconfig <consumer kubeconfig> --remote-kubeconfig {self.s.kubeconfig}"
                + (f" --remote-context {self.s.context}" if self.s.context else "")
            )
        return f"gpufed network connect {self.s.flags} --remote-kubeconfig <kubeconfig of {peer}>"

    # ---- this cluster

    async def install(self) -> list[Check]:
        wanted = {
            f"CRD {k.plural}.{GROUP}": f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{k.plural}.{GROUP}"
            for k in KINDS
        }
        for role in (CONSUMER_WORKLOADS_ROLE, CONSUMER_CONTROL_ROLE):
            wanted[f"ClusterRole {role}"] = rest.path("rbac.authorization.k8s.io/v1", "clusterroles", role)
        found = await asyncio.gather(*(get_object(self.api, path) for path in wanted.values()))  # side by side
        missing = [what for what, obj in zip(wanted, found, strict=True) if obj is None]
        return [judge_install(missing, fix_flags=self.s.flags)]

    async def lease(self) -> dict[str, Any] | None:
        return await get_object(
            self.api, rest.path("coordination.k8s.io/v1", "leases", CONTROLLER_LEASE, SYSTEM_NAMESPACE)
        )

    async def webhook(self, consumes: bool) -> list[Check]:
        restart = self.restart("--webhook-port PORT") + " (it registers the webhook at start)"
        cfg = await get_object(
            self.api,
            rest.path("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", WEBHOOK_CONFIGURATION),
        )
        if cfg is None:
            if not consumes:
                return [
                    Check(
                        "webhook",
                        WARN,
                        f"no MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} "
                        "(only needed where pods are offloaded)",
                        restart,
                    )
                ]
            return [
                Check(
                    "webhook",
                    FAIL,
                    f"MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} is missing: pods of offloaded namespaces "
                    "get no toleration and never run on virtual nodes",
                    restart,
                )
            ]
        name, ca, health, service = webhook_target(cfg)
        if not ca:
            return [Check("webhook", FAIL, f"webhook {name} has no caBundle: the API server cannot call it", restart)]
        if health is not None:
            ctx = ssl.create_default_context(cadata=ca)
            started = time.perf_counter()
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(health, ssl=ctx, timeout=aiohttp.ClientTimeout(total=self.s.check_timeout_s)) as r,
                ):
                    answer = r.status
            except aiohttp.ClientConnectorCertificateError as e:
                return [
                    Check(
                        "webhook",
                        FAIL,
                        f"{health}: the certificate is not signed by the configuration's caBundle "
                        f"({e.certificate_error})",
                        restart + " (it re-registers the caBundle)",
                    )
                ]
            except (aiohttp.ClientError, OSError) as e:
                return [
                    Check(
                        "webhook",
                        FAIL,
                        one_line(
                            f"{health} does not answer ({type(e).__name__}: {e}); with failurePolicy Fail the API "
                            "server refuses pods in offloaded namespaces"
                        ),
                        f"start the controller: gpufed controller {self.s.flags} --webhook-port PORT; to unblock pod "
                        f"creation meanwhile: {self.s.kubectl} delete mutatingwebhookconfiguration "
                        f"{WEBHOOK_CONFIGURATION}",
                    )
                ]
            ms = (time.perf_counter() - started) * 1000
            if answer != 200:
                return [Check("webhook", FAIL, f"{health} answered HTTP {answer}", restart)]
            self.answering.append("offloading webhook")
            return [Check("webhook", OK, f"{health} answers over TLS verified with the caBundle ({ms:.0f} ms)")]
        svc = service or {}
        ns, svc_name = str(svc.get("namespace") or ""), str(svc.get("name") or "")
        where = f"Service {ns}/{svc_name}"
        if await get_object(self.api, rest.path("v1", "services", svc_name, ns)) is None:
            return [Check("webhook", FAIL, f"webhook {name} points at {where}, which does not exist", restart)]
        slices = await list_objects(
            self.api,
            rest.path("discovery.k8s.io/v1", "endpointslices", namespace=ns),
            {"labelSelector": f"kubernetes.io/service-name={svc_name}"},
        )
        ready = sum(
            1
            for es in slices
            for ep in es.get("endpoints") or []
            if (ep.get("conditions") or {}).get("ready") is not False
        )
        if not ready:
            return [
                Check(
                    "webhook",
                    FAIL,
                    f"{where} has no ready endpoints: the API server cannot call the webhook",
                    f"check the controller's pods: {self.s.kubectl} -n {ns} get pods; "
                    f"{self.s.kubectl} -n {ns} describe service {svc_name}",
                )
            ]
        self.answering.append("offloading webhook")
        return [
            Check(
                "webhook",
                OK,
                f"{where} has {ready} ready endpoint(s) (a Service cannot be called from outside the cluster: "
                "not probed over TLS)",
            )
        ]

    async def estimator_server(self) -> list[Check]:
        """The capacity estimator this cluster serves (when it publishes one): TLS to its endpoint."""
        cm = await get_object(self.api, rest.path("v1", "configmaps", ESTIMATOR_CONFIGMAP, SYSTEM_NAMESPACE))
        if cm is None:
            return []
        data = cm.get("data") or {}
        endpoint, ca = str(data.get("endpoint") or ""), str(data.get("ca.crt") or "")
        fix = self.restart("--estimator-port PORT") + f" (it publishes {ESTIMATOR_CONFIGMAP})"
        if not endpoint or not ca:
            return [Check("estimator-server", FAIL, f"ConfigMap {ESTIMATOR_CONFIGMAP} lacks endpoint or ca.crt", fix)]
        check = await _tls_reachable("estimator-server", THIS_CLUSTER, endpoint, ca, fix)
        if check.status == OK:
            self.answering.append("capacity estimator")
        return [check]

    # ---- a provider this cluster consumes from

    async def auth(self, peer: str, fc: Mapping[str, Any]) -> list[Check]:
        phase = str((fc.get("status") or {}).get("phase") or "Pending")
        auth = condition(fc, "Authentication")
        if phase == "Peered" and auth.get("status") == "True":
            return [Check("peering", OK, f"Peered; {one_line(str(auth.get('message') or ''), 160)}", "", peer)]
        why = one_line(f"{auth.get('reason') or 'no Authentication condition'}: {auth.get('message') or ''}", 200)
        return [
            Check(
                "peering",
                FAIL,
                f"phase {phase}, authentication not done ({why.rstrip(': ')})",
                f"run the handshake again: {self.peer_cmd()}",
                peer,
            )
        ]

    async def credentials(self, peer: str, link: ProviderLink) -> list[Check]:
        renew = (
            f"renew them: raise spec.authGeneration of Tenant {self.cluster_id or '<consumer-id>'} on the provider "
            f"(kubectl --context <provider> edit tenant.gpufed.io {self.cluster_id or '<consumer-id>'}), "
            f"then run {self.peer_cmd()} again"
        )
        try:
            cfg = await link.kubeconfig()
        except LookupError as e:
            return [Check("credentials", FAIL, str(e), f"re-run the handshake: {self.peer_cmd()}", peer)]
        cert = client_certificate(cfg)
        if cert is None:
            return [
                Check("credentials", OK, "the stored kubeconfig authenticates without a client certificate", "", peer)
            ]
        return [judge_certificate("credentials", peer, cert, self.now, self.s.expiry_warning, renew)]

    async def api_rtt(self, peer: str, link: ProviderLink) -> list[Check]:
        cfg = await link.kubeconfig()
        clusters = {c.get("name"): c.get("cluster") or {} for c in cfg.get("clusters") or [] if isinstance(c, dict)}
        server = next((str(c.get("server")) for c in clusters.values() if c.get("server")), "?")
        client = await link.client()
        started = time.perf_counter()
        try:
            version = await rest.request(
                client, "GET", "/version", request_timeout=self.s.check_timeout_s, what=f"GET {server}/version"
            )
        except KubeError as e:
            if e.forbidden:
                return [
                    Check(
                        "api",
                        FAIL,
                        one_line(f"{server} refuses the stored credentials: {e}"),
                        f"the certificate was revoked or expired: re-run the handshake ({self.peer_cmd()})",
                        peer,
                    )
                ]
            return [
                Check(
                    "api",
                    FAIL,
                    one_line(f"cannot reach {server} from here: {e}"),
                    f"check that {server} is reachable (DNS, firewall); if the provider's API moved, peer again "
                    f"with --remote-api-server URL ({self.peer_cmd()} --remote-api-server URL)",
                    peer,
                )
            ]
        ms = (time.perf_counter() - started) * 1000
        finding = f"GET {server}/version answered in {ms:.0f} ms ({version.get('gitVersion') or 'unknown version'})"
        if ms > self.s.slow_api_ms:
            return [
                Check(
                    "api",
                    WARN,
                    f"slow: {finding}",
                    "the provider's API server is overloaded or far away; virtual kubelets will lag",
                    peer,
                )
            ]
        return [Check("api", OK, finding, "", peer)]

    async def grant(self, peer: str) -> list[Check]:
        slices = await list_objects(self.api, rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE))
        mine = [s for s in slices if (s.get("spec") or {}).get("providerClusterId") == peer]
        return [
            judge_grant(
                "grant",
                peer,
                mine,
                consumer=self.cluster_id,
                peer_cmd=self.peer_cmd(),
                where=f"namespace {SYSTEM_NAMESPACE}",
            )
        ]

    async def nodes(self, peer: str) -> list[Check]:
        nodes = await list_objects(self.api, "/api/v1/nodes", {"labelSelector": f"{REMOTE_CLUSTER_LABEL}={peer}"})
        leases: dict[str, dict[str, Any] | None] = {}
        for n in nodes:
            name = str(n["metadata"]["name"])
            leases[name] = await get_object(
                self.api, rest.path("coordination.k8s.io/v1", "leases", name, "kube-node-lease")
            )
        served: dict[str, x509.Certificate | str] = {}
        for n in nodes:
            served[str(n["metadata"]["name"])] = await served_certificate(n)
        return [
            judge_nodes(peer, nodes, leases, self.now, kubectl=self.s.kubectl),
            judge_serving_certificates(peer, served, self.now, self.s.expiry_warning),
        ]

    async def estimator(self, peer: str, link: ProviderLink) -> list[Check]:
        fix = (
            f"check the provider's controller (--estimator-port) and that the endpoint in its ConfigMap "
            f"{SYSTEM_NAMESPACE}/{ESTIMATOR_CONFIGMAP} is reachable from here"
        )
        cfg = await link.kubeconfig()
        client = await link.client()
        try:
            est = await from_provider(client, cfg, timeout_s=self.s.check_timeout_s)
        except EstimatorError as e:
            return [Check("estimator", FAIL, one_line(str(e)), fix, peer)]
        if est is None:
            return [
                Check(
                    "estimator",
                    OK,
                    "the provider publishes no capacity estimator: virtual nodes advertise the grant",
                    "",
                    peer,
                )
            ]
        async with est:
            started = time.perf_counter()
            try:
                snap = await est.get_capacity()
            except EstimatorError as e:
                return [Check("estimator", FAIL, one_line(str(e)), fix, peer)]
            ms = (time.perf_counter() - started) * 1000
        free = sum(p.free for p in snap.products)
        total = sum(p.total for p in snap.products)
        return [
            Check(
                "estimator",
                OK,
                f"{est.endpoint} answers GetCapacity in {ms:.0f} ms "
                f"(revision {snap.revision}: {free} of {total} GPUs free)",
                "",
                peer,
            )
        ]

    # ---- both roles: the fabric

    async def tunnel(self, peer: str, role: str) -> list[Check]:
        gw = await get_object(self.api, rest.path(API_VERSION, "gateways", peer, SYSTEM_NAMESPACE))
        conn = await get_object(self.api, rest.path(API_VERSION, "connections", peer, SYSTEM_NAMESPACE))
        connect = self.connect_cmd(peer, "consumer" if role == "consumer" else "provider")
        out = [judge_tunnel(peer, gw, conn, self.now, stale_s=self.s.handshake_stale_s, connect_cmd=connect)]
        if gw is not None:
            out.append(judge_mtu(peer, gw, underlay_mtu=self.s.underlay_mtu, connect_cmd=connect))
        return out

    # ---- a consumer this cluster provides for

    async def _renewed_certificates(self, consumer: str) -> list[x509.Certificate]:
        """Certificates issued for the consumer's renewals that the CSR API still holds ([] when it
        cannot be read)."""
        try:
            csrs = await list_objects(
                self.api,
                "/apis/certificates.k8s.io/v1/certificatesigningrequests",
                params={"labelSelector": f"{CONSUMER_LABEL}={consumer}"},
            )
        except KubeError:
            return []
        return issued_renewals(csrs, consumer)

    async def tenant(self, peer: str) -> list[Check]:
        fix = (
            f"the consumer runs the handshake: gpufed peer --kubeconfig <consumer kubeconfig> "
            f"--remote-kubeconfig {self.s.kubeconfig}"
            + (f" --remote-context {self.s.context}" if self.s.context else "")
        )
        t = await get_object(self.api, rest.path(API_VERSION, "tenants", peer))
        if t is None:
            return [Check("tenant", FAIL, f"no Tenant {peer}: the consumer never completed `gpufed peer`", fix, peer)]
        st = t.get("status") or {}
        phase = str(st.get("phase") or "Pending")
        auth = condition(t, "Authentication")
        if phase == "Refused":
            why = one_line(f"{auth.get('reason')}: {auth.get('message')}", 200)
            return [Check("tenant", FAIL, f"Tenant {peer} Refused ({why})", fix, peer)]
        if phase != "Authenticated":
            return [Check("tenant", WARN, f"Tenant {peer} is {phase}: the handshake is not finished", fix, peer)]
        checks = [Check("tenant", OK, f"Tenant {peer} Authenticated, namespace {st.get('namespace') or '?'}", "", peer)]
        pem = str(st.get("certificate") or "")
        if pem:
            try:
                cert = x509.load_pem_x509_certificate(pem.encode())
            except ValueError as e:
                checks.append(
                    Check("tenant-certificate", FAIL, f"the issued certificate does not load: {e}", fix, peer)
                )
            else:
                generation = int((t.get("spec") or {}).get("authGeneration") or 1) + 1
                patch = json.dumps({"spec": {"authGeneration": generation}}, separators=(",", ":"))
                renew = (
                    f"{self.s.kubectl} patch tenant.gpufed.io {peer} --type=merge -p '{patch}', "
                    "then the consumer runs `gpufed peer` again"
                )
                cert = max([cert, *await self._renewed_certificates(peer)], key=lambda c: c.not_valid_after_utc)
                check = judge_certificate("tenant-certificate", peer, cert, self.now, self.s.expiry_warning, renew)
                if check.status != OK:
                    # Renewed certificates are recorded here only while their request lives (the CSR
                    # API removes issued ones after an hour); the consumer knows its current one.
                    check = Check(
                        "tenant-certificate",
                        WARN,
                        f"{check.finding}; the consumer renews its certificate itself and this cluster keeps "
                        "no record of renewed ones after an hour",
                        "check the consumer: `gpufed doctor` there (`credentials`), or its metric "
                        f"gpufed_credential_expiry_timestamp_seconds; to renew by hand: {renew}",
                        peer,
                    )
                checks.append(check)
        tns = str(st.get("namespace") or tenant_namespace(ClusterID(peer)))
        slices = await list_objects(self.api, rest.path(API_VERSION, "resourceslices", namespace=tns))
        checks.append(
            judge_grant(
                "tenant-grant",
                peer,
                slices,
                consumer=peer,
                peer_cmd=f"gpufed peer --kubeconfig <consumer kubeconfig> --remote-kubeconfig {self.s.kubeconfig}",
                where=f"namespace {tns}",
            )
        )
        return checks


async def served_certificate(node: Mapping[str, Any], timeout_s: float = 5.0) -> x509.Certificate | str:
    """The certificate a node's kubelet API serves at its InternalIP and kubelet port, or why it could
    not be read. Only the public certificate is read: the handshake verifies nothing (its validity is
    what is judged) and nothing is sent over the connection."""
    status = node.get("status") or {}
    address = next((a.get("address") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), None)
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    if not address or not isinstance(port, int) or not port:
        return "the node names no InternalIP and kubelet port"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port, ssl=ctx), timeout_s)
    except (OSError, ssl.SSLError, TimeoutError) as e:
        return one_line(f"its kubelet API {address}:{port} does not answer TLS from here: {e}")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der) if der else "its kubelet API presented no certificate"
    except ValueError as e:
        return one_line(f"its kubelet API {address}:{port} presented an unreadable certificate: {e}")
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


async def _tls_reachable(name: str, peer: str, endpoint: str, ca_pem: str, fix: str) -> Check:
    """TCP + TLS to `endpoint`, the server verified with `ca_pem` (no client certificate is offered:
    a server that then refuses the handshake is still reachable)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        return Check(name, FAIL, f"endpoint {endpoint!r} is not host:port", fix, peer)
    host = host.strip("[]")
    ctx = ssl.create_default_context(cadata=ca_pem)
    ctx.set_alpn_protocols(["h2"])
    started = time.perf_counter()
    try:
        _reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        return Check(
            name, FAIL, one_line(f"{endpoint}: certificate not signed by the published ca.crt: {e}"), fix, peer
        )
    except ssl.SSLError as e:
        if "CERTIFICATE_REQUIRED" in str(e).upper() or "HANDSHAKE_FAILURE" in str(e).upper():
            ms = (time.perf_counter() - started) * 1000
            return Check(
                name, OK, f"{endpoint} answers TLS in {ms:.0f} ms (it requires a consumer certificate)", "", peer
            )
        return Check(name, FAIL, one_line(f"{endpoint}: TLS failed: {e}"), fix, peer)
    except OSError as e:
        return Check(name, FAIL, one_line(f"{endpoint} does not answer: {e}"), fix, peer)
    ms = (time.perf_counter() - started) * 1000
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return Check(
        name, OK, f"{endpoint} answers TLS in {ms:.0f} ms (certificate verified with the published ca.crt)", "", peer
    )
