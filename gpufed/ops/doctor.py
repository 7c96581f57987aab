"""`gpufed doctor`: check a cluster's peerings end to end and say what is wrong and how to fix it.

Owns: the checks and their verdicts. Each check yields a `Check` (OK / WARN / FAIL, a one-line
finding and, unless OK, a concrete fix: a command or what to change). The verdicts are pure
functions of what was read (`judge_*`, with the time passed in); `diagnose` does the reading, one
coroutine per check, each under its own timeout, all at once, so an unreachable provider costs one
timeout and never hangs the report.

What is checked, run against the cluster of `--kubeconfig`/`--context`:
- this cluster: gpufed installed (CRDs, ClusterRoles), its identity (ConfigMap gpufed/gpufed-identity),
  the controller running (leader Lease gpufed/gpufed-controller when there is one, else its
  webhook answering), the offloading webhook (configuration, caBundle, /healthz over TLS verified
  with that caBundle, or the endpoints of a Service), the capacity estimator it serves (TLS);
- per provider it consumes from (ForeignCluster with role Provider): authentication, the client
  certificate of the stored credentials (expiry), the provider's API with those credentials
  (GET /version round trip), the grant (ResourceSlice decision), the virtual nodes (Ready, lease),
  the tunnel (Connection handshake age, MTU) and the provider's capacity estimator (GetCapacity);
- per consumer it provides for (role Consumer): the Tenant's handshake, the certificate issued to
  the consumer, the grants of its slices, the tunnel.

Invariants: read-only (nothing is written anywhere); keys and tokens are never read into a finding
(only certificates' public fields are shown); a check that fails to read what it needs is a FAIL
naming the error, never an exception out of `diagnose`.

Does not: print (the CLI renders the `Report`), repair anything, or reach the consumer's cluster
from a provider (a provider has no credentials there).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import ipaddress
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpufed.apis.models import API_VERSION, GROUP, KINDS, split_endpoint
from gpufed.apis.quantity import QuantityError, parse
from gpufed.apis.wire import (
    CONSUMER_CONTROL_ROLE,
    CONSUMER_WORKLOADS_ROLE,
    ESTIMATOR_CONFIGMAP,
    IDENTITY_CONFIGMAP,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    parse_cluster_id,
    remote_kubeconfig_secret,
    tenant_namespace,
)
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client, client_from_dict
from gpupool.estimator.client import EstimatorError, from_provider
from netfabric.controllers.gateway import HANDSHAKE_STALE_S
from netfabric.ipam import MIN_MTU, WIREGUARD_OVERHEAD_IPV4, WIREGUARD_OVERHEAD_IPV6
from vkprovider import defaults
from vkprovider.webhook.server import WEBHOOK_CONFIGURATION

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
_RANK: dict[Status, int] = {OK: 0, WARN: 1, FAIL: 2}

#: Seconds one check may take (each check has its own budget).
DEFAULT_CHECK_TIMEOUT_S = defaults.DOCTOR_CHECK_TIMEOUT_S
#: A client certificate with less than this left is a WARN.
DEFAULT_EXPIRY_WARNING = dt.timedelta(days=7)
#: A tunnel whose last WireGuard handshake is older than this is a FAIL (WireGuard's REJECT_AFTER_TIME).
DEFAULT_HANDSHAKE_STALE_S = HANDSHAKE_STALE_S
#: A provider API round trip slower than this (ms) is a WARN.
DEFAULT_SLOW_API_MS = defaults.DOCTOR_SLOW_API_MS
#: Underlay MTU assumed when judging a tunnel's MTU (standard Ethernet; jumbo-frame networks say so).
DEFAULT_UNDERLAY_MTU = defaults.DOCTOR_UNDERLAY_MTU
#: The controller's leader Lease (namespace gpufed), read when present.
CONTROLLER_LEASE = "gpufed-controller"
#: Fixes of checks that time out or fail before they could say more.
API_FIX = "check that the provider's API server is reachable from here (DNS, firewall, VPN)"
ESTIMATOR_FIX = "check the provider's controller (--estimator-port) and that its estimator endpoint is reachable"
#: Name of a check that concerns this cluster rather than one peer.
THIS_CLUSTER = ""


class DoctorError(GpufedError):
    """The cluster to check cannot be read at all (no kubeconfig, unreachable); the message says why."""


@dataclass(frozen=True)
class Check:
    #: What was checked, e.g. `credentials`.
    name: str
    status: Status
    #: One line: what was found.
    finding: str
    #: Unless OK: a command to run or what to change.
    fix: str = ""
    #: The peer's ClusterID the check is about; "" for this cluster.
    peer: str = THIS_CLUSTER


@dataclass(frozen=True)
class Peer:
    cluster_id: str
    #: What the peer is to this cluster: `provider`, `consumer` or `provider+consumer`.
    role: str


@dataclass(frozen=True)
class Report:
    cluster_id: str
    api_server: str
    peers: tuple[Peer, ...]
    checks: tuple[Check, ...]

    @property
    def status(self) -> Status:
        return max((c.status for c in self.checks), key=_RANK.__getitem__, default=OK)

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, Any]:
        return {
            "clusterId": self.cluster_id,
            "apiServer": self.api_server,
            "status": self.status,
            "peers": [{"clusterId": p.cluster_id, "role": p.role} for p in self.peers],
            "checks": [
                {"peer": c.peer, "name": c.name, "status": c.status, "finding": c.finding, "fix": c.fix}
                for c in self.checks
            ],
        }


@dataclass(frozen=True)
class DoctorSettings:
    #: kubeconfig of the cluster to check (usually the consumer).
    kubeconfig: Path
    #: Context in it (None: current context).
    context: str | None = None
    #: Check only this peer (None: every ForeignCluster).
    remote_cluster_id: str | None = None
    #: Seconds each check may take.
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    #: Client certificates with less than this left are a WARN (default 7 days).
    expiry_warning: dt.timedelta = DEFAULT_EXPIRY_WARNING
    #: Seconds after which a tunnel's last handshake is stale (default 180).
    handshake_stale_s: float = DEFAULT_HANDSHAKE_STALE_S
    #: Provider API round trips slower than this many ms are a WARN (default 1000).
    slow_api_ms: float = DEFAULT_SLOW_API_MS
    #: Underlay MTU in bytes the tunnel MTU must leave WireGuard's overhead room in (default 1500).
    underlay_mtu: int = DEFAULT_UNDERLAY_MTU

    @property
    def flags(self) -> str:
        """`--kubeconfig K [--context C]`, for the commands a fix names."""
        return f"--kubeconfig {self.kubeconfig}" + (f" --context {self.context}" if self.context else "")

    @property
    def kubectl(self) -> str:
        return f"kubectl {self.flags}"


# ---------------------------------------------------------------------------------------- helpers


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def parse_time(value: object) -> dt.datetime | None:
    """A Kubernetes timestamp (Time or MicroTime, RFC 3339) as an aware datetime; None when absent or bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def human(seconds: float) -> str:
    """A duration for a finding: `42 s`, `5 min`, `3.0 h`, `12 days`."""
    s = abs(seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return {}


def _cn(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


# ---------------------------------------------------------------------------------------- verdicts (pure)


def judge_install(missing: Sequence[str], *, fix_flags: str) -> Check:
    if missing:
        return Check(
            "install",
            FAIL,
            "gpufed is not installed: missing " + ", ".join(missing),
            f"install it with an admin kubeconfig: kubectl {fix_flags} apply -f deploy/crds/ -f deploy/rbac/",
        )
    return Check("install", OK, f"{len(KINDS)} CRDs and the consumer ClusterRoles are installed")


def judge_identity(cm: Mapping[str, Any] | None, *, fix_flags: str) -> Check:
    if cm is None:
        return Check(
            "identity",
            FAIL,
            f"no gpufed identity (ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP}): "
            "the controller never started here",
            f"start the controller: gpufed controller {fix_flags} (it creates the identity at first start)",
        )
    data = cm.get("data") or {}
    try:
        cid = parse_cluster_id(str(data.get("clusterId") or ""))
    except ValueError as e:
        return Check(
            "identity",
            FAIL,
            f"ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP} is damaged: {e}",
            "restore the ConfigMap from a backup, or restart `gpufed controller` (it restores it from its Secret)",
        )
    return Check("identity", OK, f"ClusterID {cid} (key {data.get('fingerprint') or '?'})")


def judge_controller(lease: Mapping[str, Any] | None, now: dt.datetime, *, answering: Sequence[str], fix: str) -> Check:
    """From the leader Lease when there is one, else from what the controller serves answering
    (`answering`: e.g. its offloading webhook, its capacity estimator)."""
    if lease is not None:
        spec = lease.get("spec") or {}
        renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or 15)
        holder = spec.get("holderIdentity") or "nobody"
        if renewed is None:
            return Check(
                "controller", FAIL, f"leader Lease {SYSTEM_NAMESPACE}/{CONTROLLER_LEASE} was never renewed", fix
            )
        age = (now - renewed).total_seconds()
        if age > duration:
            return Check(
                "controller",
                FAIL,
                f"leader Lease {SYSTEM_NAMESPACE}/{CONTROLLER_LEASE} last renewed {human(age)} ago by {holder} "
                f"(expires after {duration:.0f} s): no controller is running",
                fix,
            )
        return Check("controller", OK, f"leader {holder} renewed its Lease {human(age)} ago")
    if answering:
        verb = "answers" if len(answering) == 1 else "answer"
        return Check("controller", OK, f"running: its {' and its '.join(answering)} {verb} (no leader Lease to read)")
    return Check(
        "controller",
        WARN,
        f"cannot confirm that `gpufed controller` runs: no leader Lease {SYSTEM_NAMESPACE}/{CONTROLLER_LEASE} "
        "and neither its webhook nor its capacity estimator answers",
        fix,
    )


def judge_certificate(
    name: str, peer: str, cert: x509.Certificate, now: dt.datetime, warning: dt.timedelta, fix: str
) -> Check:
    """Expired or not yet valid: FAIL; less than `warning` left: WARN."""
    after, before = cert.not_valid_after_utc, cert.not_valid_before_utc
    who = f"client certificate {_cn(cert)}"
    if now >= after:
        return Check(
            name, FAIL, f"{who} expired {human((now - after).total_seconds())} ago ({after:%Y-%m-%d})", fix, peer
        )
    if now < before:
        return Check(
            name,
            FAIL,
            f"{who} is not valid before {before:%Y-%m-%dT%H:%M:%SZ} (is this machine's clock right?)",
            fix,
            peer,
        )
    left = after - now
    if left < warning:
        return Check(
            name, WARN, f"{who} expires in {human(left.total_seconds())} ({after:%Y-%m-%dT%H:%M:%SZ})", fix, peer
        )
    return Check(name, OK, f"{who} valid until {after:%Y-%m-%d} ({human(left.total_seconds())} left)", "", peer)


def client_certificate(kubeconfig: Mapping[str, Any]) -> x509.Certificate | None:
    """The client certificate of the kubeconfig's current user (None: it authenticates otherwise,
    e.g. with a token). Only public data is read; keys and tokens are left alone."""
    users = {u.get("name"): u.get("user") or {} for u in kubeconfig.get("users") or [] if isinstance(u, Mapping)}
    contexts = {
        c.get("name"): c.get("context") or {} for c in kubeconfig.get("contexts") or [] if isinstance(c, Mapping)
    }
    current = contexts.get(kubeconfig.get("current-context")) or {}
    user = users.get(current.get("user"))
    if user is None and len(users) == 1:
        user = next(iter(users.values()))
    data = (user or {}).get("client-certificate-data")
    if not data:
        return None
    try:
        return x509.load_pem_x509_certificate(base64.b64decode(str(data), validate=True))
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"the stored client certificate does not load: {e}") from e


