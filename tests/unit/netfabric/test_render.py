"""Gateway data-plane renderers: nftables ruleset, WireGuard UAPI message, allowed IPs, names."""

from __future__ import annotations

import dataclasses
import re
from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netfabric.ipam import RangeMap
from netfabric.render import (
    DROP_COUNTERS,
    FILTER_CHAINS,
    MAX_INTERFACE,
    GatewayPlan,
    RenderError,
    allowed_ips,
    filter_sets,
    interface_name,
    mark_for,
    nft_ruleset,
    nft_sets,
    nft_update,
    table_name,
    uapi_set,
)

N = IPv4Network
A = IPv4Address

# Both clusters use 10.244.0.0/16 for pods; we see the peer's pods as 10.64.0.0/16 and its external
# CIDR 10.200.0.0/24 as 10.65.0.0/24. Our external CIDR is 10.201.0.0/24: 10.201.0.5 stands for our
# kube-dns ClusterIP, 10.201.0.6 for a local pod.
PLAN = GatewayPlan(
    interface="gf-0123456789ab",
    table="gpufed_test",
    mark=0x1234,
    local_pod=N("10.244.0.0/16"),
    peer_pod=RangeMap(N("10.244.0.0/16"), N("10.64.0.0/16")),
    peer_external=RangeMap(N("10.200.0.0/24"), N("10.65.0.0/24")),
    # Deliberately not in address order: the output must sort them.
    external_ips={A("10.201.0.6"): A("10.244.3.4"), A("10.201.0.5"): A("10.96.0.10")},
    masquerade=False,
)

GOLDEN = """\
table ip gpufed_test
delete table ip gpufed_test
table ip gpufed_test {
\tcounter dropped_from_peer {
\t}
\tcounter dropped_to_peer {
\t}
\tset peer_pods {
\t\ttype ipv4_addr; flags interval;
\t}
\tset peer_reachable {
\t\ttype ipv4_addr; flags interval;
\t}
\tset local_pods {
\t\ttype ipv4_addr; flags interval;
\t}
\tset local_reachable {
\t\ttype ipv4_addr; flags interval;
\t}
\tchain marks {
\t\ttype filter hook prerouting priority mangle; policy accept;
\t}
\tchain prenat {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t}
\tchain postnat {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t}
\tchain filter_forward {
\t\ttype filter hook forward priority filter; policy accept;
\t}
\tchain filter_input {
\t\ttype filter hook input priority filter; policy accept;
\t}
\tchain from_peer {
\t}
\tchain to_peer {
\t}
}
flush chain ip gpufed_test marks
flush chain ip gpufed_test prenat
flush chain ip gpufed_test postnat
flush chain ip gpufed_test filter_forward
flush chain ip gpufed_test filter_input
flush chain ip gpufed_test from_peer
flush chain ip gpufed_test to_peer
flush set ip gpufed_test peer_pods
flush set ip gpufed_test peer_reachable
flush set ip gpufed_test local_pods
flush set ip gpufed_test local_reachable
add element ip gpufed_test peer_pods { 10.244.0.0/16 }
add element ip gpufed_test peer_reachable { 10.200.0.0/24, 10.244.0.0/16 }
add element ip gpufed_test local_pods { 10.244.0.0/16 }
add element ip gpufed_test local_reachable { 10.96.0.10/32, 10.244.0.0/16 }
table ip gpufed_test {
\tchain marks {
\t\tiifname "gf-0123456789ab" ct mark set 0x00001234
\t\tiifname != "gf-0123456789ab" ip daddr { 10.64.0.0/16, 10.65.0.0/24 } ct mark set 0x00001234
\t\tiifname != "gf-0123456789ab" ct mark 0x00001234 meta mark set 0x00001234
\t}
\tchain prenat {
\t\tiifname != "gf-0123456789ab" ip daddr 10.64.0.0/16 dnat ip to ip daddr & 0.0.255.255 | 10.244.0.0
\t\tiifname != "gf-0123456789ab" ip daddr 10.65.0.0/24 dnat ip to ip daddr & 0.0.0.255 | 10.200.0.0
\t\tiifname "gf-0123456789ab" ip daddr 10.201.0.5 dnat ip to 10.96.0.10
\t\tiifname "gf-0123456789ab" ip daddr 10.201.0.6 dnat ip to 10.244.3.4
\t}
\tchain postnat {
\t\tiifname "gf-0123456789ab" ip saddr 10.244.0.0/16 snat ip to ip saddr & 0.0.255.255 | 10.64.0.0
\t\tiifname "gf-0123456789ab" ip saddr 10.200.0.0/24 snat ip to ip saddr & 0.0.0.255 | 10.65.0.0
\t}
\tchain filter_forward {
\t\tiifname "gf-0123456789ab" jump from_peer
\t\toifname "gf-0123456789ab" jump to_peer
\t}
\tchain filter_input {
\t\tiifname "gf-0123456789ab" ct state established,related accept
\t\tiifname "gf-0123456789ab" icmp type echo-request accept
\t\tiifname "gf-0123456789ab" counter name "dropped_from_peer" drop
\t}
\tchain from_peer {
\t\tct state established,related accept
\t\tip saddr @peer_pods ip daddr @local_reachable accept
\t\tcounter name "dropped_from_peer" drop
\t}
\tchain to_peer {
\t\tct state established,related accept
\t\tip saddr @local_pods ip daddr @peer_reachable accept
\t\tcounter name "dropped_to_peer" drop
\t}
}
"""


