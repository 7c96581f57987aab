"""Control-plane address translation: both directions, pass-through, the IPTranslator Protocol."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from netfabric.ipam import RangeMap
from netfabric.remap import Remapper
from vkprovider.remote.translate import IPTranslator

N = IPv4Network
A = IPv4Address

# Both clusters use 10.244.0.0/16 for pods. We see the peer's pods as 10.64.0.0/16 and its external
# CIDR 10.200.0.0/24 as 10.65.0.0/24; the peer sees our pods as 10.70.0.0/16 and our external CIDR
# 10.201.0.0/24 as 10.71.0.0/24. Our Service ClusterIP 10.96.0.10 has 10.201.0.5 in our external CIDR.
PEER_POD = RangeMap(N("10.244.0.0/16"), N("10.64.0.0/16"))
PEER_EXT = RangeMap(N("10.200.0.0/24"), N("10.65.0.0/24"))
LOCAL_POD = RangeMap(N("10.244.0.0/16"), N("10.70.0.0/16"))
LOCAL_EXT = RangeMap(N("10.201.0.0/24"), N("10.71.0.0/24"))
CLUSTER_IP = A("10.96.0.10")
R = Remapper(
    peer_pod=PEER_POD,
    peer_external=PEER_EXT,
    local_pod=LOCAL_POD,
    local_external=LOCAL_EXT,
    external_ips={CLUSTER_IP: A("10.201.0.5")},
)


def test_satisfies_the_translator_protocol() -> None:
    translator: IPTranslator = R  # mypy checks the Protocol structurally
    assert translator.to_local_ip("10.244.1.2") == "10.64.1.2"


# ---------------------------------------------------------------- to_local_ip


def test_peer_pod_ip_is_shown_as_its_remapped_twin() -> None:
    assert R.to_local_ip("10.244.1.2") == "10.64.1.2"
    assert R.to_local_ip("10.244.255.255") == "10.64.255.255"


def test_peer_external_ip_is_shown_remapped() -> None:
    assert R.to_local_ip("10.200.0.7") == "10.65.0.7"


def test_to_local_passes_other_addresses_through() -> None:
    # Outside the peer's ranges, including a remapped address and our own external CIDR.
    for ip in ["10.96.0.10", "10.64.1.2", "10.201.0.5", "8.8.8.8", "10.245.0.1"]:
        assert R.to_local_ip(ip) == ip


def test_to_local_without_peer_external() -> None:
    r = dataclasses.replace(R, peer_external=None)
    assert r.to_local_ip("10.200.0.7") == "10.200.0.7"
    assert r.to_local_ip("10.244.0.1") == "10.64.0.1"


# ---------------------------------------------------------------- to_remote_ip


def test_our_pod_ip_is_shown_as_the_peer_sees_it() -> None:
    assert R.to_remote_ip("10.244.1.2") == "10.70.1.2"


def test_our_non_pod_address_goes_through_its_external_address() -> None:
    # 10.96.0.10 -> 10.201.0.5 (our external CIDR) -> 10.71.0.5 (as the peer sees our external CIDR).
    assert R.to_remote_ip(str(CLUSTER_IP)) == "10.71.0.5"


def test_address_already_in_our_external_cidr_is_remapped() -> None:
    assert R.to_remote_ip("10.201.0.9") == "10.71.0.9"


def test_without_local_external_the_external_address_is_used_as_it_is() -> None:
    r = dataclasses.replace(R, local_external=None)
    assert r.to_remote_ip(str(CLUSTER_IP)) == "10.201.0.5"
    assert r.to_remote_ip("10.201.0.9") == "10.201.0.9"


def test_to_remote_passes_other_addresses_through() -> None:
    for ip in ["10.96.0.11", "8.8.8.8", "10.70.1.2", "10.200.0.7"]:
        assert R.to_remote_ip(ip) == ip


def test_identity_remapper_changes_nothing() -> None:
    pod = RangeMap(N("10.244.0.0/16"), N("10.244.0.0/16"))
    peer = RangeMap(N("10.245.0.0/16"), N("10.245.0.0/16"))
    r = Remapper(peer_pod=peer, peer_external=None, local_pod=pod, local_external=None)
    assert r.external_ips == {}
    for ip in ["10.244.1.2", "10.245.1.2", "1.2.3.4"]:
        assert r.to_local_ip(ip) == ip
        assert r.to_remote_ip(ip) == ip


# ---------------------------------------------------------------- not IPv4


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        "10.244.1",
        "10.244.1.2.3",
        "10.244.1.256",
        "010.244.1.2",
        " 10.244.1.2",
        "10.244.1.2/32",
        "fd00::1",
        "::ffff:10.244.1.2",
        "2001:db8::10.244.1.2",
    ],
)
def test_non_ipv4_and_garbage_pass_through(value: str) -> None:
    assert R.to_local_ip(value) == value
    assert R.to_remote_ip(value) == value


# ---------------------------------------------------------------- validation and immutability


def test_external_address_outside_our_external_cidr_is_refused() -> None:
    with pytest.raises(ValueError, match=r"10\.202\.0\.1.*10\.201\.0\.0/24"):
        Remapper(
            peer_pod=PEER_POD,
            peer_external=None,
            local_pod=LOCAL_POD,
            local_external=LOCAL_EXT,
            external_ips={CLUSTER_IP: A("10.202.0.1")},
        )


def test_external_ips_are_copied() -> None:
    table = {CLUSTER_IP: A("10.201.0.5")}
    r = Remapper(peer_pod=PEER_POD, peer_external=None, local_pod=LOCAL_POD, local_external=None, external_ips=table)
    table[CLUSTER_IP] = A("10.201.0.6")
    assert r.to_remote_ip(str(CLUSTER_IP)) == "10.201.0.5"
    assert hash(r) == hash(dataclasses.replace(r))


# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(min_value=0, max_value=2**16 - 1))
def test_peer_pod_round_trip(offset: int) -> None:
    real = A(int(PEER_POD.real.network_address) + offset)
    shown = A(R.to_local_ip(str(real)))
    assert shown in PEER_POD.mapped
    assert PEER_POD.to_real(shown) == real


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_to_local_changes_only_peer_addresses(value: int) -> None:
    ip = A(value)
    out = R.to_local_ip(str(ip))
    if ip in PEER_POD.real or ip in PEER_EXT.real:
        assert out != str(ip)
        assert A(out) in PEER_POD.mapped or A(out) in PEER_EXT.mapped
    else:
        assert out == str(ip)


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
@example(int(A("10.64.0.0")))
@example(int(A("10.65.0.7")))
def test_to_remote_changes_only_our_addresses(value: int) -> None:
    ip = A(value)
    out = R.to_remote_ip(str(ip))
    if ip in LOCAL_POD.real:
        assert LOCAL_POD.to_real(A(out)) == ip
    elif ip in LOCAL_EXT.real or ip == CLUSTER_IP:
        assert A(out) in LOCAL_EXT.mapped
    elif ip in PEER_POD.mapped:  # the peer's own address as we see it: its real address there
        assert A(out) == PEER_POD.to_real(ip)
    elif ip in PEER_EXT.mapped:
        assert A(out) == PEER_EXT.to_real(ip)
    else:
        assert out == str(ip)


def test_each_side_view_of_the_other_goes_back_to_the_real_address() -> None:
    # a reflected endpoint that is an offloaded pod, as WE see it -> the peer's own address for it
    assert R.to_remote_ip("10.64.3.4") == "10.244.3.4"
    assert R.to_remote_ip("10.65.0.9") == "10.200.0.9"
    # one of our pods as the PEER reports it -> our real address
    assert R.to_local_ip("10.70.1.10") == "10.244.1.10"
    assert R.to_local_ip("10.71.0.5") == "10.201.0.5"
    # round trips through both views
    for ip in ("10.244.7.7", "10.201.0.3"):
        assert R.to_local_ip(R.to_remote_ip(ip)) == ip
    assert R.to_remote_ip(R.to_local_ip("10.244.9.9")) == "10.244.9.9"