def _quantity(q: object) -> Decimal | None:
    try:
        return parse(str(q))
    except (QuantityError, ValueError):
        return None


def _granted_vs_requested(requested: Mapping[str, Any], granted: Mapping[str, Any]) -> tuple[str, bool]:
    """`nvidia.com/gpu 8/8, cpu 16/16`, and whether anything was granted short."""
    parts, short = [], False
    for r in sorted(requested, key=lambda k: (k != "nvidia.com/gpu", k)):
        want, got = _quantity(requested[r]), _quantity(granted.get(r, "0"))
        if want is not None and got is not None and got < want:
            short = True
        parts.append(f"{r} {granted.get(r, '0')}/{requested[r]}")
    return ", ".join(parts), short


def _denial_fix(reason: str, peer: str, consumer: str, peer_cmd: str) -> str:
    tenant = f"kubectl --context <provider> edit tenant.gpufed.io {consumer or '<consumer-id>'}"
    return {
        "InsufficientCapacity": f"ask for what the provider has free ({peer_cmd} --gpus N) or free GPUs on {peer}",
        "PolicyLimit": f"ask for less ({peer_cmd} --gpus N) or raise spec.policy.maxResources: {tenant}",
        "GPUProductNotAllowed": f"ask for an allowed product ({peer_cmd} --gpu-product P) or add it to "
        f"spec.policy.allowedGpuProducts: {tenant}",
        "GPUProductNotFound": f"{peer} has no GPU of that product: peer again with one it has "
        f"({peer_cmd} --gpu-product P, see `kubectl --context <provider> get nodes -L nvidia.com/gpu.product`)",
        "PartialGrantRefused": f"ask for less ({peer_cmd} --gpus N) or set spec.policy.allowPartial: true: {tenant}",
        "InvalidSlice": f"fix the request: {peer_cmd} with valid quantities",
    }.get(reason, f"see `kubectl --context <provider> describe tenant.gpufed.io {consumer or '<consumer-id>'}`")


