"""`gpufed network connect | disconnect | status | expose`, and the network step of `gpufed peer`.

Owns the control-plane half of the fabric for one peering, done with both clusters' admin
kubeconfigs (like the rest of `peer`): each side's IPAM decision for the other's ranges (a
RemoteNetwork per side, allocations kept stable across re-runs and released on disconnect), the
exchange of those mappings (`peerView`), a WireGuard key pair per side (private key only in a Secret
of that side, generated there once and reused), the Gateways (provider = Server listening on the
endpoint its NetworkConfig advertises, consumer = Client dialling it), an empty Connection each side
for the gateway agents to fill, and per-gateway RBAC naming the one key Secret.

Idempotent: a re-run changes nothing that is already right. Does not: run the data plane
(netfabric.controllers.gateway) or decide the rules (netfabric.render).
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from pydantic import ValidationError
from wireguard_tools import WireguardKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.network import (
    NETWORK_CONFIG,
    CIDRPair,
    NetworkConfigSpec,
    RemoteNetworkSpec,
    split_endpoint,
)
from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, SYSTEM_NAMESPACE
from gpufed.kube import rest
from netfabric import plan as plans
from netfabric.ipam import IPAMError
from peering.ops.peer import ClusterRef, PeerError, Peers, Reporter
from peering.ops.peer import connect as connect_clusters

KEY_SECRET_PREFIX = "gpufed-wg-"  # noqa: S105 -- a Secret name prefix, not a password
GATEWAY_ROLE_PREFIX = "gpufed-gateway-"
GATEWAY_SERVICE_ACCOUNT = "gpufed-gateway"
POLL_S = 0.5


@dataclass(frozen=True)
class NetworkOptions:
    #: Provider gateway host[:port]; default: the provider NetworkConfig's gatewayEndpoint.
    gateway_endpoint: str | None = None
    #: Create a missing NetworkConfig with these pod CIDRs (consumer, provider).
    pod_cidr: str | None = None
    remote_pod_cidr: str | None = None
    #: Tunnel MTU (0: underlay minus WireGuard overhead).
    mtu: int = 0
    #: SNAT the peer's traffic to the gateway address (strict CNIs), on both sides.
    masquerade: bool = False
    driver: str = "auto"
    keepalive_s: int = 10
    #: Wait until both Connections are Connected (seconds; 0: do not wait).
    wait_s: float = 0.0


def _path(plural: str, name: str = "", sub: str = "") -> str:
    return rest.path(API_VERSION, plural, name, namespace=SYSTEM_NAMESPACE, sub=sub)


def _body(kind: str, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, **(labels or {})},
        },
        "spec": spec,
    }


#: How each caller lets the user supply a missing NetworkConfig's pod CIDR.
_POD_CIDR_HINT = {
    "consumer": " or pass its pod CIDR (--pod-cidr)",
    "provider": " or pass its pod CIDR (--remote-pod-cidr)",
}


async def network_config(api: Any, role: str, pod_cidr: str | None = None) -> NetworkConfigSpec:
    """This cluster's NetworkConfig; created from `pod_cidr` when missing and given."""
    obj = await rest.get(api, _path("networkconfigs", NETWORK_CONFIG))
    if obj is None:
        if not pod_cidr:
            raise PeerError(
                f"the {role} cluster has no NetworkConfig {SYSTEM_NAMESPACE}/{NETWORK_CONFIG}: create one "
                f"(kubectl apply, see docs/networking.md){_POD_CIDR_HINT.get(role, '')}"
            )
        try:
            spec = NetworkConfigSpec(pod_cidr=pod_cidr)
        except ValidationError as e:
            raise PeerError(f"{role}: invalid pod CIDR {pod_cidr!r}: {e.errors()[0]['msg']}") from e
        await rest.apply(
            api,
            _path("networkconfigs", NETWORK_CONFIG),
            _body("NetworkConfig", NETWORK_CONFIG, spec.model_dump(by_alias=True)),
        )
        return spec
    try:
        return NetworkConfigSpec.model_validate(obj.get("spec") or {})
    except ValidationError as e:
        raise PeerError(f"the {role}'s NetworkConfig is invalid: {e.errors()[0]['msg']}") from e


async def _remote_networks(api: Any) -> dict[str, RemoteNetworkSpec]:
    out: dict[str, RemoteNetworkSpec] = {}
    for o in await rest.list_items(api, _path("remotenetworks")):
        try:
            out[o["metadata"]["name"]] = RemoteNetworkSpec.model_validate(o.get("spec") or {})
        except ValidationError:
            continue  # a damaged one blocks nothing but itself; its ranges are not trusted
    return out


