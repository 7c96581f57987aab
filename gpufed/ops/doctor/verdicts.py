"""`gpufed doctor`'s verdicts: what was read, judged as a `Check` with a finding and a fix.

Owns: one `judge_*` function per check whose facts can be read apart from its verdict (install,
identity, controller, certificates, grants, virtual nodes, tunnel, MTU), the parsing they share
(a kubeconfig's client certificate, conditions, timestamps) and the wording of findings (durations,
one-line messages). The time is passed in, so every verdict is a function of its arguments.

Pure: no I/O and no client libraries; `probes` reads what these judge.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from gpufed.apis.kinds import KINDS
from gpufed.apis.network import split_endpoint
from gpufed.apis.quantity import QuantityError, parse
from gpufed.apis.wire import IDENTITY_CONFIGMAP, REMOTE_CLUSTER_LABEL, SYSTEM_NAMESPACE, parse_cluster_id
from gpufed.kube.times import time_or_none
from gpufed.ops.doctor.checks import FAIL, OK, RANK, WARN, Check
from netfabric.ipam import MIN_MTU, WIREGUARD_OVERHEAD_IPV4, WIREGUARD_OVERHEAD_IPV6

#: The controller's leader Lease (namespace gpufed), read when present.
CONTROLLER_LEASE = "gpufed-controller"

# ---------------------------------------------------------------------------------------- helpers


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


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (whitespace runs folded), cut at `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    """The status condition of type `type_` of `obj`; {} when it has none."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return {}


def _cn(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


# ---------------------------------------------------------------------------------------- verdicts


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
        renewed = time_or_none(spec.get("renewTime")) or time_or_none(spec.get("acquireTime"))
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
    name: str,
    peer: str,
    cert: x509.Certificate,
    now: dt.datetime,
    warning: float,
    fix: str,
    what: str = "client certificate",
) -> Check:
    """Expired or not yet valid: FAIL; less than the fraction `warning` of its lifetime left: WARN
    (credentials renew at two thirds of their lifetime, so with the default third left the renewal
    is late)."""
    after, before = cert.not_valid_after_utc, cert.not_valid_before_utc
    who = f"{what} {_cn(cert)}"
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
    if left < (after - before) * warning:
        return Check(
            name,
            WARN,
            f"{who} expires in {human(left.total_seconds())} ({after:%Y-%m-%dT%H:%M:%SZ}), "
            f"less than {warning:.0%} of its lifetime of {human((after - before).total_seconds())}: "
            "its renewal is late",
            fix,
            peer,
        )
    return Check(name, OK, f"{who} valid until {after:%Y-%m-%d} ({human(left.total_seconds())} left)", "", peer)


def judge_serving_certificates(
    peer: str, found: Mapping[str, x509.Certificate | str], now: dt.datetime, warning: float
) -> Check:
    """The serving certificates of the provider's virtual nodes' kubelet APIs (node -> the certificate
    each serves, or why it could not be read from here): the worst of them decides; a node that
    does not answer here is a WARN, since the API server may reach an address this machine cannot."""
    fix = (
        "a virtual kubelet renews its serving certificate at 80 % of its lifetime through a kubelet-serving "
        "CertificateSigningRequest that gpufed's controller approves: look for denied requests "
        "(`kubectl get csr`) and in the virtual kubelet's log"
    )
    if not found:
        return Check("serving-certificates", WARN, "no virtual node to check", "", peer)
    checks = []
    for node, cert in sorted(found.items()):
        if isinstance(cert, str):
            checks.append(Check("serving-certificates", WARN, f"{node}: {cert}", fix, peer))
        else:
            checks.append(
                judge_certificate("serving-certificates", peer, cert, now, warning, fix, f"{node}: serving certificate")
            )
    worst = max(checks, key=lambda c: RANK[c.status])
    if worst.status == OK:
        return Check("serving-certificates", OK, "; ".join(c.finding for c in checks), "", peer)
    return worst


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
            f"no ResourceSlice.gpufed.io for this peering ({where}): nothing is granted",
            f"ask for resources: {peer_cmd} --gpus N",
            peer,
        )
    verdicts: list[Check] = []
    for s in sorted(slices, key=lambda x: str(x["metadata"]["name"])):
        label = f"slice {s['metadata']['name']}"
        requested = (s.get("spec") or {}).get("resources") or {}
        granted = (s.get("status") or {}).get("granted") or {}
        res = condition(s, "Resources")
        figures, short = _granted_vs_requested(requested, granted)
        reason, message = str(res.get("reason") or ""), one_line(str(res.get("message") or ""), 160)
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
    worst = max(verdicts, key=lambda c: RANK[c.status])
    if len(verdicts) == 1:
        return worst
    return Check(name, worst.status, "; ".join(v.finding for v in verdicts), worst.fix, peer)


def _ready(node: Mapping[str, Any]) -> dict[str, Any]:
    return condition(node, "Ready")


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
        renewed = time_or_none(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or 40)
        age = None if renewed is None else (now - renewed).total_seconds()
        created = time_or_none(n["metadata"].get("creationTimestamp"))
        registered = None if created is None else (now - created).total_seconds()
        if ready.get("status") != "True":
            why = one_line(f"{ready.get('reason') or 'no Ready condition'}: {ready.get('message') or ''}", 160)
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
        missing = "Gateway.gpufed.io" if gateway is None else "Connection"
        return Check(
            "tunnel",
            FAIL,
            f"the fabric is incomplete: {missing} {SYSTEM_NAMESPACE}/{peer} is missing",
            f"re-create it: {connect_cmd}",
            peer,
        )
    st = connection.get("status") or {}
    phase = str(st.get("phase") or "Pending")
    message = one_line(str(st.get("message") or ""), 160)
    role = (gateway.get("spec") or {}).get("role", "")
    endpoint = (gateway.get("spec") or {}).get(
        "endpoint"
    ) or f"UDP port {(gateway.get('spec') or {}).get('listenPort')}"
    agent = f"is `gpufed gateway --name {peer}` running on both clusters, and {endpoint} reachable over UDP?"
    handshake = time_or_none(st.get("latestHandshake"))
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
    """The tunnel MTU leaves room for WireGuard's overhead (60 B over IPv4, 80 B over IPv6)."""
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