def judge_grant(
    name: str, peer: str, slices: Sequence[Mapping[str, Any]], *, consumer: str, peer_cmd: str, where: str
) -> Check:
    """The provider's decision on each slice: Granted OK, PartialGrant WARN, Denied FAIL, undecided WARN."""
    if not slices:
        return Check(
            name,
            FAIL,
            f"no ResourceSlice for this peering ({where}): nothing is granted",
            f"ask for resources: {peer_cmd} --gpus N",
            peer,
        )
    verdicts: list[Check] = []
    for s in sorted(slices, key=lambda x: str(x["metadata"]["name"])):
        label = f"slice {s['metadata']['name']}"
        requested = (s.get("spec") or {}).get("resources") or {}
        granted = (s.get("status") or {}).get("granted") or {}
        res = _condition(s, "Resources")
        figures, short = _granted_vs_requested(requested, granted)
        reason, message = str(res.get("reason") or ""), _one_line(str(res.get("message") or ""), 160)
        current = res.get("observedGeneration") in (None, s["metadata"].get("generation", 1))
        if res.get("status") == "False":
            verdicts.append(
                Check(
                    name,
                    FAIL,
                    f"{label} Denied ({reason}): {message}",
                    _denial_fix(reason, peer, consumer, peer_cmd),
                    peer,
                )
            )
        elif res.get("status") != "True" or not current:
            verdicts.append(
                Check(
                    name,
                    WARN,
                    f"{label}: the provider has not decided yet ({reason or 'no decision'})",
                    "is `gpufed controller` running on both clusters? the consumer's controller carries the request",
                    peer,
                )
            )
        elif short:
            verdicts.append(
                Check(
                    name,
                    WARN,
                    f"{label} Accepted ({reason}), less than asked: {figures}",
                    f"the provider has no more to give: ask for less ({peer_cmd} --gpus N) or free capacity there",
                    peer,
                )
            )
        else:
            verdicts.append(Check(name, OK, f"{label} Accepted ({reason or 'Granted'}): {figures}", "", peer))
    worst = max(verdicts, key=lambda c: _RANK[c.status])
    if len(verdicts) == 1:
        return worst
    return Check(name, worst.status, "; ".join(v.finding for v in verdicts), worst.fix, peer)