async def _allocate(api: Any, local: NetworkConfigSpec, peer_id: str, peer: NetworkConfigSpec) -> RemoteNetworkSpec:
    """The RemoteNetwork for `peer` on this side: the existing allocation when the peer's ranges are
    unchanged (stable across re-runs and restarts), else a new one."""
    real = CIDRPair(pod_cidr=peer.pod_cidr, external_cidr=peer.external_cidr)
    existing = await _remote_networks(api)
    mine = existing.pop(peer_id, None)
    if mine is not None and mine.real == real:
        return mine
    try:
        mapped = plans.allocate(local, real, existing.values())
    except IPAMError as e:
        raise PeerError(f"no address range left for {peer_id}'s CIDRs: {e}") from e
    return RemoteNetworkSpec(cluster_id=peer_id, real=real, mapped=mapped)


async def _key(api: Any, peer_id: str) -> str:
    """This side's WireGuard public key for the peering; the private key is generated here once and
    lives only in the Secret."""
    name = KEY_SECRET_PREFIX + peer_id
    secret = await rest.get(api, rest.path("v1", "secrets", name, namespace=SYSTEM_NAMESPACE))
    raw = ((secret or {}).get("data") or {}).get("privateKey")
    if raw:
        try:
            return str(WireguardKey(base64.b64decode(raw).decode().strip()).public_key())
        except ValueError:
            pass  # damaged: replace it (the gateway picks the new key up; the peer's copy is updated below)
    key = WireguardKey.generate()
    await rest.apply(
        api,
        rest.path("v1", "secrets", name, namespace=SYSTEM_NAMESPACE),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "type": "Opaque",
            "data": {"privateKey": base64.b64encode(str(key).encode()).decode()},
        },
    )
    return str(key.public_key())


async def _gateway_rbac(api: Any, peer_id: str) -> None:
    """The gateway agent may read exactly its own key Secret (the fabric CRs are granted by
    deploy/rbac/gateway.yaml)."""
    name = GATEWAY_ROLE_PREFIX + peer_id
    labels = {MANAGED_BY_LABEL: MANAGED_BY}
    await rest.apply(
        api,
        rest.path("rbac.authorization.k8s.io/v1", "roles", name, namespace=SYSTEM_NAMESPACE),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "labels": labels},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "verbs": ["get"],
                    "resourceNames": [KEY_SECRET_PREFIX + peer_id],
                }
            ],
        },
    )
    await rest.apply(
        api,
        rest.path("rbac.authorization.k8s.io/v1", "rolebindings", name, namespace=SYSTEM_NAMESPACE),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": GATEWAY_SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE}],
        },
    )


async def _apply_side(
    api: Any,
    peer_id: str,
    remote: RemoteNetworkSpec,
    gateway: dict[str, Any],
) -> None:
    await rest.apply(
        api, _path("remotenetworks", peer_id), _body("RemoteNetwork", peer_id, remote.model_dump(by_alias=True))
    )
    await _gateway_rbac(api, peer_id)
    gw = await rest.apply(api, _path("gateways", peer_id), _body("Gateway", peer_id, gateway))
    if await rest.get(api, _path("connections", peer_id)) is None:
        conn = _body("Connection", peer_id, {"clusterId": peer_id})
        conn["metadata"]["ownerReferences"] = [rest.owner_ref(gw)]
        await rest.create(api, _path("connections"), conn)