def chain(ruleset: str, name: str) -> list[str]:
    """The rule lines of one chain (without its hook line), wherever the text declares and fills it."""
    blocks = re.findall(rf"\tchain {name} {{\n(.*?)\t}}", ruleset, re.DOTALL)
    assert blocks, f"no chain {name}"
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("type ")]


# ---------------------------------------------------------------- nft_ruleset


def test_golden_ruleset() -> None:
    assert nft_ruleset(PLAN) == GOLDEN


def test_ruleset_replaces_only_our_table() -> None:
    lines = nft_ruleset(PLAN).splitlines()
    assert lines[:3] == ["table ip gpufed_test", "delete table ip gpufed_test", "table ip gpufed_test {"]
    heads = [line for line in lines if not line.startswith("\t") and line != "}"]
    assert all(" ip gpufed_test" in line for line in heads)
    assert heads[:2] == ["table ip gpufed_test", "delete table ip gpufed_test"]
    assert not [line for line in heads[2:] if line.startswith("delete")]
    # Chain names must not be nft keywords.
    assert list(dict.fromkeys(re.findall(r"\tchain (\w+)", nft_ruleset(PLAN)))) == [
        "marks",
        "prenat",
        "postnat",
        *FILTER_CHAINS,
        "from_peer",
        "to_peer",
    ]


def test_the_update_is_the_replacement_without_the_delete() -> None:
    assert nft_ruleset(PLAN) == "table ip gpufed_test\ndelete table ip gpufed_test\n" + nft_update(PLAN)
    update = nft_update(PLAN)
    assert "delete" not in update
    # every chain and set is emptied before it is filled, so a re-apply never duplicates a rule
    for name in ["marks", "prenat", "postnat", *FILTER_CHAINS, "from_peer", "to_peer"]:
        flush = update.index(f"flush chain ip gpufed_test {name}\n")
        assert flush < update.rindex(f"\tchain {name} {{") or not chain(update, name)
    for name in filter_sets(PLAN):
        assert update.index(f"flush set ip gpufed_test {name}\n") < update.index(f"add element ip gpufed_test {name} ")
    # the counters are declared, never reset
    assert "reset" not in update and update.count("counter dropped_from_peer {") == 1