def _ready(node: Mapping[str, Any]) -> dict[str, Any]:
    return _condition(node, "Ready")


def judge_nodes(
    peer: str,
    nodes: Sequence[Mapping[str, Any]],
    leases: Mapping[str, Mapping[str, Any] | None],
    now: dt.datetime,
    *,
    kubectl: str = "kubectl",
) -> Check:
    """Every virtual node of the provider exists, is Ready and has a fresh lease."""
    selector = f"{REMOTE_CLUSTER_LABEL}={peer}"
    if not nodes:
        return Check(
            "virtual-nodes",
            FAIL,
            f"no virtual node with label {selector}: pods cannot be offloaded to {peer}",
            "the consumer's controller starts a virtual kubelet once the slice is granted: check that "
            "`gpufed controller` runs with --virtual-kubelet-kubeconfig (or run `gpufed virtual-kubelet`) and its log",
            peer,
        )
    bad: list[str] = []
    fixes: list[str] = []
    good: list[str] = []
    for n in sorted(nodes, key=lambda x: str(x["metadata"]["name"])):
        name = str(n["metadata"]["name"])
        ready = _ready(n)
        lease = leases.get(name)
        spec = (lease or {}).get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or 40)
        age = None if renewed is None else (now - renewed).total_seconds()
        created = parse_time(n["metadata"].get("creationTimestamp"))
        registered = None if created is None else (now - created).total_seconds()
        if ready.get("status") != "True":
            why = _one_line(f"{ready.get('reason') or 'no Ready condition'}: {ready.get('message') or ''}", 160)
            bad.append(f"{name} NotReady ({why.rstrip(': ')})")
            fixes.append(f"`{kubectl} describe node {name}` and the log of its virtual kubelet say why")
        elif lease is None and registered is not None and registered <= duration:
            # a virtual kubelet creates the lease on its first renewal after registering the Node
            good.append(f"{name} Ready, registered {human(registered)} ago (lease not created yet)")
        elif age is None or age > duration:
            when = "never" if age is None else f"{human(age)} ago"
            bad.append(f"{name}'s lease kube-node-lease/{name} renewed {when} (expires after {duration:.0f} s)")
            fixes.append(
                f"the virtual kubelet of {name} is not running: check `gpufed controller` (it supervises them) "
                "and the virtual kubelet's log"
            )
        else:
            good.append(f"{name} Ready, lease renewed {human(age)} ago")
    if bad:
        return Check("virtual-nodes", FAIL, "; ".join(bad), "; ".join(dict.fromkeys(fixes)), peer)
    return Check("virtual-nodes", OK, "; ".join(good), "", peer)


