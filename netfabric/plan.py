"""From the fabric's CRs to what each part needs: the `Remapper` the virtual kubelet uses, the
`GatewayPlan` the gateway applies, the IPAM decision for a peer's ranges, and the tunnel addresses.

Pure: no I/O. Inputs are the validated specs of `gpufed.apis.network` (NetworkConfig, RemoteNetwork).
Does not: read or write the CRs (netfabric.ops and netfabric.controllers do), render rules
(netfabric.render).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network

from gpufed.apis.network import CIDRPair, NetworkConfigSpec, RemoteNetworkSpec
from netfabric.ipam import RangeMap, allocate_address, allocate_range
from netfabric.remap import Remapper
from netfabric.render import GatewayPlan, interface_name, mark_for, table_name

#: Link-local block the tunnel's own two addresses come from (one /30 per consumer-provider pair).
TUNNEL_BLOCK = IPv4Network("169.254.64.0/18")


def _net(v: str) -> IPv4Network:
    return IPv4Network(v)


def in_use(local: NetworkConfigSpec, others: Iterable[RemoteNetworkSpec]) -> list[IPv4Network]:
    """Everything a peer's stand-in range must not overlap: our own ranges and the ranges through
    which we already reach other peers."""
    used = [_net(local.pod_cidr), _net(local.external_cidr), *(_net(c) for c in local.reserved_cidrs)]
    for o in others:
        used += [_net(o.mapped.pod_cidr), _net(o.mapped.external_cidr)]
    return used


def allocate(local: NetworkConfigSpec, peer: CIDRPair, others: Iterable[RemoteNetworkSpec]) -> CIDRPair:
    """How we will reach a peer's ranges: themselves when they collide with nothing here, otherwise
    free ranges of the same size from our pools (PoolExhausted when none is left)."""
    used = in_use(local, others)
    pools = [_net(p) for p in local.pools]
    pod = allocate_range(_net(peer.pod_cidr), used, pools)
    ext = allocate_range(_net(peer.external_cidr), [*used, pod], pools)
    return CIDRPair(pod_cidr=str(pod), external_cidr=str(ext))


def expose(local: NetworkConfigSpec, address: IPv4Address) -> IPv4Address:
    """The external-CIDR address standing for `address` (already allocated or the first free one)."""
    for e in local.external_ips:
        if IPv4Address(e.address) == address:
            return IPv4Address(e.external_address)
    taken = [IPv4Address(e.external_address) for e in local.external_ips]
    return allocate_address(_net(local.external_cidr), taken)


def _maps(real: CIDRPair, mapped: CIDRPair) -> tuple[RangeMap, RangeMap]:
    return (
        RangeMap(_net(real.pod_cidr), _net(mapped.pod_cidr)),
        RangeMap(_net(real.external_cidr), _net(mapped.external_cidr)),
    )


def remapper(local: NetworkConfigSpec, remote: RemoteNetworkSpec) -> Remapper:
    peer_pod, peer_ext = _maps(remote.real, remote.mapped)
    ours = CIDRPair(pod_cidr=local.pod_cidr, external_cidr=local.external_cidr)
    local_pod, local_ext = _maps(ours, remote.peer_view or ours)
    return Remapper(
        peer_pod=peer_pod,
        peer_external=peer_ext,
        local_pod=local_pod,
        local_external=local_ext,
        external_ips={IPv4Address(e.address): IPv4Address(e.external_address) for e in local.external_ips},
    )


def gateway_plan(
    local: NetworkConfigSpec,
    remote: RemoteNetworkSpec,
    masquerade: bool,
    tunnel: tuple[IPv4Address, IPv4Address] | None = None,
    local_members: Iterable[IPv4Address] | None = None,
    peer_members_mapped: Iterable[IPv4Address] | None = None,
) -> GatewayPlan:
    """The data plane of our gateway for `remote`, from our own objects only. `tunnel`: (our, the
    peer's) tunnel address, so the filter lets exactly the peer's probe through to the gateway.

    What the tunnel filter allows (`netfabric.render.filter_sets`) follows from these objects: our pods
    (`local_members`, addresses in our pod CIDR; None: the whole CIDR) and the addresses we exposed
    (`NetworkConfig.spec.externalIps`) on one side; the peer's pods on the other — as we see them
    (`peer_members_mapped`, addresses in its remapped pod range, turned back into its real ones; None:
    its whole pod range) — and its external range on the way out. Members outside their range are
    left out: they are not pods of this peering."""
    peer_pod, peer_ext = _maps(remote.real, remote.mapped)
    local_pod = _net(local.pod_cidr)
    ours = None if local_members is None else frozenset(a for a in local_members if a in local_pod)
    theirs = (
        None
        if peer_members_mapped is None
        else frozenset(peer_pod.to_real(a) for a in peer_members_mapped if peer_pod.contains_mapped(a))
    )
    return GatewayPlan(
        interface=interface_name(remote.cluster_id),
        table=table_name(remote.cluster_id),
        mark=mark_for(remote.cluster_id),
        local_pod=local_pod,
        peer_pod=peer_pod,
        peer_external=peer_ext,
        external_ips={IPv4Address(e.external_address): IPv4Address(e.address) for e in local.external_ips},
        masquerade=masquerade,
        tunnel_address=tunnel[0] if tunnel else None,
        peer_tunnel_address=tunnel[1] if tunnel else None,
        local_members=ours,
        peer_members=theirs,
    )


def tunnel_addresses(consumer_id: str, provider_id: str) -> tuple[IPv4Address, IPv4Address]:
    """(provider/server side, consumer/client side) addresses inside the tunnel: a /30 of
    TUNNEL_BLOCK chosen from both ids, so both sides compute the same pair without talking."""
    digest = hashlib.sha256(f"{consumer_id}/{provider_id}".encode()).digest()
    slots = TUNNEL_BLOCK.num_addresses // 4
    base = int(TUNNEL_BLOCK.network_address) + 4 * (int.from_bytes(digest[:4], "big") % slots)
    return IPv4Address(base + 1), IPv4Address(base + 2)