def test_ruleset_is_deterministic() -> None:
    reordered = dataclasses.replace(PLAN, external_ips=dict(reversed(list(PLAN.external_ips.items()))))
    assert nft_ruleset(reordered) == nft_ruleset(PLAN) == GOLDEN


def test_external_ips_are_sorted_by_address_not_text() -> None:
    plan = dataclasses.replace(
        PLAN,
        external_ips={
            A("10.201.0.10"): A("10.96.0.2"),
            A("10.201.0.9"): A("10.96.0.1"),
            A("10.201.0.100"): A("10.96.0.3"),
        },
    )
    dnats = [rule for rule in chain(nft_ruleset(plan), "prenat") if rule.startswith('iifname "')]
    assert [rule.split()[4] for rule in dnats] == ["10.201.0.9", "10.201.0.10", "10.201.0.100"]


def test_identity_mapping_leaves_out_nat_but_keeps_marks() -> None:
    plan = GatewayPlan(
        interface="wg0",
        table="t",
        mark=0xABCDEF,
        local_pod=N("10.244.0.0/16"),
        peer_pod=RangeMap(N("10.245.0.0/16"), N("10.245.0.0/16")),
        peer_external=None,
        external_ips={},
        masquerade=False,
    )
    ruleset = nft_ruleset(plan)
    assert chain(ruleset, "marks") == [
        'iifname "wg0" ct mark set 0x00abcdef',
        'iifname != "wg0" ip daddr { 10.245.0.0/16 } ct mark set 0x00abcdef',
        'iifname != "wg0" ct mark 0x00abcdef meta mark set 0x00abcdef',
    ]
    assert chain(ruleset, "prenat") == []
    assert chain(ruleset, "postnat") == []
    assert "nat" in ruleset and "dnat" not in ruleset and "snat" not in ruleset


def test_only_the_non_identity_range_is_translated() -> None:
    plan = dataclasses.replace(PLAN, peer_external=RangeMap(N("10.200.0.0/24"), N("10.200.0.0/24")), external_ips={})
    ruleset = nft_ruleset(plan)
    assert "10.200.0.0/24" in chain(ruleset, "marks")[1]
    assert chain(ruleset, "prenat") == [
        'iifname != "gf-0123456789ab" ip daddr 10.64.0.0/16 dnat ip to ip daddr & 0.0.255.255 | 10.244.0.0'
    ]
    assert chain(ruleset, "postnat") == [
        'iifname "gf-0123456789ab" ip saddr 10.244.0.0/16 snat ip to ip saddr & 0.0.255.255 | 10.64.0.0'
    ]


def test_masquerade_replaces_the_snat_mirror() -> None:
    ruleset = nft_ruleset(dataclasses.replace(PLAN, masquerade=True))
    assert chain(ruleset, "postnat") == ['iifname "gf-0123456789ab" oifname != "gf-0123456789ab" masquerade']
    assert "snat" not in ruleset
    # The way out, the inbound DNAT and the tunnel filter are unchanged (the filter runs before the
    # masquerade, on the peer's real source).
    for name in ("prenat", "marks", *FILTER_CHAINS, "from_peer", "to_peer"):
        assert chain(ruleset, name) == chain(GOLDEN, name)
    assert filter_sets(dataclasses.replace(PLAN, masquerade=True)) == filter_sets(PLAN)


# ---------------------------------------------------------------- the tunnel filter


def test_filter_sets_are_our_pods_and_exposed_addresses_and_the_peers_real_ranges() -> None:
    assert filter_sets(PLAN) == {
        "peer_pods": [N("10.244.0.0/16")],
        "peer_reachable": [N("10.200.0.0/24"), N("10.244.0.0/16")],
        "local_pods": [N("10.244.0.0/16")],
        # 10.244.3.4 (exposed, a local pod) is inside the pod range: the set keeps the fewest prefixes
        "local_reachable": [N("10.96.0.10/32"), N("10.244.0.0/16")],
    }
    assert filter_sets(dataclasses.replace(PLAN, peer_external=None))["peer_reachable"] == [N("10.244.0.0/16")]
    assert filter_sets(dataclasses.replace(PLAN, external_ips={}))["local_reachable"] == [N("10.244.0.0/16")]