def judge_tunnel(
    peer: str,
    gateway: Mapping[str, Any] | None,
    connection: Mapping[str, Any] | None,
    now: dt.datetime,
    *,
    stale_s: float,
    connect_cmd: str,
) -> Check:
    """The Connection of the peering's fabric: a recent WireGuard handshake and a Connected probe."""
    if gateway is None and connection is None:
        return Check(
            "tunnel",
            WARN,
            "no network fabric: pods cannot reach each other across clusters",
            f"create it: {connect_cmd}",
            peer,
        )
    if gateway is None or connection is None:
        missing = "Gateway" if gateway is None else "Connection"
        return Check(
            "tunnel",
            FAIL,
            f"the fabric is incomplete: {missing} {SYSTEM_NAMESPACE}/{peer} is missing",
            f"re-create it: {connect_cmd}",
            peer,
        )
    st = connection.get("status") or {}
    phase = str(st.get("phase") or "Pending")
    message = _one_line(str(st.get("message") or ""), 160)
    role = (gateway.get("spec") or {}).get("role", "")
    endpoint = (gateway.get("spec") or {}).get(
        "endpoint"
    ) or f"UDP port {(gateway.get('spec') or {}).get('listenPort')}"
    agent = f"is `gpufed gateway --name {peer}` running on both clusters, and {endpoint} reachable over UDP?"
    handshake = parse_time(st.get("latestHandshake"))
    if handshake is None:
        return Check(
            "tunnel",
            FAIL,
            f"no WireGuard handshake with {peer} ever ({phase}{': ' + message if message else ''})",
            agent,
            peer,
        )
    age = (now - handshake).total_seconds()
    if age > stale_s:
        return Check(
            "tunnel",
            FAIL,
            f"last WireGuard handshake {human(age)} ago (stale after {stale_s:.0f} s); {phase}: {message}".rstrip(": "),
            agent,
            peer,
        )
    rtt = st.get("rttMs")
    rtt_text = f", RTT {float(rtt):.2f} ms" if isinstance(rtt, int | float) else ""
    if phase == "Connected":
        return Check("tunnel", OK, f"Connected ({role}), handshake {human(age)} ago{rtt_text}", "", peer)
    status = WARN if phase == "Degraded" else FAIL
    return Check("tunnel", status, f"{phase} ({st.get('reason') or '?'}): {message}", agent, peer)


def judge_mtu(peer: str, gateway: Mapping[str, Any], *, underlay_mtu: int, connect_cmd: str) -> Check:
    """The tunnel MTU leaves room for WireGuard's overhead (60 B over IPv4, 80 B over IPv6, DESIGN.md §7)."""
    spec, st = gateway.get("spec") or {}, gateway.get("status") or {}
    configured, applied = int(spec.get("mtu") or 0), int(st.get("mtu") or 0)
    host = ""
    with contextlib.suppress(ValueError):
        host = split_endpoint(str(spec.get("endpoint") or ""))[0].strip("[]") if spec.get("endpoint") else ""
    try:
        ipv4 = isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        ipv4 = False  # a name, or the server side (the peer's family is unknown): assume IPv6, as the gateway does
    overhead = WIREGUARD_OVERHEAD_IPV4 if ipv4 else WIREGUARD_OVERHEAD_IPV6
    family = "IPv4" if ipv4 else "IPv6 (or unknown)"
    room = underlay_mtu - overhead
    mtu = applied or configured
    setting = f"--mtu {min(room, 1420) if room >= MIN_MTU else MIN_MTU}"
    if mtu == 0:
        return Check(
            "mtu",
            WARN,
            f"automatic (underlay − {overhead} B); no gateway agent has reported the MTU it applied",
            f"start the gateway agent: gpufed gateway --name {peer} (see the tunnel check)",
            peer,
        )
    if mtu < MIN_MTU:
        return Check(
            "mtu",
            FAIL,
            f"MTU {mtu} is below {MIN_MTU}, the IPv6 minimum: WireGuard cannot carry IPv6 through it",
            f"{connect_cmd} {setting}",
            peer,
        )
    if mtu > room:
        return Check(
            "mtu",
            WARN,
            f"MTU {mtu} + {overhead} B WireGuard-over-{family} overhead exceeds a {underlay_mtu} B underlay: "
            "large packets are fragmented or dropped",
            f"lower it: {connect_cmd} {setting} (or, if the underlay carries jumbo frames, say so: "
            f"gpufed doctor --underlay-mtu N)",
            peer,
        )
    if configured and applied and configured != applied:
        return Check(
            "mtu",
            WARN,
            f"configured MTU {configured} but the gateway applied {applied}",
            f"restart the gateway agent of {peer} (gpufed gateway --name {peer})",
            peer,
        )
    how = "configured" if configured else "automatic"
    return Check(
        "mtu",
        OK,
        f"MTU {mtu} ({how}) leaves {underlay_mtu - mtu} B for WireGuard over {family} "
        f"(needs {overhead} B) on a {underlay_mtu} B underlay",
        "",
        peer,
    )


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


# ---------------------------------------------------------------------------------------- reading


@dataclass
class _Link:
    """The consumer's credentials for one provider and an API client made from them (lazily, once)."""

    api: Any
    provider: str
    factory: Callable[[dict[str, Any]], Awaitable[Any]]
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


Probe = Callable[[], Awaitable[list[Check]]]


async def _guard(name: str, peer: str, timeout_s: float, fix: str, probe: Probe) -> list[Check]:
    """Run one check under its own timeout; a failure to read is the check's FAIL, never an exception."""
    try:
        async with asyncio.timeout(timeout_s):
            return await probe()
    except TimeoutError:
        return [Check(name, FAIL, f"no answer within {timeout_s:g} s", fix, peer)]
    except (KubeError, EstimatorError, LookupError, OSError, ValueError, aiohttp.ClientError, ssl.SSLError) as e:
        return [Check(name, FAIL, _one_line(str(e) or type(e).__name__), fix, peer)]


async def _get(api: Any, path: str) -> dict[str, Any] | None:
    return await rest.get(api, path)


