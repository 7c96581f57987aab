"""Fabric IPAM: range and address allocation, range maps, the tunnel MTU."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netfabric.ipam import (
    DEFAULT_MTU,
    DEFAULT_POOLS,
    IPAMError,
    PoolExhausted,
    RangeMap,
    allocate_address,
    allocate_range,
    mtu_for,
    overlaps,
    translate,
)

N = IPv4Network
A = IPv4Address
POD = N("10.244.0.0/16")

# ---------------------------------------------------------------- overlaps


def test_overlaps() -> None:
    assert overlaps(N("10.0.0.0/24"), [N("192.168.0.0/16"), N("10.0.0.128/25")])
    assert overlaps(N("10.0.0.0/24"), [N("10.0.0.0/8")])
    assert not overlaps(N("10.0.0.0/24"), [N("10.0.1.0/24"), N("9.255.255.0/24")])
    assert not overlaps(N("10.0.0.0/24"), [])


# ---------------------------------------------------------------- allocate_range


def test_free_wanted_range_is_kept_as_it_is() -> None:
    # Even outside the pools: a range that collides with nothing needs no remapping.
    assert allocate_range(POD, [N("10.96.0.0/12"), N("192.168.0.0/24")]) == POD
    assert allocate_range(POD, []) == POD


def test_collision_with_our_range_takes_the_first_free_of_the_same_size() -> None:
    assert list(DEFAULT_POOLS) == [N("10.64.0.0/10")]
    assert allocate_range(POD, [POD]) == N("10.64.0.0/16")
    assert allocate_range(N("10.244.0.0/24"), [N("10.244.0.0/16")]) == N("10.64.0.0/24")


def test_collision_with_another_peers_allocation_takes_the_next() -> None:
    first = allocate_range(POD, [POD])
    second = allocate_range(POD, [POD, first])
    assert second == N("10.65.0.0/16")
    # A smaller in-use range inside a candidate still disqualifies the whole candidate.
    assert allocate_range(POD, [POD, N("10.64.0.0/16"), N("10.65.255.0/24")]) == N("10.66.0.0/16")


def test_released_range_is_reused() -> None:
    first = allocate_range(POD, [POD])
    second = allocate_range(POD, [POD, first])
    # "Release" = leave it out of in_use next time.
    assert allocate_range(POD, [POD, second]) == first


def test_result_is_aligned_to_its_size() -> None:
    # 10.64.0.0/24 is taken: a /23 must start at 10.64.2.0, not at 10.64.1.0.
    assert allocate_range(N("10.244.0.0/23"), [N("10.244.0.0/16"), N("10.64.0.0/24")]) == N("10.64.2.0/23")


def test_pools_are_tried_in_order_and_small_pools_skipped() -> None:
    pools = [N("172.16.0.0/24"), N("192.168.0.0/16"), N("100.64.0.0/10")]
    # 172.16.0.0/24 is smaller than a /16: skipped.
    assert allocate_range(POD, [POD], pools) == N("192.168.0.0/16")
    assert allocate_range(POD, [POD, N("192.168.7.0/24")], pools) == N("100.64.0.0/16")
    # A /24 fits the first pool.
    assert allocate_range(N("10.244.0.0/24"), [POD], pools) == N("172.16.0.0/24")


def test_in_use_straddling_the_pool_boundary() -> None:
    # CIDRs nest or are disjoint, so an in-use range crosses a pool's edge by containing the pool or
    # by spanning adjacent pools.
    pools = [N("10.64.0.0/16"), N("10.65.0.0/16"), N("10.66.0.0/16")]
    wanted = N("10.244.0.0/24")
    assert allocate_range(wanted, [POD, N("10.64.0.0/15")], pools) == N("10.66.0.0/24")
    # A supernet of every pool leaves nothing.
    with pytest.raises(PoolExhausted):
        allocate_range(wanted, [POD, N("10.0.0.0/9")], pools)
    # Something in use just below a pool does not disqualify the pool's first subnet...
    assert allocate_range(wanted, [POD, N("10.63.255.0/24")], pools) == N("10.64.0.0/24")
    # ...and the last subnet of a pool is used when everything before it is taken.
    assert allocate_range(N("10.244.0.0/17"), [POD, N("10.64.0.0/17")], [N("10.64.0.0/16")]) == N("10.64.128.0/17")
    # Pools are tried in the order given, each from its own start, even a lower one after a higher one.
    pools = [N("10.66.0.0/15"), N("10.64.0.0/15")]
    assert allocate_range(POD, [POD, N("10.66.0.0/15"), N("10.64.0.0/16")], pools) == N("10.65.0.0/16")
    assert allocate_range(POD, [POD, N("10.66.0.0/16")], pools) == N("10.67.0.0/16")


def test_exhausted_pool_names_pools_and_size() -> None:
    pool = N("10.64.0.0/15")
    with pytest.raises(PoolExhausted, match=r"/16.*10\.64\.0\.0/15") as exc:
        allocate_range(POD, [POD, N("10.64.0.0/16"), N("10.65.0.0/16")], [pool])
    assert isinstance(exc.value, IPAMError)
    assert isinstance(exc.value, ValueError)
    with pytest.raises(PoolExhausted, match="/16"):
        allocate_range(POD, [POD], [N("10.64.0.0/17")])
    with pytest.raises(PoolExhausted):
        allocate_range(POD, [POD], [])


def test_many_in_use_ranges_in_a_big_pool() -> None:
    # Every /24 of 10.64.0.0 - 10.65.255.255 is in use (512 ranges, shuffled order).
    in_use = [N(f"10.{64 + i // 256}.{i % 256}.0/24") for i in range(512)]
    in_use = in_use[1::2] + in_use[::2] + [N("10.244.0.0/16")]
    assert allocate_range(N("10.244.1.0/24"), in_use) == N("10.66.0.0/24")
    # Releasing one in the middle makes it the answer.
    hole = N("10.65.17.0/24")
    assert allocate_range(N("10.244.1.0/24"), [n for n in in_use if n != hole]) == hole


def test_full_default_pool_at_24_is_exhausted_quickly() -> None:
    # 16384 /24s: the skip-ahead crosses the pool in one step per merged interval.
    in_use = [N(f"10.{64 + i // 256}.{i % 256}.0/24") for i in range(64 * 256)]
    with pytest.raises(PoolExhausted):
        allocate_range(N("10.244.1.0/24"), [*in_use, N("10.244.0.0/16")])


NETS = st.builds(
    lambda addr, plen: IPv4Network((addr, plen), strict=False),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=8, max_value=30),
)
POOL_NETS = st.builds(
    lambda addr, plen: IPv4Network((addr, plen), strict=False),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=8, max_value=26),
)


@settings(max_examples=300, deadline=None, database=None)
@given(NETS, st.lists(NETS, max_size=30), st.lists(POOL_NETS, max_size=3))
def test_allocation_never_collides(wanted: IPv4Network, in_use: list[IPv4Network], pools: list[IPv4Network]) -> None:
    try:
        got = allocate_range(wanted, in_use, pools)
    except PoolExhausted:
        # Then no aligned subnet of that size in any pool is free: check by brute force on small cases.
        for pool in pools:
            if pool.prefixlen <= wanted.prefixlen and wanted.prefixlen - pool.prefixlen <= 10:
                assert all(overlaps(s, in_use) for s in pool.subnets(new_prefix=wanted.prefixlen))
        assert overlaps(wanted, in_use)
        return
    assert got.prefixlen == wanted.prefixlen
    assert not overlaps(got, in_use)
    if got != wanted:
        assert overlaps(wanted, in_use)
        assert any(got.subnet_of(pool) for pool in pools)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(NETS, max_size=20), st.integers(min_value=12, max_value=24))
def test_allocation_is_the_first_free_subnet(in_use: list[IPv4Network], plen: int) -> None:
    pool = N("10.64.0.0/10")
    wanted = N(("10.244.0.0", plen), strict=False)
    in_use = [*in_use, wanted]
    expected = next((s for s in pool.subnets(new_prefix=plen) if not overlaps(s, in_use)), None)
    if expected is None:
        with pytest.raises(PoolExhausted):
            allocate_range(wanted, in_use, [pool])
    else:
        assert allocate_range(wanted, in_use, [pool]) == expected
        # Deterministic: the order of in_use does not matter.
        assert allocate_range(wanted, list(reversed(in_use)), [pool]) == expected


# ---------------------------------------------------------------- allocate_address


def test_first_free_host_address() -> None:
    net = N("10.65.0.0/24")
    assert allocate_address(net, []) == A("10.65.0.1")
    assert allocate_address(net, [A("10.65.0.1"), A("10.65.0.2")]) == A("10.65.0.3")
    # A freed address below the others is handed out first.
    assert allocate_address(net, [A("10.65.0.2"), A("10.65.0.3")]) == A("10.65.0.1")
    # Addresses outside the range are ignored.
    assert allocate_address(net, [A("10.0.0.1")]) == A("10.65.0.1")


def test_network_and_broadcast_are_never_handed_out() -> None:
    net = N("10.65.0.0/30")
    assert allocate_address(net, [A("10.65.0.1")]) == A("10.65.0.2")
    with pytest.raises(PoolExhausted, match=r"10\.65\.0\.0/30"):
        allocate_address(net, [A("10.65.0.1"), A("10.65.0.2")])


def test_point_to_point_and_host_ranges_use_every_address() -> None:
    assert allocate_address(N("10.65.0.0/31"), []) == A("10.65.0.0")
    assert allocate_address(N("10.65.0.0/31"), [A("10.65.0.0")]) == A("10.65.0.1")
    with pytest.raises(PoolExhausted):
        allocate_address(N("10.65.0.0/31"), [A("10.65.0.0"), A("10.65.0.1")])
    assert allocate_address(N("10.65.0.7/32"), []) == A("10.65.0.7")
    with pytest.raises(PoolExhausted):
        allocate_address(N("10.65.0.7/32"), [A("10.65.0.7")])


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(min_value=24, max_value=32), st.sets(st.integers(min_value=0, max_value=255), max_size=256))
def test_address_is_free_and_usable(plen: int, offsets: set[int]) -> None:
    net = N(("10.65.0.0", plen))
    taken = [A(int(net.network_address) + o) for o in offsets if o < net.num_addresses]
    usable = list(net.hosts()) if plen < 31 else list(net)
    free = [a for a in usable if a not in taken]
    if not free:
        with pytest.raises(PoolExhausted):
            allocate_address(net, taken)
    else:
        assert allocate_address(net, taken) == free[0]


# ---------------------------------------------------------------- translate / RangeMap


def test_translate_keeps_the_host_offset() -> None:
    assert translate(A("10.244.3.7"), POD, N("10.64.0.0/16")) == A("10.64.3.7")
    assert translate(A("10.64.3.7"), N("10.64.0.0/16"), POD) == A("10.244.3.7")
    with pytest.raises(ValueError, match="not inside"):
        translate(A("10.245.0.1"), POD, N("10.64.0.0/16"))
    with pytest.raises(IPAMError, match="prefix lengths differ"):
        translate(A("10.244.0.1"), POD, N("10.64.0.0/17"))


def test_range_map() -> None:
    m = RangeMap(real=POD, mapped=N("10.64.0.0/16"))
    assert not m.identity
    assert RangeMap(POD, POD).identity
    assert m.to_mapped(A("10.244.255.254")) == A("10.64.255.254")
    assert m.to_real(A("10.64.0.9")) == A("10.244.0.9")
    assert m.contains_real(A("10.244.1.1")) and not m.contains_real(A("10.64.1.1"))
    assert m.contains_mapped(A("10.64.1.1")) and not m.contains_mapped(A("10.244.1.1"))
    with pytest.raises(ValueError):
        m.to_mapped(A("10.64.0.9"))
    with pytest.raises(ValueError):
        m.to_real(A("10.244.0.9"))


def test_range_map_refuses_different_sizes() -> None:
    with pytest.raises(IPAMError, match="differ in size"):
        RangeMap(real=POD, mapped=N("10.64.0.0/24"))


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=32),
    st.integers(min_value=0, max_value=2**32 - 1),
)
def test_range_map_round_trip(real_base: int, mapped_base: int, plen: int, offset: int) -> None:
    real = N((real_base, plen), strict=False)
    mapped = N((mapped_base, plen), strict=False)
    m = RangeMap(real, mapped)
    ip = A(int(real.network_address) + offset % real.num_addresses)
    out = m.to_mapped(ip)
    assert m.contains_mapped(out)
    assert int(out) - int(mapped.network_address) == int(ip) - int(real.network_address)
    assert m.to_real(out) == ip
    assert translate(out, mapped, real) == ip


# ---------------------------------------------------------------- mtu_for


def test_mtu() -> None:
    assert mtu_for(1500, ipv6_underlay=False) == 1440
    assert mtu_for(1500, ipv6_underlay=True) == 1420
    assert mtu_for(9001, ipv6_underlay=False) == 8941
    assert mtu_for(1500, ipv6_underlay=True) == DEFAULT_MTU == 1420
    assert mtu_for(1340, ipv6_underlay=False) == 1280
    assert mtu_for(1360, ipv6_underlay=True) == 1280


def test_mtu_below_the_ipv6_minimum_is_refused() -> None:
    with pytest.raises(IPAMError, match="1280"):
        mtu_for(1339, ipv6_underlay=False)
    with pytest.raises(IPAMError, match="IPv6 minimum"):
        mtu_for(1359, ipv6_underlay=True)