def test_traffic_from_the_peer_is_accepted_only_between_the_allowed_sets_and_the_rest_is_counted_and_dropped() -> None:
    assert chain(GOLDEN, "filter_forward") == [
        'iifname "gf-0123456789ab" jump from_peer',
        'oifname "gf-0123456789ab" jump to_peer',
    ]
    assert chain(GOLDEN, "from_peer") == [
        "ct state established,related accept",
        "ip saddr @peer_pods ip daddr @local_reachable accept",
        'counter name "dropped_from_peer" drop',
    ]
    assert chain(GOLDEN, "to_peer") == [
        "ct state established,related accept",
        "ip saddr @local_pods ip daddr @peer_reachable accept",
        'counter name "dropped_to_peer" drop',
    ]
    for name in DROP_COUNTERS:
        assert f"\tcounter {name} {{" in GOLDEN


def test_the_filter_hooks_leave_traffic_that_is_not_the_tunnels_alone() -> None:
    # a gateway on a node's network forwards the node's other traffic too: only the tunnel's is judged
    for name in FILTER_CHAINS:
        hook = re.search(rf"\tchain {name} {{\n\t\t(type [^\n]*)", GOLDEN)
        assert hook is not None and hook.group(1).endswith("policy accept;")
        assert all(
            rule.startswith(('iifname "gf-0123456789ab" ', 'oifname "gf-0123456789ab" '))
            for rule in chain(GOLDEN, name)
        )
    assert "hook forward priority filter" in GOLDEN and "hook input priority filter" in GOLDEN


def test_only_the_peers_probe_reaches_the_gateway_itself() -> None:
    plan = dataclasses.replace(PLAN, tunnel_address=A("169.254.64.2"), peer_tunnel_address=A("169.254.64.1"))
    assert chain(nft_ruleset(plan), "filter_input") == [
        'iifname "gf-0123456789ab" ct state established,related accept',
        'iifname "gf-0123456789ab" ip saddr 169.254.64.1 ip daddr 169.254.64.2 icmp type echo-request accept',
        'iifname "gf-0123456789ab" counter name "dropped_from_peer" drop',
    ]
    # without the tunnel addresses the probe is still answered, on any of the gateway's addresses
    assert chain(GOLDEN, "filter_input")[1] == 'iifname "gf-0123456789ab" icmp type echo-request accept'


def test_the_filter_is_there_with_identity_mappings_too() -> None:
    plan = dataclasses.replace(
        PLAN, peer_pod=RangeMap(N("10.245.0.0/16"), N("10.245.0.0/16")), peer_external=None, external_ips={}
    )
    ruleset = nft_ruleset(plan)
    assert chain(ruleset, "from_peer")[-1] == 'counter name "dropped_from_peer" drop'
    assert "add element ip gpufed_test peer_pods { 10.245.0.0/16 }" in ruleset
    assert "add element ip gpufed_test local_reachable { 10.244.0.0/16 }" in ruleset


_octet = st.integers(0, 255)
_address = st.builds(lambda a, b, c, d: A(f"{a}.{b}.{c}.{d}"), _octet, _octet, _octet, _octet)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_address, max_size=6), _address)
def test_a_destination_from_the_peer_is_allowed_only_in_our_pod_range_or_exposed(
    exposed: list[IPv4Address], probe: IPv4Address
) -> None:
    """Whatever is exposed, the API server, node and metadata addresses stay out unless exposed."""
    ext = {A(int(A("10.201.0.1")) + i): real for i, real in enumerate(exposed)}
    sets = filter_sets(dataclasses.replace(PLAN, external_ips=ext))
    allowed = any(probe in net for net in sets["local_reachable"])
    assert allowed == (probe in N("10.244.0.0/16") or probe in exposed)
    assert sets["peer_pods"] == [N("10.244.0.0/16")]
    for outside in (A("169.254.169.254"), A("10.96.0.1"), A("192.168.77.10")):
        if outside not in exposed:
            assert not any(outside in net for net in sets["local_reachable"])