async def _list(api: Any, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every item; [] when the kind is not served at all (a missing CRD shows in the install check)."""
    try:
        return await rest.list_items(api, path, params=params)
    except KubeError as e:
        if e.not_found:
            return []
        raise


class _Doctor:
    def __init__(
        self,
        api: Any,
        settings: DoctorSettings,
        now: dt.datetime,
        factory: Callable[[dict[str, Any]], Awaitable[Any]],
    ) -> None:
        self.api = api
        self.s = settings
        self.now = now
        self.factory = factory
        self.cluster_id = ""
        #: What the controller serves that answered (evidence that it runs).
        self.answering: list[str] = []

    def guard(self, name: str, peer: str, fix: str, probe: Probe) -> Awaitable[list[Check]]:
        return _guard(name, peer, self.s.check_timeout_s, fix, probe)

    def restart(self, flag: str) -> str:
        return f"restart the controller with {flag}: gpufed controller {self.s.flags} {flag}"

    def peer_cmd(self) -> str:
        return f"gpufed peer {self.s.flags} --remote-kubeconfig <provider kubeconfig>"

    def connect_cmd(self, peer: str, role: str) -> str:
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
        found = await asyncio.gather(*(_get(self.api, path) for path in wanted.values()))  # side by side
        missing = [what for what, obj in zip(wanted, found, strict=True) if obj is None]
        return [judge_install(missing, fix_flags=self.s.flags)]

    async def lease(self) -> dict[str, Any] | None:
        return await _get(self.api, rest.path("coordination.k8s.io/v1", "leases", CONTROLLER_LEASE, SYSTEM_NAMESPACE))

    async def webhook(self, consumes: bool) -> list[Check]:
        restart = self.restart("--webhook-port PORT") + " (it registers the webhook at start)"
        cfg = await _get(
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
                        _one_line(
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
        if await _get(self.api, rest.path("v1", "services", svc_name, ns)) is None:
            return [Check("webhook", FAIL, f"webhook {name} points at {where}, which does not exist", restart)]
        slices = await _list(
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
        cm = await _get(self.api, rest.path("v1", "configmaps", ESTIMATOR_CONFIGMAP, SYSTEM_NAMESPACE))
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
        auth = _condition(fc, "Authentication")
        if phase == "Peered" and auth.get("status") == "True":
            return [Check("peering", OK, f"Peered; {_one_line(str(auth.get('message') or ''), 160)}", "", peer)]
        why = _one_line(f"{auth.get('reason') or 'no Authentication condition'}: {auth.get('message') or ''}", 200)
        return [
            Check(
                "peering",
                FAIL,
                f"phase {phase}, authentication not done ({why.rstrip(': ')})",
                f"run the handshake again: {self.peer_cmd()}",
                peer,
            )
        ]

    async def credentials(self, peer: str, link: _Link) -> list[Check]:
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

    async def api_rtt(self, peer: str, link: _Link) -> list[Check]:
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
                        _one_line(f"{server} refuses the stored credentials: {e}"),
                        f"the certificate was revoked or expired: re-run the handshake ({self.peer_cmd()})",
                        peer,
                    )
                ]
            return [
                Check(
                    "api",
                    FAIL,
                    _one_line(f"cannot reach {server} from here: {e}"),
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
        slices = await _list(self.api, rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE))
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
        nodes = await _list(self.api, "/api/v1/nodes", {"labelSelector": f"{REMOTE_CLUSTER_LABEL}={peer}"})
        leases: dict[str, dict[str, Any] | None] = {}
        for n in nodes:
            name = str(n["metadata"]["name"])
            leases[name] = await _get(self.api, rest.path("coordination.k8s.io/v1", "leases", name, "kube-node-lease"))
        return [judge_nodes(peer, nodes, leases, self.now, kubectl=self.s.kubectl)]

    async def estimator(self, peer: str, link: _Link) -> list[Check]:
        fix = (
            f"check the provider's controller (--estimator-port) and that the endpoint in its ConfigMap "
            f"{SYSTEM_NAMESPACE}/{ESTIMATOR_CONFIGMAP} is reachable from here"
        )
        cfg = await link.kubeconfig()
        client = await link.client()
        try:
            est = await from_provider(client, cfg, timeout_s=self.s.check_timeout_s)
        except EstimatorError as e:
            return [Check("estimator", FAIL, _one_line(str(e)), fix, peer)]
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
                return [Check("estimator", FAIL, _one_line(str(e)), fix, peer)]
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
        gw = await _get(self.api, rest.path(API_VERSION, "gateways", peer, SYSTEM_NAMESPACE))
        conn = await _get(self.api, rest.path(API_VERSION, "connections", peer, SYSTEM_NAMESPACE))
        connect = self.connect_cmd(peer, "consumer" if role == "consumer" else "provider")
        out = [judge_tunnel(peer, gw, conn, self.now, stale_s=self.s.handshake_stale_s, connect_cmd=connect)]
        if gw is not None:
            out.append(judge_mtu(peer, gw, underlay_mtu=self.s.underlay_mtu, connect_cmd=connect))
        return out

    # ---- a consumer this cluster provides for

    async def tenant(self, peer: str) -> list[Check]:
        fix = (
            f"the consumer runs the handshake: gpufed peer --kubeconfig <consumer kubeconfig> "
            f"--remote-kubeconfig {self.s.kubeconfig}"
            + (f" --remote-context {self.s.context}" if self.s.context else "")
        )
        t = await _get(self.api, rest.path(API_VERSION, "tenants", peer))
        if t is None:
            return [Check("tenant", FAIL, f"no Tenant {peer}: the consumer never completed `gpufed peer`", fix, peer)]
        st = t.get("status") or {}
        phase = str(st.get("phase") or "Pending")
        auth = _condition(t, "Authentication")
        if phase == "Refused":
            why = _one_line(f"{auth.get('reason')}: {auth.get('message')}", 200)
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
                checks.append(
                    judge_certificate("tenant-certificate", peer, cert, self.now, self.s.expiry_warning, renew)
                )
        tns = str(st.get("namespace") or tenant_namespace(ClusterID(peer)))
        slices = await _list(self.api, rest.path(API_VERSION, "resourceslices", namespace=tns))
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
            name, FAIL, _one_line(f"{endpoint}: certificate not signed by the published ca.crt: {e}"), fix, peer
        )
    except ssl.SSLError as e:
        if "CERTIFICATE_REQUIRED" in str(e).upper() or "HANDSHAKE_FAILURE" in str(e).upper():
            ms = (time.perf_counter() - started) * 1000
            return Check(
                name, OK, f"{endpoint} answers TLS in {ms:.0f} ms (it requires a consumer certificate)", "", peer
            )
        return Check(name, FAIL, _one_line(f"{endpoint}: TLS failed: {e}"), fix, peer)
    except OSError as e:
        return Check(name, FAIL, _one_line(f"{endpoint} does not answer: {e}"), fix, peer)
    ms = (time.perf_counter() - started) * 1000
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return Check(
        name, OK, f"{endpoint} answers TLS in {ms:.0f} ms (certificate verified with the published ca.crt)", "", peer
    )


def _roles(fc: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in (fc.get("spec") or {}).get("roles") or []]


async def diagnose(
    api: Any,
    settings: DoctorSettings,
    *,
    api_server: str = "",
    now: dt.datetime | None = None,
    provider_client: Callable[[dict[str, Any]], Awaitable[Any]] = client_from_dict,
) -> Report:
    """Every check of the cluster behind `api` (see the module docstring)."""
    d = _Doctor(api, settings, now or _now(), provider_client)
    kubectl = settings.kubectl
    can_read = f"check that the kubeconfig's user may read gpufed's objects: {kubectl} auth can-i --list"
    identity_cm: dict[str, Any] | None = None
    identity_error: Check | None = None
    try:
        async with asyncio.timeout(settings.check_timeout_s):
            identity_cm = await _get(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, SYSTEM_NAMESPACE))
    except (KubeError, TimeoutError) as e:
        identity_error = Check("identity", FAIL, _one_line(f"cannot read the identity: {e or 'timed out'}"), can_read)
    identity = identity_error or judge_identity(identity_cm, fix_flags=settings.flags)
    if identity.status == OK and identity_cm is not None:
        d.cluster_id = str((identity_cm.get("data") or {}).get("clusterId") or "")

    peers_error: Check | None = None
    fcs: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(settings.check_timeout_s):
            fcs = await _list(api, rest.path(API_VERSION, "foreignclusters"))
    except (KubeError, TimeoutError) as e:
        peers_error = Check("peerings", FAIL, _one_line(f"cannot list ForeignClusters: {e or 'timed out'}"), can_read)
    by_id = {str((fc.get("spec") or {}).get("clusterId") or fc["metadata"]["name"]): fc for fc in fcs}
    selection = sorted(by_id)
    if settings.remote_cluster_id is not None:
        selection = [settings.remote_cluster_id] if settings.remote_cluster_id in by_id else []
    consumes = any("Provider" in _roles(fc) for fc in fcs)

    head: list[Awaitable[list[Check]]] = [
        d.guard("install", THIS_CLUSTER, f"kubectl {settings.flags} apply -f deploy/crds/ -f deploy/rbac/", d.install),
        d.guard("webhook", THIS_CLUSTER, d.restart("--webhook-port PORT"), partial(d.webhook, consumes)),
        d.guard("estimator-server", THIS_CLUSTER, d.restart("--estimator-port PORT"), d.estimator_server),
    ]
    links: list[_Link] = []
    per_peer: list[Awaitable[list[Check]]] = []
    peers: list[Peer] = []
    for peer in selection:
        fc = by_id[peer]
        roles = _roles(fc)
        slices, selector = f"resourceslices.{GROUP}", f"{REMOTE_CLUSTER_LABEL}={peer}"
        role = "+".join(r.lower() for r in ("Provider", "Consumer") if r in roles) or "unknown"
        peers.append(Peer(peer, role))
        fabric = d.guard("tunnel", peer, f"gpufed network status {settings.flags}", partial(d.tunnel, peer, role))
        if "Provider" in roles:
            link = _Link(api, peer, provider_client)
            links.append(link)
            reach = f"re-run the handshake: {d.peer_cmd()}"
            per_peer += [
                d.guard("peering", peer, reach, partial(d.auth, peer, fc)),
                d.guard("credentials", peer, reach, partial(d.credentials, peer, link)),
                d.guard("api", peer, API_FIX, partial(d.api_rtt, peer, link)),
                d.guard("grant", peer, f"{kubectl} -n {SYSTEM_NAMESPACE} describe {slices}", partial(d.grant, peer)),
                d.guard("virtual-nodes", peer, f"{kubectl} get nodes -l {selector}", partial(d.nodes, peer)),
                fabric,
                d.guard("estimator", peer, ESTIMATOR_FIX, partial(d.estimator, peer, link)),
            ]
        else:
            per_peer.append(fabric)
        if "Consumer" in roles:
            tenant_fix = f"{kubectl} describe tenant.gpufed.io {peer}"
            per_peer.append(d.guard("tenant", peer, tenant_fix, partial(d.tenant, peer)))
    controller_fix = (
        f"start it: gpufed controller {settings.flags} (in a cluster: "
        f"{settings.kubectl} -n {SYSTEM_NAMESPACE} get pods; logs of the gpufed-controller pod)"
    )
    lease_result: list[dict[str, Any] | None] = []

    async def read_lease() -> list[Check]:
        lease_result.append(await d.lease())
        return []

    try:
        results = await asyncio.gather(
            *head, *per_peer, d.guard("controller", THIS_CLUSTER, controller_fix, read_lease)
        )
    finally:
        for link in links:
            with contextlib.suppress(Exception):
                await link.close()
    flat_head = [c for r in results[: len(head)] for c in r]
    flat_peers = [c for r in results[len(head) : len(head) + len(per_peer)] for c in r]
    lease_failure = results[-1]
    controller = (
        lease_failure[0]
        if lease_failure
        else judge_controller(
            lease_result[0] if lease_result else None,
            d.now,
            answering=d.answering,
            fix=controller_fix,
        )
    )
    checks = [flat_head[0], identity, controller, *flat_head[1:]]
    if peers_error is not None:
        checks.append(peers_error)
    elif settings.remote_cluster_id is not None and not selection:
        known = ", ".join(sorted(by_id)) or "none"
        checks.append(
            Check(
                "peering",
                FAIL,
                f"this cluster has no ForeignCluster {settings.remote_cluster_id} (its peers: {known})",
                f"peer it: {d.peer_cmd()}",
                settings.remote_cluster_id,
            )
        )
    elif not fcs:
        checks.append(
            Check(
                "peerings",
                WARN,
                "this cluster has no peerings (no ForeignCluster)",
                f"peer it with a provider: {d.peer_cmd()}",
            )
        )
    checks += flat_peers
    return Report(d.cluster_id, api_server, tuple(peers), tuple(checks))


@contextlib.asynccontextmanager
async def _connect(settings: DoctorSettings) -> AsyncIterator[tuple[Any, str]]:
    if not settings.kubeconfig.exists():
        raise DoctorError(f"kubeconfig {settings.kubeconfig} does not exist")
    try:
        async with api_client(settings.kubeconfig, settings.context) as api:
            server = str(api.configuration.host)
            try:
                async with asyncio.timeout(settings.check_timeout_s):
                    await rest.request(api, "GET", "/version", request_timeout=settings.check_timeout_s)
            except TimeoutError:
                raise DoctorError(
                    f"the API server {server} does not answer within {settings.check_timeout_s:g} s "
                    f"(kubeconfig {settings.kubeconfig}, context {settings.context or 'current'})"
                ) from None
            except KubeError as e:
                raise DoctorError(
                    f"cannot reach the API server {server} (kubeconfig {settings.kubeconfig}, context "
                    f"{settings.context or 'current'}): {e}"
                ) from e
            yield api, server
    except KubeError as e:
        raise DoctorError(str(e)) from e
    except yaml.YAMLError as e:  # a kubeconfig that is not YAML escapes api_client as YAMLError
        raise DoctorError(_one_line(f"cannot load kubeconfig {settings.kubeconfig}: not YAML ({e})")) from e


async def doctor(
    settings: DoctorSettings,
    *,
    provider_client: Callable[[dict[str, Any]], Awaitable[Any]] = client_from_dict,
) -> Report:
    """Check the cluster of `settings.kubeconfig`; DoctorError when it cannot be read at all."""
    if settings.remote_cluster_id is not None:
        try:
            parse_cluster_id(settings.remote_cluster_id)
        except ValueError as e:
            raise DoctorError(str(e)) from e
    async with _connect(settings) as (api, server):
        return await diagnose(api, settings, api_server=server, provider_client=provider_client)
