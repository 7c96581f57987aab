"""From the fabric's CRs to what each part needs: in-use ranges, IPAM per peer, exposed addresses,
the Remapper, the gateway plan and the tunnel addresses (netfabric.plan; pure)."""

from __future__ import annotations

import itertools
from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpufed.apis.network import CIDRPair, ExternalIP, NetworkConfigSpec, RemoteNetworkSpec
from netfabric import plan
from netfabric.ipam import PoolExhausted, RangeMap
from netfabric.render import filter_sets, interface_name, mark_for, table_name

N = IPv4Network
A = IPv4Address

# Our cluster: pods 10.244.0.0/16, external CIDR 10.70.0.0/16 (the default), pools 10.64.0.0/10.
LOCAL = NetworkConfigSpec(pod_cidr="10.244.0.0/16", external_cidr="10.70.0.0/16")
# A peer that uses exactly our ranges (the common case: both run the same defaults).
SAME = CIDRPair(pod_cidr="10.244.0.0/16", external_cidr="10.70.0.0/16")
# A peer whose ranges collide with nothing here.
DISTINCT = CIDRPair(pod_cidr="10.245.0.0/16", external_cidr="10.71.0.0/24")


def _remote(cluster_id: str, real: CIDRPair, mapped: CIDRPair, peer_view: CIDRPair | None = None) -> RemoteNetworkSpec:
    return RemoteNetworkSpec(cluster_id=cluster_id, real=real, mapped=mapped, peer_view=peer_view)


def _nets(pair: CIDRPair) -> tuple[IPv4Network, IPv4Network]:
    return N(pair.pod_cidr), N(pair.external_cidr)


# ---- in_use


def test_in_use_is_our_ranges_reserved_ranges_and_other_peers_mapped_ranges() -> None:
    local = LOCAL.model_copy(update={"reserved_cidrs": ["10.96.0.0/12", "192.168.0.0/24"]})
    other = _remote(
        "peer-a",
        real=CIDRPair(pod_cidr="10.245.0.0/16", external_cidr="10.200.0.0/24"),
        mapped=CIDRPair(pod_cidr="10.64.0.0/16", external_cidr="10.65.0.0/24"),
    )
    used = plan.in_use(local, [other])
    assert used == [
        N("10.244.0.0/16"),
        N("10.70.0.0/16"),
        N("10.96.0.0/12"),
        N("192.168.0.0/24"),
        N("10.64.0.0/16"),
        N("10.65.0.0/24"),
    ]
    # the other peer's REAL ranges are not ours to avoid: we reach it through the mapped ones
    assert N("10.245.0.0/16") not in used and N("10.200.0.0/24") not in used


def test_in_use_without_other_peers_is_just_our_ranges() -> None:
    assert plan.in_use(LOCAL, []) == [N("10.244.0.0/16"), N("10.70.0.0/16")]


# ---- allocate


def test_allocate_keeps_ranges_that_collide_with_nothing() -> None:
    assert plan.allocate(LOCAL, DISTINCT, []) == DISTINCT


def test_allocate_remaps_colliding_pod_and_external_ranges_from_the_pools() -> None:
    got = plan.allocate(LOCAL, SAME, [])
    pod, ext = _nets(got)
    # same sizes as the real ranges
    assert pod.prefixlen == 16 and ext.prefixlen == 16
    # inside the pool, and the lowest free ones
    assert pod.subnet_of(N("10.64.0.0/10")) and ext.subnet_of(N("10.64.0.0/10"))
    assert got == CIDRPair(pod_cidr="10.64.0.0/16", external_cidr="10.65.0.0/16")
    # distinct from each other and from everything of ours
    assert not pod.overlaps(ext)
    for mine in (N(LOCAL.pod_cidr), N(LOCAL.external_cidr)):
        assert not pod.overlaps(mine) and not ext.overlaps(mine)


def test_allocate_remaps_only_the_range_that_collides() -> None:
    peer = CIDRPair(pod_cidr="10.244.0.0/16", external_cidr="10.200.0.0/24")
    got = plan.allocate(LOCAL, peer, [])
    assert got == CIDRPair(pod_cidr="10.64.0.0/16", external_cidr="10.200.0.0/24")


def test_allocate_external_range_avoids_the_pod_range_just_allocated() -> None:
    # the peer's external CIDR does not collide with our ranges, but it is exactly where its
    # colliding pod CIDR is remapped to: it must move too
    peer = CIDRPair(pod_cidr="10.244.0.0/16", external_cidr="10.64.0.0/24")
    got = plan.allocate(LOCAL, peer, [])
    pod, ext = _nets(got)
    assert pod == N("10.64.0.0/16")
    assert not ext.overlaps(pod) and ext.prefixlen == 24


