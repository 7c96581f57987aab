"""Control-plane address translation between two peered clusters whose pod CIDRs may overlap.

The model: on the WireGuard tunnel, packets always carry the REAL addresses of each side. When the
two clusters use the same (or overlapping) pod CIDRs, each side sees the other's ranges under a
remapped twin range that does not collide with its own. Each gateway DNATs "remapped -> real" on
traffic going out into the tunnel and SNATs the mirror ("peer real -> remapped") on traffic coming
in, so local pods only ever meet the remapped addresses (`netfabric.render` writes those rules).
`Remapper` is how the control plane shows addresses consistently with that data plane: a remote
pod's IP reported by the peer is shown locally as its remapped twin (`to_local_ip`), and one of our
addresses handed to the peer is shown as the peer reaches it (`to_remote_ip`).

Owns: the `Remapper` value and its two directions. It satisfies the IP-translation Protocol that
`vkprovider.remote.translate` declares (`to_local_ip` / `to_remote_ip`) structurally; netfabric never
imports vkprovider. Likewise its ranges are `netfabric.ipam.RangeMap`s taken structurally (`RangeLike`):
the layering contract keeps `netfabric.ipam` and `netfabric.remap` independent of each other.

Does not: allocate the ranges (`netfabric.ipam` does), program NAT (`netfabric.render` does), or
handle IPv6: non-IPv4 or unparsable strings pass through unchanged.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from types import MappingProxyType
from typing import Protocol


class RangeLike(Protocol):
    """What the remapper needs of a range mapping; `netfabric.ipam.RangeMap` is one."""

    @property
    def real(self) -> IPv4Network: ...

    def contains_real(self, ip: IPv4Address) -> bool: ...

    def to_mapped(self, ip: IPv4Address) -> IPv4Address: ...

    def contains_mapped(self, ip: IPv4Address) -> bool: ...

    def to_real(self, ip: IPv4Address) -> IPv4Address: ...


def _parse(ip: str) -> IPv4Address | None:
    try:
        return IPv4Address(ip)
    except ValueError:
        return None


@dataclass(frozen=True)
class Remapper:
    """How addresses of one peering are shown on each side.

    `peer_pod` / `peer_external`: the peer's real pod / external CIDR -> how WE see it.
    `local_pod` / `local_external`: OUR real pod / external CIDR -> how the PEER sees it.
    `external_ips`: our real non-pod addresses (e.g. a Service ClusterIP) -> the address allocated
    for each inside our external CIDR (`local_external.real`); a copy is kept, read-only.
    """

    peer_pod: RangeLike
    peer_external: RangeLike | None
    local_pod: RangeLike
    local_external: RangeLike | None
    external_ips: Mapping[IPv4Address, IPv4Address] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "external_ips", MappingProxyType(dict(self.external_ips)))
        if self.local_external is not None:
            outside = sorted(ext for ext in self.external_ips.values() if not self.local_external.contains_real(ext))
            if outside:
                raise ValueError(
                    f"external addresses {', '.join(map(str, outside))} are not inside our external CIDR "
                    f"{self.local_external.real}"
                )

    def to_local_ip(self, ip: str) -> str:
        """An address the peer reported (e.g. a remote pod IP) -> the address we reach it at."""
        addr = _parse(ip)
        if addr is None:
            return ip
        if self.peer_pod.contains_real(addr):
            return str(self.peer_pod.to_mapped(addr))
        if self.peer_external is not None and self.peer_external.contains_real(addr):
            return str(self.peer_external.to_mapped(addr))
        # one of our own addresses as the peer sees it (e.g. a reflected endpoint) -> ours, real
        for ours in (self.local_pod, self.local_external):
            if ours is not None and ours.contains_mapped(addr):
                return str(ours.to_real(addr))
        return ip

    def to_remote_ip(self, ip: str) -> str:
        """One of OUR addresses -> the address the peer reaches it at."""
        addr = _parse(ip)
        if addr is None:
            return ip
        if self.local_pod.contains_real(addr):
            return str(self.local_pod.to_mapped(addr))
        external = self.external_ips.get(addr)
        if external is not None:
            return str(self.local_external.to_mapped(external) if self.local_external is not None else external)
        if self.local_external is not None and self.local_external.contains_real(addr):
            return str(self.local_external.to_mapped(addr))
        # the peer's own address as we see it (e.g. an offloaded pod behind a reflected Service) ->
        # the peer's real address
        for theirs in (self.peer_pod, self.peer_external):
            if theirs is not None and theirs.contains_mapped(addr):
                return str(theirs.to_real(addr))
        return ip
