"""Renderers for one gateway's data plane: the nftables ruleset, the WireGuard UAPI message, names.

Owns: `GatewayPlan` (everything one peering's gateway needs, validated), the nftables text that
updates only that peering's table in place (`nft_update`) or atomically replaces it (`nft_ruleset`),
the address sets the tunnel filter allows (`filter_sets`), the WireGuard cross-platform UAPI "set"
message (`uapi_set`, https://www.wireguard.com/xplatform/), the peer's allowed IPs (`allowed_ips`),
and the deterministic per-peering names (`interface_name`, `table_name`, `mark_for`).

The rules (see `netfabric.remap` for the model): traffic for the peer is marked (conntrack mark, then
fwmark, which doubles as the policy-routing table id so the caller can route it into the tunnel even
when both pod CIDRs are the same); on the way out "remapped -> real" is DNATed; on the way in our
external-CIDR addresses are DNATed to the real local addresses they stand for, and the peer's real
source is SNATed to its remapped twin (or masqueraded to the gateway's address instead).

The tunnel filter: every packet forwarded from or into the WireGuard interface passes a chain that
accepts replies of tracked flows and new flows between the allowed sets only — from the peer's pods
to our pods or an exposed address, from our pods to the peer's pods or external range — and drops
(and counts, in a named counter per direction) everything else; packets from the tunnel to the
gateway itself are dropped too, except the peer's probe of our tunnel address. "Pods" is a whole pod
range or, when the plan names them (`local_members` / `peer_members`), only the pods of the peering:
the provider's gateway lets only the consumer's twin pods be reached, the consumer's gateway lets
only the peer addresses of pods it offloaded in. The sets are built from this side's own objects
only: what the peer's gateway filters is never relied on. `nft_sets` refills the sets alone, in one
transaction, when only the members changed.

Does not: run `nft`, `ip` or `wg`, talk to a WireGuard device, create routes or policy rules (the
drivers do), allocate ranges (`netfabric.ipam`), or handle IPv6.

Pure: no I/O. Every output is deterministic for a given input.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, collapse_addresses
from types import MappingProxyType

from netfabric.ipam import RangeMap

#: Linux IFNAMSIZ is 16 including the terminating NUL.
MAX_INTERFACE = 15
_INTERFACE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
#: nft identifiers may not start with a digit (it would lex as a number); NFT_NAME_MAXLEN is 256 with NUL.
MAX_TABLE = 255
_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY = re.compile(r"[0-9a-fA-F]{64}")
MAX_MARK = 0xFFFFFFFF
#: `mark_for` stays inside [MARK_MIN, MARK_MAX] and never sets kube-proxy's masquerade (0x4000) or
#: drop (0x8000) bits, which kube-proxy tests on the packet mark in POSTROUTING.
MARK_MIN = 0x10000
MARK_MAX = 0xFFFFFFF
_KUBE_PROXY_BITS = 0xC000
INTERFACE_PREFIX = "gf-"
TABLE_PREFIX = "gpufed_"
#: Named counters of the tunnel filter's drops, by direction: arriving from the peer (forwarded or
#: addressed to the gateway itself) and leaving into the tunnel.
DROPPED_FROM_PEER = "dropped_from_peer"
DROPPED_TO_PEER = "dropped_to_peer"
DROP_COUNTERS = (DROPPED_FROM_PEER, DROPPED_TO_PEER)
#: The base chains of the tunnel filter (hooks forward and input); without them the table only translates.
FILTER_CHAINS = ("filter_forward", "filter_input")


class RenderError(ValueError):
    """A name, key or plan the data plane cannot take."""


@dataclass(frozen=True)
class GatewayPlan:
    """One peering's gateway data plane.

    `interface`: the WireGuard interface name (1-15 of `[A-Za-z0-9_.-]`, not "." or "..").
    `table`: the nftables table name (family ip), `[A-Za-z0-9_]`, not starting with a digit.
    `mark`: 1..0xffffffff, the conntrack mark, fwmark and policy-routing table id.
    `local_pod`: our real pod CIDR. `peer_pod` / `peer_external`: the peer's real pod / external CIDR
    -> how we see it. `external_ips`: an address in OUR external CIDR -> the real local address it
    stands for (DNATed on the way in; a read-only copy is kept). `masquerade`: SNAT inbound traffic to
    the gateway's own address instead of the peer's remapped twin. `tunnel_address` /
    `peer_tunnel_address`: the two ends of the tunnel; the peer's probe of ours is the one packet the
    filter lets through to the gateway itself (None: an echo request from the tunnel to any of the
    gateway's addresses is let through instead). `local_members`: the addresses in our pod CIDR the
    peer may reach and that may open flows into the tunnel (None: the whole CIDR); `peer_members`:
    the peer's real pod addresses that may open flows to us and that our pods may reach (None: its
    whole pod range). Members outside their range are refused.
    """

    interface: str
    table: str
    mark: int
    local_pod: IPv4Network
    peer_pod: RangeMap
    peer_external: RangeMap | None
    external_ips: Mapping[IPv4Address, IPv4Address] = field(default_factory=dict, hash=False)
    masquerade: bool = False
    tunnel_address: IPv4Address | None = None
    peer_tunnel_address: IPv4Address | None = None
    local_members: frozenset[IPv4Address] | None = None
    peer_members: frozenset[IPv4Address] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "external_ips", MappingProxyType(dict(self.external_ips)))
        for what, members, net in (
            ("local", self.local_members, self.local_pod),
            ("peer", self.peer_members, self.peer_pod.real),
        ):
            outside = sorted(a for a in members or () if a not in net)
            if outside:
                raise RenderError(f"{what} member {outside[0]} is outside the pod range {net}")
        if not _INTERFACE.fullmatch(self.interface) or self.interface in {".", ".."}:
            raise RenderError(
                f"invalid interface name {self.interface!r}: use 1-{MAX_INTERFACE} of letters, digits, '_', '.', '-'"
            )
        if len(self.table) > MAX_TABLE or not _TABLE.fullmatch(self.table):
            raise RenderError(
                f"invalid nftables table name {self.table!r}: use letters, digits and '_', not starting with a digit"
            )
        if not 1 <= self.mark <= MAX_MARK:
            raise RenderError(f"mark {self.mark:#x} is outside 0x1..{MAX_MARK:#x}")
        seen = [self.peer_pod.mapped]
        if self.peer_external is not None:
            if self.peer_external.mapped.overlaps(self.peer_pod.mapped):
                raise RenderError(
                    f"the peer's external range {self.peer_external.mapped} overlaps its pod range "
                    f"{self.peer_pod.mapped} as we see them"
                )
            seen.append(self.peer_external.mapped)
        for net in seen:
            if net.overlaps(self.local_pod):
                raise RenderError(
                    f"{net} (a peer range as we see it) overlaps our pod CIDR {self.local_pod}: it needs remapping"
                )


def _hex(mark: int) -> str:
    return f"0x{mark:08x}"


def _peer_ranges(plan: GatewayPlan) -> list[RangeMap]:
    return [plan.peer_pod] if plan.peer_external is None else [plan.peer_pod, plan.peer_external]


def filter_sets(plan: GatewayPlan) -> dict[str, list[IPv4Network]]:
    """The named sets of the tunnel filter, each collapsed to the fewest prefixes, in address order
    (a set may be empty: no member pod yet).

    `peer_pods`: the sources a new flow from the peer may have (its real pod addresses: the tunnel
    carries real addresses and the filter runs before the SNAT to the remapped twin). `local_reachable`:
    where such a flow may go (our pods and the real addresses of our exposed external addresses, which
    the DNAT has already put in place). `local_pods`: the sources a new flow into the tunnel may have.
    `peer_reachable`: where it may go (the peer's real pods and external range: the way-out DNAT has
    already turned the remapped address into the real one; the peer's gateway decides which of its
    external addresses lead anywhere). Pods are the members when the plan names them, else the range.
    """

    def collapsed(nets: list[IPv4Network]) -> list[IPv4Network]:
        return list(collapse_addresses(nets))

    def pods(net: IPv4Network, members: frozenset[IPv4Address] | None) -> list[IPv4Network]:
        return [net] if members is None else [IPv4Network(a) for a in members]

    local = pods(plan.local_pod, plan.local_members)
    peer = pods(plan.peer_pod.real, plan.peer_members)
    external = [plan.peer_external.real] if plan.peer_external is not None else []
    return {
        "peer_pods": collapsed(peer),
        "peer_reachable": collapsed([*peer, *external]),
        "local_pods": collapsed(local),
        "local_reachable": collapsed([*local, *(IPv4Network(a) for a in plan.external_ips.values())]),
    }


def _fill_sets(plan: GatewayPlan) -> list[str]:
    t, sets = plan.table, filter_sets(plan)
    lines = [f"flush set ip {t} {name}" for name in sets]
    lines += [
        f"add element ip {t} {name} {{ {', '.join(map(str, nets))} }}"
        for name, nets in sets.items()
        if nets  # nft refuses an empty element list; the flushed set stays empty
    ]
    return lines


def nft_sets(plan: GatewayPlan) -> str:
    """Text for `nft -f -` that refills the tunnel filter's sets of an existing `plan.table` to the
    plan, in one transaction (a packet sees the old sets or the new ones, never an empty one in
    between); nothing else of the table changes. Fails when the table or a set is missing (the
    caller applies `nft_update` then)."""
    return "\n".join(_fill_sets(plan)) + "\n"


def _chains(plan: GatewayPlan) -> list[tuple[str, str | None, list[str]]]:
    """(name, hook line or None for a regular chain, rules) of every chain of the table, in order."""
    iface, mark = f'"{plan.interface}"', _hex(plan.mark)
    ranges = _peer_ranges(plan)
    seen_as = ", ".join(str(r.mapped) for r in ranges)
    marks = [
        f"iifname {iface} ct mark set {mark}",
        f"iifname != {iface} ip daddr {{ {seen_as} }} ct mark set {mark}",
        f"iifname != {iface} ct mark {mark} meta mark set {mark}",
    ]
    prenat: list[str] = []
    # Way out: remapped -> real.
    for r in ranges:
        if not r.identity:
            to_real = f"ip daddr & {r.mapped.hostmask} | {r.real.network_address}"
            prenat.append(f"iifname != {iface} ip daddr {r.mapped} dnat ip to {to_real}")
    # Way in: our external-CIDR addresses -> the real local addresses they stand for.
    for ext, real in sorted(plan.external_ips.items()):
        prenat.append(f"iifname {iface} ip daddr {ext} dnat ip to {real}")
    postnat: list[str] = []
    if plan.masquerade:
        postnat.append(f"iifname {iface} oifname != {iface} masquerade")
    else:
        # Way in, the mirror of the way out: peer real -> how we see it.
        for r in ranges:
            if not r.identity:
                to_mapped = f"ip saddr & {r.real.hostmask} | {r.mapped.network_address}"
                postnat.append(f"iifname {iface} ip saddr {r.real} snat ip to {to_mapped}")
    # The filter sees the addresses after the DNAT (prerouting) and before the SNAT (postrouting).
    forward = [f"iifname {iface} jump from_peer", f"oifname {iface} jump to_peer"]
    probe = "icmp type echo-request accept"
    if plan.tunnel_address is not None and plan.peer_tunnel_address is not None:
        probe = f"ip saddr {plan.peer_tunnel_address} ip daddr {plan.tunnel_address} {probe}"
    to_gateway = [
        f"iifname {iface} ct state established,related accept",
        f"iifname {iface} {probe}",
        f'iifname {iface} counter name "{DROPPED_FROM_PEER}" drop',
    ]
    from_peer = [
        "ct state established,related accept",
        "ip saddr @peer_pods ip daddr @local_reachable accept",
        f'counter name "{DROPPED_FROM_PEER}" drop',
    ]
    to_peer = [
        "ct state established,related accept",
        "ip saddr @local_pods ip daddr @peer_reachable accept",
        f'counter name "{DROPPED_TO_PEER}" drop',
    ]
    forward_chain, input_chain = FILTER_CHAINS
    return [
        ("marks", "type filter hook prerouting priority mangle; policy accept;", marks),
        ("prenat", "type nat hook prerouting priority dstnat; policy accept;", prenat),
        ("postnat", "type nat hook postrouting priority srcnat; policy accept;", postnat),
        (forward_chain, "type filter hook forward priority filter; policy accept;", forward),
        (input_chain, "type filter hook input priority filter; policy accept;", to_gateway),
        ("from_peer", None, from_peer),
        ("to_peer", None, to_peer),
    ]


def nft_update(plan: GatewayPlan) -> str:
    """Text for `nft -f -` that brings `plan.table` to the plan in place, in one transaction: the
    table, its counters, sets and chains are declared (created when missing, kept when present), every
    chain and set is emptied and filled again. The drop counters and the conntrack state survive; a
    re-apply of an unchanged plan changes nothing a packet can see. Fails (and `nft_ruleset` is the way
    out) when a chain of the same name exists with another hook.
    """
    t = plan.table
    chains = _chains(plan)
    sets = filter_sets(plan)
    lines = [f"table ip {t} {{"]
    for name in DROP_COUNTERS:
        lines += [f"\tcounter {name} {{", "\t}"]
    for name in sets:
        lines += [f"\tset {name} {{", "\t\ttype ipv4_addr; flags interval;", "\t}"]
    for name, hook, _ in chains:
        lines.append(f"\tchain {name} {{")
        if hook is not None:
            lines.append(f"\t\t{hook}")
        lines.append("\t}")
    lines.append("}")
    lines += [f"flush chain ip {t} {name}" for name, _, _ in chains]
    lines += _fill_sets(plan)
    lines.append(f"table ip {t} {{")
    for name, _, rules in chains:
        if rules:
            lines.append(f"\tchain {name} {{")
            lines.extend(f"\t\t{rule}" for rule in rules)
            lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def nft_ruleset(plan: GatewayPlan) -> str:
    """Text for `nft -f -` that atomically replaces only `plan.table` (idempotent on re-apply): the
    table is deleted and built again as `nft_update` describes it, in one transaction (its drop counters
    start again at zero).

    The leading `table` + `delete table` lines make the delete succeed whether or not the table exists.
    """
    return f"table ip {plan.table}\ndelete table ip {plan.table}\n" + nft_update(plan)


def _key(value: str, what: str) -> str:
    # Never echo the value: it may be a private key.
    if not _KEY.fullmatch(value):
        raise RenderError(f"{what} must be 64 hexadecimal characters (32 bytes)")
    return value.lower()


def uapi_set(
    private_key_hex: str,
    listen_port: int | None,
    peer_public_key_hex: str,
    endpoint: tuple[str, int] | None,
    keepalive: int | None,
    allowed_ips: Sequence[IPv4Network],
    current_peers: Sequence[str] | None = None,
) -> str:
    """The WireGuard UAPI "set" message configuring the device and its single peer, removing any others.

    Keys are hex (as UAPI wants them, lowercased); `endpoint` is an IPv4 address and port. The message
    ends with the empty line that terminates a UAPI request. `current_peers` (hex public keys) are the
    device's peers now: the others are removed one by one and ours is updated in place, so a re-apply
    of an unchanged spec keeps its session (and, on a server, the endpoint it learned from the client);
    None (not known): `replace_peers=true`, which recreates the peer and cuts the tunnel until the
    next handshake.
    """
    lines = ["set=1", f"private_key={_key(private_key_hex, 'private key')}"]
    if listen_port is not None:
        if not 0 <= listen_port <= 0xFFFF:
            raise RenderError(f"listen port {listen_port} is outside 0..65535")
        lines.append(f"listen_port={listen_port}")
    peer = _key(peer_public_key_hex, "peer public key")
    if current_peers is None:
        lines.append("replace_peers=true")
    else:
        for other in sorted({_key(k, "current peer's public key") for k in current_peers} - {peer}):
            lines += [f"public_key={other}", "remove=true"]
    lines.append(f"public_key={peer}")
    if endpoint is not None:
        host, port = endpoint
        try:
            address = IPv4Address(host)
        except ValueError:
            raise RenderError(f"endpoint host {host!r} is not an IPv4 address") from None
        if not 1 <= port <= 0xFFFF:
            raise RenderError(f"endpoint port {port} is outside 1..65535")
        lines.append(f"endpoint={address}:{port}")
    if keepalive is not None:
        if not 0 <= keepalive <= 0xFFFF:
            raise RenderError(f"keepalive {keepalive} is outside 0..65535 seconds")
        lines.append(f"persistent_keepalive_interval={keepalive}")
    lines.append("replace_allowed_ips=true")
    lines += [f"allowed_ip={net}" for net in allowed_ips]
    return "\n".join(lines) + "\n\n"


def allowed_ips(plan: GatewayPlan, peer_tunnel_ip: IPv4Address) -> list[IPv4Network]:
    """What the peer may send from and we route to it: its REAL ranges (the tunnel carries real addresses)."""
    nets = [r.real for r in _peer_ranges(plan)]
    nets.append(IPv4Network(peer_tunnel_ip))
    return nets


def _digest(remote_cluster_id: str) -> str:
    if not remote_cluster_id:
        raise RenderError("the remote cluster ID is empty")
    return hashlib.sha256(remote_cluster_id.encode()).hexdigest()


def interface_name(remote_cluster_id: str) -> str:
    """`gf-` + 12 hex of the ID's sha256: 15 characters, the IFNAMSIZ limit."""
    return INTERFACE_PREFIX + _digest(remote_cluster_id)[: MAX_INTERFACE - len(INTERFACE_PREFIX)]


def table_name(remote_cluster_id: str) -> str:
    """`gpufed_` + 16 hex of the ID's sha256."""
    return TABLE_PREFIX + _digest(remote_cluster_id)[:16]


def mark_for(remote_cluster_id: str) -> int:
    """A mark in [0x10000, 0xfffffff] from the ID's sha256, with kube-proxy's 0xc000 bits clear."""
    value = MARK_MIN + int(_digest(remote_cluster_id)[:16], 16) % (MARK_MAX - MARK_MIN + 1)
    return value & ~_KUBE_PROXY_BITS