def test_uapi_set_updates_a_known_peer_in_place_and_removes_the_others() -> None:
    other = "c2" * 32
    text = uapi_set(PRIVATE, None, PUBLIC, None, None, [N("10.99.0.2/32")], current_peers=[other.upper(), "b1" * 32])
    assert text == (
        f"set=1\nprivate_key={PRIVATE}\npublic_key={other}\nremove=true\npublic_key={'b1' * 32}\n"
        "replace_allowed_ips=true\nallowed_ip=10.99.0.2/32\n\n"
    )
    assert "replace_peers" not in uapi_set(PRIVATE, None, PUBLIC, None, None, [], current_peers=[])


@pytest.mark.parametrize("name", ["", "a" * 16, "wg 0", "wg/0", "wg0\n", 'wg"0', ".", "..", "wg:0", "wgö"])
def test_invalid_interface_name_is_refused(name: str) -> None:
    with pytest.raises(RenderError, match="interface"):
        dataclasses.replace(PLAN, interface=name)


@pytest.mark.parametrize("name", ["a" * 15, "wg0", "gf-a.b_c", "x"])
def test_valid_interface_names(name: str) -> None:
    assert dataclasses.replace(PLAN, interface=name).interface == name


@pytest.mark.parametrize("name", ["", "my-table", "0table", "t t", "t;flush ruleset", 't"', "a" * 256])
def test_invalid_table_name_is_refused(name: str) -> None:
    with pytest.raises(RenderError, match="table"):
        dataclasses.replace(PLAN, table=name)


@pytest.mark.parametrize("mark", [0, -1, 0x100000000])
def test_invalid_mark_is_refused(mark: int) -> None:
    with pytest.raises(RenderError, match="mark"):
        dataclasses.replace(PLAN, mark=mark)


def test_peer_range_overlapping_our_pods_is_refused() -> None:
    with pytest.raises(RenderError, match="overlaps our pod CIDR"):
        dataclasses.replace(PLAN, peer_pod=RangeMap(N("10.244.0.0/16"), N("10.244.0.0/16")))
    with pytest.raises(RenderError, match="overlaps our pod CIDR"):
        dataclasses.replace(PLAN, peer_external=RangeMap(N("10.200.0.0/24"), N("10.244.9.0/24")))
    with pytest.raises(RenderError, match="overlaps its pod range"):
        dataclasses.replace(PLAN, peer_external=RangeMap(N("10.200.0.0/24"), N("10.64.9.0/24")))


def test_plan_keeps_its_own_copy_of_external_ips() -> None:
    table = {A("10.201.0.5"): A("10.96.0.10")}
    plan = dataclasses.replace(PLAN, external_ips=table)
    table[A("10.201.0.7")] = A("10.96.0.11")
    assert "10.201.0.7" not in nft_ruleset(plan)


# ---------------------------------------------------------------- uapi_set

PRIVATE = "a0" * 32
PUBLIC = "B1" * 32


def test_uapi_set_exact_text() -> None:
    text = uapi_set(PRIVATE, 51820, PUBLIC, ("192.0.2.7", 51821), 25, [N("10.244.0.0/16"), N("10.99.0.2/32")])
    assert text == (
        f"set=1\nprivate_key={PRIVATE}\nlisten_port=51820\nreplace_peers=true\npublic_key={'b1' * 32}\n"
        "endpoint=192.0.2.7:51821\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\n"
        "allowed_ip=10.244.0.0/16\nallowed_ip=10.99.0.2/32\n\n"
    )