async def connect_peers(p: Peers, opts: NetworkOptions, report: Reporter) -> dict[str, Any]:
    """Configure the fabric of one peering on both sides; returns the mappings for display."""
    report.step("reading both clusters' network configuration")
    c_net = await network_config(p.consumer_api, "consumer", opts.pod_cidr)
    p_net = await network_config(p.provider_api, "provider", opts.remote_pod_cidr)
    endpoint = opts.gateway_endpoint or p_net.gateway_endpoint
    if not endpoint:
        raise PeerError(
            f"where does {p.consumer_id} reach {p.provider_id}'s gateway? pass --gateway-endpoint HOST[:PORT] or "
            f"set spec.gatewayEndpoint in the provider's NetworkConfig {SYSTEM_NAMESPACE}/{NETWORK_CONFIG} "
            "(or peer with --no-network and connect later)"
        )
    try:
        _, port = split_endpoint(endpoint)
    except ValueError as e:
        raise PeerError(str(e)) from e
    report.done(f"consumer pods {c_net.pod_cidr}, provider pods {p_net.pod_cidr}; provider gateway at {endpoint}")

    report.step("allocating address ranges (IPAM) on both sides")
    c_remote = await _allocate(p.consumer_api, c_net, p.provider_id, p_net)
    p_remote = await _allocate(p.provider_api, p_net, p.consumer_id, c_net)
    c_remote = c_remote.model_copy(update={"peer_view": p_remote.mapped})
    p_remote = p_remote.model_copy(update={"peer_view": c_remote.mapped})
    report.done(
        f"{p.consumer_id} reaches {p.provider_id}'s pods at {c_remote.mapped.pod_cidr}; "
        f"{p.provider_id} reaches {p.consumer_id}'s pods at {p_remote.mapped.pod_cidr}"
    )

    report.step("WireGuard keys (private keys stay in each cluster's Secret)")
    c_pub = await _key(p.consumer_api, p.provider_id)
    p_pub = await _key(p.provider_api, p.consumer_id)
    report.done("public keys exchanged")

    server_ip, client_ip = plans.tunnel_addresses(p.consumer_id, p.provider_id)
    common = {"mtu": opts.mtu, "masquerade": opts.masquerade, "driver": opts.driver, "keepaliveS": opts.keepalive_s}
    report.step("gateways and connections on both sides")
    await _apply_side(
        p.consumer_api,
        p.provider_id,
        c_remote,
        {
            **common,
            "clusterId": p.provider_id,
            "role": "Client",
            "endpoint": endpoint,
            "tunnelAddress": str(client_ip),
            "peerTunnelAddress": str(server_ip),
            "privateKeySecret": KEY_SECRET_PREFIX + p.provider_id,
            "publicKey": c_pub,
            "peerPublicKey": p_pub,
        },
    )
    await _apply_side(
        p.provider_api,
        p.consumer_id,
        p_remote,
        {
            **common,
            "clusterId": p.consumer_id,
            "role": "Server",
            "listenPort": port,
            "tunnelAddress": str(server_ip),
            "peerTunnelAddress": str(client_ip),
            "privateKeySecret": KEY_SECRET_PREFIX + p.consumer_id,
            "publicKey": p_pub,
            "peerPublicKey": c_pub,
        },
    )
    report.done(
        f"Gateway.gpufed.io {p.provider_id} (client) on the consumer, Gateway.gpufed.io {p.consumer_id} (server) "
        "on the provider"
    )
    if opts.wait_s > 0:
        await wait_connected(p, opts.wait_s, report)
    return {
        "consumer": p.consumer_id,
        "provider": p.provider_id,
        "endpoint": endpoint,
        "providerPodsSeenAt": c_remote.mapped.pod_cidr,
        "consumerPodsSeenAt": p_remote.mapped.pod_cidr,
    }


async def _phase(api: Any, name: str) -> tuple[str, str]:
    c = await rest.get(api, _path("connections", name))
    st = (c or {}).get("status") or {}
    return str(st.get("phase") or "Pending"), str(st.get("message") or "no gateway agent has reported yet")


async def wait_connected(p: Peers, timeout_s: float, report: Reporter) -> None:
    report.step("waiting for both gateways to report Connected")
    deadline = time.monotonic() + timeout_s
    while True:
        c = await _phase(p.consumer_api, p.provider_id)
        pr = await _phase(p.provider_api, p.consumer_id)
        if c[0] == pr[0] == "Connected":
            report.done("tunnel up: both sides Connected")
            return
        if time.monotonic() > deadline:
            raise PeerError(
                f"the tunnel is not Connected after {timeout_s:.0f} s: consumer side {c[0]} ({c[1]}), provider side "
                f"{pr[0]} ({pr[1]}); is `gpufed gateway` running on both sides? (`gpufed network status`)"
            )
        await asyncio.sleep(POLL_S)


def side_objects(peer_id: str) -> list[tuple[str, str]]:
    """(path, kind) of the fabric objects one side holds for its peer `peer_id`, in the order they are
    removed: the Gateway first (its agent tears the data plane down and exits), the keys and the
    gateway's access to them last."""
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        (_path("gateways", peer_id), "Gateway.gpufed.io"),
        (_path("connections", peer_id), "Connection"),
        (_path("remotenetworks", peer_id), "RemoteNetwork"),
        (rest.path("v1", "secrets", KEY_SECRET_PREFIX + peer_id, namespace=SYSTEM_NAMESPACE), "key Secret"),
        (rest.path(rbac, "rolebindings", GATEWAY_ROLE_PREFIX + peer_id, namespace=SYSTEM_NAMESPACE), "RoleBinding"),
        (rest.path(rbac, "roles", GATEWAY_ROLE_PREFIX + peer_id, namespace=SYSTEM_NAMESPACE), "Role"),
    ]