def test_a_second_peer_with_the_same_ranges_gets_other_ranges() -> None:
    first_mapped = plan.allocate(LOCAL, SAME, [])
    first = _remote("peer-a", SAME, first_mapped)
    second_mapped = plan.allocate(LOCAL, SAME, [first])
    assert second_mapped == CIDRPair(pod_cidr="10.66.0.0/16", external_cidr="10.67.0.0/16")
    taken = _nets(first_mapped)
    for net in _nets(second_mapped):
        assert not any(net.overlaps(t) for t in taken)


def test_a_second_peer_avoids_a_first_peer_reached_without_remapping() -> None:
    first = _remote("peer-a", DISTINCT, DISTINCT)
    got = plan.allocate(LOCAL, DISTINCT, [first])
    pod, ext = _nets(got)
    assert not pod.overlaps(N(DISTINCT.pod_cidr)) and not ext.overlaps(N(DISTINCT.external_cidr))
    assert pod.prefixlen == 16 and ext.prefixlen == 24


def test_reserved_ranges_are_never_handed_out() -> None:
    local = LOCAL.model_copy(update={"reserved_cidrs": ["10.64.0.0/16", "10.65.0.0/16"]})
    got = plan.allocate(local, SAME, [])
    assert got == CIDRPair(pod_cidr="10.66.0.0/16", external_cidr="10.67.0.0/16")


def test_a_peer_range_colliding_with_a_reserved_range_is_remapped() -> None:
    local = LOCAL.model_copy(update={"reserved_cidrs": ["10.96.0.0/12"]})
    peer = CIDRPair(pod_cidr="10.96.0.0/16", external_cidr="10.200.0.0/24")
    got = plan.allocate(local, peer, [])
    assert got.pod_cidr == "10.64.0.0/16"


def test_allocate_uses_our_own_pools() -> None:
    local = LOCAL.model_copy(update={"pools": ["172.30.0.0/15"]})
    got = plan.allocate(local, SAME, [])
    assert got == CIDRPair(pod_cidr="172.30.0.0/16", external_cidr="172.31.0.0/16")


def test_allocate_raises_when_the_pools_are_full() -> None:
    local = LOCAL.model_copy(update={"pools": ["10.64.0.0/16"], "reserved_cidrs": ["10.64.0.0/16"]})
    with pytest.raises(PoolExhausted):
        plan.allocate(local, SAME, [])


_PREFIX = st.integers(min_value=16, max_value=26)
# Starts biased towards the interesting places: our ranges and the start of the pool.
_START = st.one_of(
    st.sampled_from([int(A(a)) for a in ("10.244.0.0", "10.70.0.0", "10.64.0.0", "10.65.0.0", "10.66.0.0")]),
    st.integers(min_value=int(A("10.0.0.0")), max_value=int(A("10.255.255.255"))),
)