def test_uapi_set_leaves_out_what_is_not_given() -> None:
    text = uapi_set(PRIVATE, None, PUBLIC, None, None, [])
    assert (
        text
        == f"set=1\nprivate_key={PRIVATE}\nreplace_peers=true\npublic_key={'b1' * 32}\nreplace_allowed_ips=true\n\n"
    )


@pytest.mark.parametrize(
    "bad", ["a0" * 31, "a0" * 33, "g0" * 32, "a0" * 31 + "a ", "", "YWJj" * 11, "a0" * 32 + "\n", "a0" * 32 + "\nset=1"]
)
def test_invalid_private_key_is_refused_without_echoing_it(bad: str) -> None:
    with pytest.raises(RenderError, match="private key") as exc:
        uapi_set(bad, None, PUBLIC, None, None, [])
    if bad:
        assert bad not in str(exc.value)
        assert bad[:16] not in str(exc.value)


def test_invalid_public_key_is_refused() -> None:
    with pytest.raises(RenderError, match="public key"):
        uapi_set(PRIVATE, None, "xyz", None, None, [])


@pytest.mark.parametrize(
    ("listen_port", "endpoint", "keepalive"),
    [
        (70000, None, None),
        (-1, None, None),
        (None, ("example.com", 51820), None),
        (None, ("fd00::1", 51820), None),
        (None, ("192.0.2.7", 0), None),
        (None, ("192.0.2.7", 65536), None),
        (None, None, -1),
        (None, None, 65536),
    ],
)
def test_invalid_ports_and_endpoints_are_refused_without_the_key(
    listen_port: int | None, endpoint: tuple[str, int] | None, keepalive: int | None
) -> None:
    with pytest.raises(RenderError) as exc:
        uapi_set(PRIVATE, listen_port, PUBLIC, endpoint, keepalive, [])
    assert PRIVATE not in str(exc.value)


def test_public_key_with_a_newline_cannot_inject_uapi_lines() -> None:
    with pytest.raises(RenderError):
        uapi_set(PRIVATE, None, PUBLIC + "\nremove=true", None, None, [])


# ---------------------------------------------------------------- allowed_ips


def test_allowed_ips_are_the_peers_real_ranges() -> None:
    assert allowed_ips(PLAN, A("10.99.0.2")) == [N("10.244.0.0/16"), N("10.200.0.0/24"), N("10.99.0.2/32")]
    assert allowed_ips(dataclasses.replace(PLAN, peer_external=None), A("10.99.0.2")) == [
        N("10.244.0.0/16"),
        N("10.99.0.2/32"),
    ]


# ---------------------------------------------------------------- names


def test_names_are_deterministic_and_distinct() -> None:
    assert interface_name("gpu-a-3f2c91d0") == interface_name("gpu-a-3f2c91d0")
    assert interface_name("gpu-a-3f2c91d0") != interface_name("gpu-b-3f2c91d0")
    assert table_name("gpu-a-3f2c91d0") != table_name("gpu-b-3f2c91d0")
    assert mark_for("gpu-a-3f2c91d0") != mark_for("gpu-b-3f2c91d0")
    # sha256("gpu-a") = 6f44fc55214a548d...: pinned so a change of scheme (which would rename live
    # interfaces and tables) is noticed.
    assert interface_name("gpu-a") == "gf-6f44fc55214a"
    assert table_name("gpu-a") == "gpufed_6f44fc55214a548d"
    assert mark_for("gpu-a") == 0x28E148D