async def disconnect_peers(p: Peers, report: Reporter) -> list[str]:
    """Remove the peering's fabric objects on both sides (gateway agents then tear their data plane
    down); releases the IPAM allocations. Idempotent."""
    removed: list[str] = []
    report.step("removing gateways, connections, address allocations and keys")
    for api, peer_id, side in (
        (p.consumer_api, p.provider_id, "consumer"),
        (p.provider_api, p.consumer_id, "provider"),
    ):
        for path_, what in side_objects(peer_id):
            if await rest.get(api, path_) is not None:
                await rest.delete(api, path_)
                removed.append(f"{side}: {what} {peer_id}")
    report.done(f"removed {len(removed)} object(s)" if removed else "nothing to remove")
    return removed


async def status(api: Any) -> list[dict[str, Any]]:
    """One row per peer: the Connection's status, the gateway's role and data plane, the mappings."""
    gws = {o["metadata"]["name"]: o for o in await rest.list_items(api, _path("gateways"))}
    nets = {o["metadata"]["name"]: o for o in await rest.list_items(api, _path("remotenetworks"))}
    conns = {o["metadata"]["name"]: o for o in await rest.list_items(api, _path("connections"))}
    rows = []
    for name in sorted(set(gws) | set(nets) | set(conns)):
        gw, net, conn = gws.get(name) or {}, nets.get(name) or {}, conns.get(name) or {}
        st = conn.get("status") or {}
        spec = net.get("spec") or {}
        rows.append(
            {
                "cluster": name,
                "role": (gw.get("spec") or {}).get("role", ""),
                "endpoint": (gw.get("spec") or {}).get("endpoint", ""),
                "driver": (gw.get("status") or {}).get("driver", ""),
                "mtu": (gw.get("status") or {}).get("mtu", 0),
                "phase": st.get("phase", "Pending"),
                "reason": st.get("reason", ""),
                "message": st.get("message", "no gateway agent has reported yet" if gw else "no Gateway.gpufed.io"),
                "rttMs": st.get("rttMs"),
                "latestHandshake": st.get("latestHandshake"),
                "podCidr": (spec.get("real") or {}).get("podCidr", ""),
                "mappedPodCidr": (spec.get("mapped") or {}).get("podCidr", ""),
                "externalCidr": (spec.get("real") or {}).get("externalCidr", ""),
                "mappedExternalCidr": (spec.get("mapped") or {}).get("externalCidr", ""),
            }
        )
    return rows


async def expose(api: Any, address: str) -> dict[str, Any]:
    """Give one of this cluster's non-pod addresses (a Service ClusterIP, the API server) an address in
    its external CIDR, so peers' pods can reach it; returns where each peer reaches it."""
    try:
        real = IPv4Address(address)
    except ValueError as e:
        raise PeerError(f"{address!r} is not an IPv4 address") from e
    local = await network_config(api, "cluster")
    if real in IPv4Network(local.pod_cidr):
        raise PeerError(f"{real} is a pod address ({local.pod_cidr}): peers reach pods without exposing them")
    try:
        ext = plans.expose(local, real)
    except IPAMError as e:
        raise PeerError(f"the external CIDR {local.external_cidr} is full: {e}") from e
    entries = [e.model_dump(by_alias=True) for e in local.external_ips if IPv4Address(e.address) != real]
    entries.append({"address": str(real), "externalAddress": str(ext)})
    updated = NetworkConfigSpec.model_validate({**local.model_dump(by_alias=True), "externalIps": entries})
    await rest.merge_patch(api, _path("networkconfigs", NETWORK_CONFIG), {"spec": updated.model_dump(by_alias=True)})
    seen = {}
    for name, net in (await _remote_networks(api)).items():
        seen[name] = plans.remapper(updated, net).to_remote_ip(str(real))
    return {"address": str(real), "externalAddress": str(ext), "peersReachItAt": seen}


async def connect(consumer: ClusterRef, provider: ClusterRef, opts: NetworkOptions, report: Reporter) -> dict[str, Any]:
    report.step("checking both clusters")
    async with connect_clusters(consumer, provider) as p:
        report.done(f"consumer {p.consumer_id}, provider {p.provider_id}")
        return await connect_peers(p, opts, report)


async def disconnect(consumer: ClusterRef, provider: ClusterRef, report: Reporter) -> list[str]:
    async with connect_clusters(consumer, provider) as p:
        return await disconnect_peers(p, report)


@dataclass
class NetworkStep:
    """`gpufed peer` step: configure the fabric of the new peering (not waiting for the tunnel unless
    asked: the gateway agents bring it up and `gpufed network status` shows it)."""

    opts: NetworkOptions
    name: str = "network fabric (IPAM, keys, gateways)"

    async def run(self, peers: Peers, report: Reporter) -> None:
        await connect_peers(peers, self.opts, report)