def _aligned(start: int, prefixlen: int) -> IPv4Network:
    size = 1 << (32 - prefixlen)
    return N((start // size * size, prefixlen))


@st.composite
def _peer_pairs(draw: st.DrawFn) -> CIDRPair:
    """Two disjoint ranges in 10.0.0.0/8 (as a peer's NetworkConfig requires)."""
    pod = _aligned(draw(_START), draw(_PREFIX))
    ext = _aligned(draw(_START), draw(_PREFIX))
    assume(not ext.overlaps(pod))
    return CIDRPair(pod_cidr=str(pod), external_cidr=str(ext))


@settings(max_examples=200, deadline=None)
@given(peer=_peer_pairs(), first=_peer_pairs())
def test_allocations_never_collide_and_keep_sizes(peer: CIDRPair, first: CIDRPair) -> None:
    others = [_remote("peer-a", first, plan.allocate(LOCAL, first, []))]
    used = plan.in_use(LOCAL, others)
    got = plan.allocate(LOCAL, peer, others)
    pod, ext = _nets(got)
    real_pod, real_ext = _nets(peer)
    assert pod.prefixlen == real_pod.prefixlen and ext.prefixlen == real_ext.prefixlen
    assert not any(pod.overlaps(u) for u in used)
    assert not any(ext.overlaps(u) for u in used)
    assert not pod.overlaps(ext)
    # a range that collides with nothing is kept as it is
    if not any(real_pod.overlaps(u) for u in used):
        assert pod == real_pod
    if not any(real_ext.overlaps(u) for u in [*used, pod]):
        assert ext == real_ext


# ---- expose


def test_expose_hands_out_the_first_free_address_of_the_external_cidr() -> None:
    assert plan.expose(LOCAL, A("10.96.0.10")) == A("10.70.0.1")


def test_expose_is_idempotent_for_an_exposed_address() -> None:
    local = LOCAL.model_copy(update={"external_ips": [ExternalIP(address="10.96.0.10", external_address="10.70.0.7")]})
    assert plan.expose(local, A("10.96.0.10")) == A("10.70.0.7")


def test_expose_gives_a_second_address_the_next_free_one() -> None:
    local = LOCAL.model_copy(update={"external_ips": [ExternalIP(address="10.96.0.10", external_address="10.70.0.1")]})
    assert plan.expose(local, A("10.96.0.1")) == A("10.70.0.2")


def test_expose_fills_gaps_first() -> None:
    local = LOCAL.model_copy(
        update={
            "external_ips": [
                ExternalIP(address="10.96.0.10", external_address="10.70.0.1"),
                ExternalIP(address="10.96.0.11", external_address="10.70.0.3"),
            ]
        }
    )
    assert plan.expose(local, A("10.96.0.12")) == A("10.70.0.2")


def test_expose_raises_when_the_external_cidr_is_full() -> None:
    local = NetworkConfigSpec(
        pod_cidr="10.244.0.0/16",
        external_cidr="10.70.0.0/30",
        external_ips=[
            ExternalIP(address="10.96.0.10", external_address="10.70.0.1"),
            ExternalIP(address="10.96.0.11", external_address="10.70.0.2"),
        ],
    )
    with pytest.raises(PoolExhausted):
        plan.expose(local, A("10.96.0.12"))


# ---- remapper

# Both clusters use our defaults. We reach the peer's pods at 10.64.0.0/16 and its external CIDR at
# 10.65.0.0/16; the peer reaches our pods at 10.80.0.0/16 and our external CIDR at 10.81.0.0/16.
MAPPED = CIDRPair(pod_cidr="10.64.0.0/16", external_cidr="10.65.0.0/16")
PEER_VIEW = CIDRPair(pod_cidr="10.80.0.0/16", external_cidr="10.81.0.0/16")
REMOTE = _remote("peer-a", SAME, MAPPED, PEER_VIEW)


def test_remapper_shows_a_peer_pod_ip_in_the_mapped_range() -> None:
    r = plan.remapper(LOCAL, REMOTE)
    assert r.to_local_ip("10.244.1.2") == "10.64.1.2"
    assert r.to_local_ip("10.70.0.9") == "10.65.0.9"


def test_remapper_shows_our_pod_ip_as_the_peer_sees_it() -> None:
    r = plan.remapper(LOCAL, REMOTE)
    assert r.to_remote_ip("10.244.3.4") == "10.80.3.4"


def test_remapper_without_peer_view_passes_our_addresses_unchanged() -> None:
    r = plan.remapper(LOCAL, REMOTE.model_copy(update={"peer_view": None}))
    assert r.to_remote_ip("10.244.3.4") == "10.244.3.4"
    assert r.to_remote_ip("10.70.0.5") == "10.70.0.5"
    # the peer's side is still remapped
    assert r.to_local_ip("10.244.1.2") == "10.64.1.2"


def test_remapper_maps_an_exposed_address_through_the_external_cidr_and_the_peer_view() -> None:
    local = LOCAL.model_copy(update={"external_ips": [ExternalIP(address="10.96.0.10", external_address="10.70.0.5")]})
    r = plan.remapper(local, REMOTE)
    assert r.to_remote_ip("10.96.0.10") == "10.81.0.5"
    # without a peer view the peer reaches it at its address in our external CIDR
    r = plan.remapper(local, REMOTE.model_copy(update={"peer_view": None}))
    assert r.to_remote_ip("10.96.0.10") == "10.70.0.5"
    # an address that is not exposed is not translated
    assert plan.remapper(local, REMOTE).to_remote_ip("10.96.0.11") == "10.96.0.11"


# ---- gateway_plan


def test_gateway_plan_names_ranges_and_inverted_external_ips() -> None:
    local = LOCAL.model_copy(
        update={
            "external_ips": [
                ExternalIP(address="10.96.0.10", external_address="10.70.0.5"),
                ExternalIP(address="10.96.0.1", external_address="10.70.0.6"),
            ]
        }
    )
    gp = plan.gateway_plan(local, REMOTE, masquerade=True)
    assert gp.interface == interface_name("peer-a")
    assert gp.table == table_name("peer-a")
    assert gp.mark == mark_for("peer-a")
    assert gp.local_pod == N("10.244.0.0/16")
    assert gp.peer_pod == RangeMap(N("10.244.0.0/16"), N("10.64.0.0/16"))
    assert gp.peer_external == RangeMap(N("10.70.0.0/16"), N("10.65.0.0/16"))
    # external -> real: the gateway DNATs our external-CIDR address to the real one on the way in
    assert dict(gp.external_ips) == {A("10.70.0.5"): A("10.96.0.10"), A("10.70.0.6"): A("10.96.0.1")}
    assert gp.masquerade is True
    assert plan.gateway_plan(local, REMOTE, masquerade=False).masquerade is False


def test_gateway_plan_filters_with_our_own_objects_and_the_tunnel_addresses() -> None:
    local = LOCAL.model_copy(update={"external_ips": [ExternalIP(address="10.96.0.10", external_address="10.70.0.5")]})
    gp = plan.gateway_plan(local, REMOTE, masquerade=False, tunnel=(A("169.254.64.2"), A("169.254.64.1")))
    assert (gp.tunnel_address, gp.peer_tunnel_address) == (A("169.254.64.2"), A("169.254.64.1"))
    sets = filter_sets(gp)
    # from the peer: its real pod range, to our pod range and what we exposed (never its own claims)
    assert sets["peer_pods"] == [N("10.244.0.0/16")]
    assert sets["local_reachable"] == [N("10.96.0.10/32"), N("10.244.0.0/16")]
    assert sets["peer_reachable"] == [N("10.70.0.0/16"), N("10.244.0.0/16")]
    unknown = plan.gateway_plan(local, REMOTE, masquerade=False)
    assert unknown.tunnel_address is None and unknown.peer_tunnel_address is None


def test_gateway_plan_members_are_our_pods_and_the_peers_pods_turned_back_into_real_addresses() -> None:
    gp = plan.gateway_plan(
        LOCAL,
        REMOTE,
        masquerade=False,
        local_members=[A("10.244.0.7"), A("10.99.0.1")],  # the second is no pod of ours: left out
        # the peer's pods as we see them (10.64/16 stands for its 10.244/16); 10.244.1.1 is not
        # in the remapped range, so it is no pod of the peer's as we see it: left out
        peer_members_mapped=[A("10.64.3.9"), A("10.244.1.1")],
    )
    assert gp.local_members == frozenset({A("10.244.0.7")})
    assert gp.peer_members == frozenset({A("10.244.3.9")})
    sets = filter_sets(gp)
    assert sets["peer_pods"] == [N("10.244.3.9/32")]
    assert sets["local_pods"] == [N("10.244.0.7/32")]
    whole = plan.gateway_plan(LOCAL, REMOTE, masquerade=False)
    assert whole.local_members is None and whole.peer_members is None


def test_gateway_plan_names_follow_the_remote_cluster_id() -> None:
    a = plan.gateway_plan(LOCAL, REMOTE, masquerade=False)
    b = plan.gateway_plan(LOCAL, REMOTE.model_copy(update={"cluster_id": "peer-b"}), masquerade=False)
    assert (a.interface, a.table, a.mark) != (b.interface, b.table, b.mark)


# ---- tunnel_addresses

BLOCK = N("169.254.64.0/18")


def _check_pair(server: IPv4Address, client: IPv4Address) -> None:
    assert server in BLOCK and client in BLOCK
    assert int(server) % 4 == 1 and int(client) == int(server) + 1
    net = N((int(server) - 1, 30))
    assert server in net and client in net and net.subnet_of(BLOCK)


def test_tunnel_addresses_are_deterministic_and_an_aligned_pair() -> None:
    server, client = plan.tunnel_addresses("consumer-12345678", "gpu-a-12345678")
    assert (server, client) == plan.tunnel_addresses("consumer-12345678", "gpu-a-12345678")
    assert server != client
    _check_pair(server, client)
    assert plan.TUNNEL_BLOCK == BLOCK


def test_tunnel_addresses_differ_between_pairs() -> None:
    ids = ["consumer-12345678", "gpu-a-12345678", "gpu-b-87654321", "cluster-deadbeef", "edge-0000abcd"]
    pairs = [plan.tunnel_addresses(c, p) for c, p in itertools.permutations(ids, 2)]
    blocks = {N((int(s) - 1, 30)) for s, _ in pairs}
    assert len(blocks) == len(pairs)


@settings(max_examples=200, deadline=None)
@given(consumer=st.text(min_size=1, max_size=30), provider=st.text(min_size=1, max_size=30))
def test_tunnel_addresses_always_inside_the_block(consumer: str, provider: str) -> None:
    _check_pair(*plan.tunnel_addresses(consumer, provider))