def test_empty_cluster_id_is_refused() -> None:
    for fn in (interface_name, table_name, mark_for):
        with pytest.raises(RenderError, match="empty"):
            fn("")


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(min_size=1, max_size=80))
def test_names_fit_their_limits(cluster_id: str) -> None:
    iface, table, mark = interface_name(cluster_id), table_name(cluster_id), mark_for(cluster_id)
    assert len(iface) <= MAX_INTERFACE
    assert re.fullmatch(r"gf-[0-9a-f]{12}", iface)
    assert re.fullmatch(r"gpufed_[0-9a-f]{16}", table)
    assert 0x1000 <= mark <= 0xFFFFFFF
    assert mark & 0xC000 == 0  # kube-proxy's masquerade and drop bits
    # Every derived name is accepted by the plan.
    plan = dataclasses.replace(PLAN, interface=iface, table=table, mark=mark)
    assert f"ct mark set 0x{mark:08x}" in nft_ruleset(plan)


def test_names_do_not_collide_over_many_ids() -> None:
    ids = [f"cluster-{i}" for i in range(5000)]
    assert len({interface_name(i) for i in ids}) == len(ids)
    assert len({table_name(i) for i in ids}) == len(ids)
    assert len({mark_for(i) for i in ids}) == len(ids)


# ---------------------------------------------------------------- member pods


def test_filter_sets_name_only_the_member_pods_when_the_plan_names_them() -> None:
    members = dataclasses.replace(
        PLAN,
        local_members=frozenset({A("10.244.0.6"), A("10.244.0.7"), A("10.244.9.1")}),
        peer_members=frozenset({A("10.244.5.5")}),
    )
    assert filter_sets(members) == {
        "peer_pods": [N("10.244.5.5/32")],
        "peer_reachable": [N("10.200.0.0/24"), N("10.244.5.5/32")],
        "local_pods": [N("10.244.0.6/31"), N("10.244.9.1/32")],
        # the exposed addresses stay reachable whether or not they are members
        "local_reachable": [N("10.96.0.10/32"), N("10.244.0.6/31"), N("10.244.3.4/32"), N("10.244.9.1/32")],
    }


def test_no_member_pods_leave_their_sets_empty_and_the_ruleset_valid() -> None:
    empty = dataclasses.replace(PLAN, local_members=frozenset(), peer_members=frozenset())
    sets = filter_sets(empty)
    assert sets["peer_pods"] == [] and sets["local_pods"] == []
    assert sets["peer_reachable"] == [N("10.200.0.0/24")]
    text = nft_update(empty)
    # nft refuses `add element ... { }`: an empty set is flushed and not filled
    assert "flush set ip gpufed_test peer_pods" in text
    assert "add element ip gpufed_test peer_pods" not in text
    assert "{  }" not in text


def test_nft_sets_refills_only_the_sets_in_one_transaction() -> None:
    members = dataclasses.replace(PLAN, peer_members=frozenset({A("10.244.5.5")}))
    text = nft_sets(members)
    assert text.splitlines() == [
        "flush set ip gpufed_test peer_pods",
        "flush set ip gpufed_test peer_reachable",
        "flush set ip gpufed_test local_pods",
        "flush set ip gpufed_test local_reachable",
        "add element ip gpufed_test peer_pods { 10.244.5.5/32 }",
        "add element ip gpufed_test peer_reachable { 10.200.0.0/24, 10.244.5.5/32 }",
        "add element ip gpufed_test local_pods { 10.244.0.0/16 }",
        "add element ip gpufed_test local_reachable { 10.96.0.10/32, 10.244.0.0/16 }",
    ]
    # the same lines fill the sets in a full update, so both paths agree
    assert all(line in nft_update(members).splitlines() for line in text.splitlines())


@pytest.mark.parametrize(("field", "address"), [("local_members", "10.99.0.1"), ("peer_members", "10.64.0.1")])
def test_a_member_outside_its_pod_range_is_refused(field: str, address: str) -> None:
    with pytest.raises(RenderError, match=f"member {address} is outside the pod range"):
        dataclasses.replace(PLAN, **{field: frozenset({A(address)})})  # type: ignore[arg-type]
