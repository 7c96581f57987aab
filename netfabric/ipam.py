"""Fabric IPAM: choosing remapped IPv4 ranges and addresses, and the arithmetic of a remapping.

Owns: the pools remapped ranges come from (`DEFAULT_POOLS`), picking a range of a wanted size that
collides with nothing in use (`allocate_range`: the wanted range itself when it is free, else the
lowest free aligned subnet of the same size in the pools), picking a free host address in a range
(`allocate_address`), the one-to-one mapping between a real range and its remapped twin (`RangeMap`,
`translate`: the host offset is kept), and the tunnel MTU (`mtu_for`).

Does not: remember anything (releasing a range is simply leaving it out of `in_use` next time; the
caller stores allocations), translate whole address strings for the control plane (`netfabric.remap`
does), render data-plane rules (`netfabric.render` does), or handle IPv6 (out of scope).

Pure: no I/O; only `ipaddress` arithmetic. Every function is deterministic.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

#: Where remapped ranges come from unless the caller says otherwise: 10.64.0.0-10.127.255.255.
DEFAULT_POOLS: tuple[IPv4Network, ...] = (IPv4Network("10.64.0.0/10"),)

#: WireGuard's per-packet overhead: outer IP header (20 or 40) + UDP (8) + WireGuard data header (16)
#: + Poly1305 tag (16).
WIREGUARD_OVERHEAD_IPV4 = 60
WIREGUARD_OVERHEAD_IPV6 = 80
#: The smallest MTU IPv6 allows (RFC 8200); WireGuard refuses to carry IPv6 below it, so we never go lower.
MIN_MTU = 1280
#: 1500 - 80: right for a standard Ethernet underlay whether it is IPv4 or IPv6 (the same default as
#: wg-quick). Use `mtu_for` when the underlay MTU is known.
DEFAULT_MTU = 1420


class IPAMError(ValueError):
    """An allocation or a mapping that cannot be made."""


class PoolExhausted(IPAMError):  # noqa: N818 -- the name the fabric's callers catch (an outcome, not a bug)
    """No free range (or address) of the asked size is left."""


def overlaps(net: IPv4Network, others: Iterable[IPv4Network]) -> bool:
    """Whether `net` shares at least one address with any of `others`."""
    return any(net.overlaps(other) for other in others)


def _merged(ranges: Iterable[IPv4Network]) -> tuple[list[int], list[int]]:
    """`ranges` as sorted, disjoint, non-adjacent-merged [first, last] integer intervals (two parallel lists)."""
    intervals = sorted((int(r.network_address), int(r.broadcast_address)) for r in ranges)
    firsts: list[int] = []
    lasts: list[int] = []
    for first, last in intervals:
        if lasts and first <= lasts[-1] + 1:
            lasts[-1] = max(lasts[-1], last)
        else:
            firsts.append(first)
            lasts.append(last)
    return firsts, lasts


def allocate_range(
    wanted: IPv4Network, in_use: Iterable[IPv4Network], pools: Sequence[IPv4Network] = DEFAULT_POOLS
) -> IPv4Network:
    """`wanted` if it overlaps nothing in `in_use`, else the first free subnet of its size in `pools`.

    "First" is the lowest address, the pools taken in the order given; the subnet is aligned to its
    own size. A pool smaller than `wanted` is skipped. Raises `PoolExhausted` when no pool has room.

    Runs in O(n log n) for n in-use ranges: each candidate that collides skips past the in-use
    interval it hit, so a /10 pool with hundreds of /24s in use costs a few hundred steps, not 16k.
    """
    used = list(in_use)
    if not overlaps(wanted, used):
        return wanted
    size = wanted.num_addresses
    firsts, lasts = _merged(used)
    for pool in pools:
        if pool.prefixlen > wanted.prefixlen:
            continue
        candidate = int(pool.network_address)
        pool_last = int(pool.broadcast_address)
        while candidate + size - 1 <= pool_last:
            # The first in-use interval that ends at or after the candidate's start.
            i = bisect.bisect_left(lasts, candidate)
            if i == len(lasts) or firsts[i] > candidate + size - 1:
                return IPv4Network((candidate, wanted.prefixlen))
            # Skip to the first aligned start after that interval.
            candidate = (lasts[i] // size + 1) * size
    names = ", ".join(str(p) for p in pools) or "(no pools)"
    raise PoolExhausted(f"no free /{wanted.prefixlen} left in {names} (wanted {wanted}, {len(used)} ranges in use)")


def allocate_address(cidr: IPv4Network, taken: Iterable[IPv4Address]) -> IPv4Address:
    """The lowest free host address of `cidr`.

    Below /31 the network and broadcast addresses are never handed out; a /31 or /32 uses every
    address (RFC 3021). Raises `PoolExhausted` when every usable address is taken.
    """
    used = {int(a) for a in taken}
    first, last = int(cidr.network_address), int(cidr.broadcast_address)
    if cidr.prefixlen < 31:
        first, last = first + 1, last - 1
    # Stops at the first gap, so at most len(used) + 1 steps.
    for value in range(first, last + 1):
        if value not in used:
            return IPv4Address(value)
    raise PoolExhausted(f"no free address left in {cidr} ({last - first + 1} usable, all taken)")


def translate(ip: IPv4Address, src: IPv4Network, dst: IPv4Network) -> IPv4Address:
    """The address at the same host offset in `dst` as `ip` has in `src`.

    Raises `ValueError` if `ip` is not inside `src`, `IPAMError` if the ranges differ in size.
    """
    if src.prefixlen != dst.prefixlen:
        raise IPAMError(f"cannot translate between {src} and {dst}: the prefix lengths differ")
    if ip not in src:
        raise ValueError(f"{ip} is not inside {src}")
    return IPv4Address(int(dst.network_address) + (int(ip) - int(src.network_address)))


@dataclass(frozen=True)
class RangeMap:
    """A real range and the remapped range of the same size that stands for it, address by address."""

    real: IPv4Network
    mapped: IPv4Network

    def __post_init__(self) -> None:
        if self.real.prefixlen != self.mapped.prefixlen:
            raise IPAMError(f"{self.real} and {self.mapped} differ in size: a range maps only to one of the same size")

    @property
    def identity(self) -> bool:
        """Whether the range is shown as it is (no translation needed)."""
        return self.real == self.mapped

    def to_mapped(self, ip: IPv4Address) -> IPv4Address:
        """The remapped twin of a real address; `ValueError` if `ip` is not in `real`."""
        return translate(ip, self.real, self.mapped)

    def to_real(self, ip: IPv4Address) -> IPv4Address:
        """The real address a remapped one stands for; `ValueError` if `ip` is not in `mapped`."""
        return translate(ip, self.mapped, self.real)

    def contains_real(self, ip: IPv4Address) -> bool:
        return ip in self.real

    def contains_mapped(self, ip: IPv4Address) -> bool:
        return ip in self.mapped


def mtu_for(underlay_mtu: int, ipv6_underlay: bool) -> int:
    """The WireGuard interface MTU for an underlay of `underlay_mtu` bytes.

    Raises `IPAMError` when the result would be below 1280, the IPv6 minimum MTU.
    """
    overhead = WIREGUARD_OVERHEAD_IPV6 if ipv6_underlay else WIREGUARD_OVERHEAD_IPV4
    mtu = underlay_mtu - overhead
    if mtu < MIN_MTU:
        family = "IPv6" if ipv6_underlay else "IPv4"
        raise IPAMError(
            f"underlay MTU {underlay_mtu} leaves {mtu} bytes after the {overhead}-byte WireGuard-over-{family} "
            f"overhead; the tunnel needs at least {MIN_MTU} (the IPv6 minimum MTU)"
        )
    return mtu
