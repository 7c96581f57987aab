"""The fabric benchmark's pure helpers: iperf3 JSON, RTT statistics, ratios and verdicts, the peering
specs it configures the gateways from, and its section of docs/benchmarks.md."""

from __future__ import annotations

import itertools
import json
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import pytest

from bench import fabric, report
from bench.__main__ import PARTS, _parts
from netfabric import plan as plans
from netfabric.render import FILTER_CHAINS, allowed_ips, nft_ruleset

IPERF_OK = {
    "start": {"connected": [{"local_host": "10.244.1.10", "remote_host": "10.64.0.7"}]},
    "intervals": [],
    "end": {
        "sum_sent": {"seconds": 5.0, "bytes": 700_000_000, "bits_per_second": 1.12e9, "retransmits": 42},
        "sum_received": {"seconds": 5.04, "bytes": 690_000_000, "bits_per_second": 1_095_238_095.2},
    },
}


def test_parse_iperf3_takes_the_received_rate() -> None:
    got = fabric.parse_iperf3(json.dumps(IPERF_OK))
    assert got == {"mbps": 1095.2, "bytes": 690_000_000, "seconds": 5.04, "retransmits": 42}


def test_parse_iperf3_reports_iperf3s_own_error() -> None:
    text = json.dumps({"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server: refused"})
    with pytest.raises(fabric.FabricBenchError, match="unable to connect to server"):
        fabric.parse_iperf3(text)


@pytest.mark.parametrize("text", ["", "iperf3: error - no JSON", "[1, 2]", json.dumps({"end": {}})])
def test_parse_iperf3_refuses_what_is_not_a_result(text: str) -> None:
    with pytest.raises(fabric.FabricBenchError):
        fabric.parse_iperf3(text)


def test_rtt_stats_nearest_rank_in_ms() -> None:
    samples = [i * 1000 for i in range(1, 101)]  # 1..100 microseconds
    got = fabric.rtt_stats(samples)
    assert got == {"n": 100, "p50_ms": 0.05, "p90_ms": 0.09, "p99_ms": 0.099, "max_ms": 0.1}
    assert fabric.rtt_stats([])["p50_ms"] is None


def test_spread_and_ratio() -> None:
    assert fabric.spread_pct([900.0, 1000.0, 1100.0]) == 20.0
    assert fabric.spread_pct([1000.0]) is None
    assert fabric.ratio(900.0, 1000.0) == 0.9
    assert fabric.ratio(None, 1000.0) is None
    assert fabric.ratio(1.0, 0.0) is None


def _scenario(runs: list[float], p50: float, p99: float) -> dict[str, Any]:
    ms = 1_000_000
    rtt = [[int(p50 * ms)] * 98 + [int(p99 * ms)] * 2]
    return fabric.summarize([{"mbps": r, "retransmits": 0} for r in runs], rtt, "x")


def test_verdicts_at_the_targets_boundaries() -> None:
    scenarios = {
        "full": _scenario([900.0, 850.0, 950.0], p50=0.22, p99=0.5),
        "bare": _scenario([1000.0, 990.0, 1010.0], p50=0.2, p99=0.4),
    }
    v = fabric.verdicts(scenarios)
    assert v["throughput"] == {
        "value": 0.9,
        "target": ">= 0.90",
        "met": True,
        "per_run": [0.9, 0.859, 0.941],
    }
    assert v["rtt_p50"]["value"] == 1.1 and v["rtt_p50"]["met"] is True and v["rtt_p50"]["per_run"] == [1.1]
    assert v["rtt_p99"]["value"] == 1.25 and v["rtt_p99"]["met"] is False and v["rtt_p99"]["informational"]
    scenarios["full"] = _scenario([890.0], p50=0.221, p99=0.4)  # ratios of the figures shown (µs)
    scenarios["bare"] = _scenario([1000.0], p50=0.2, p99=0.4)
    v = fabric.verdicts(scenarios)
    assert v["throughput"]["met"] is False and v["rtt_p50"]["met"] is False


def test_summarize_pools_rtt_runs_and_takes_the_median_throughput() -> None:
    s = fabric.summarize(
        [{"mbps": 1.0, "retransmits": 1}, {"mbps": 3.0, "retransmits": 0}, {"mbps": 2.0, "retransmits": None}],
        [[100_000] * 10, [300_000] * 10],
        "label",
    )
    assert s["throughput_mbps"] == {"median": 2.0, "runs": [1.0, 3.0, 2.0], "spread_pct": 100.0}
    assert s["retransmits"] == [1, 0, None]
    assert s["rtt"]["n"] == 20 and s["rtt"]["per_run_p50_ms"] == [0.1, 0.3] and s["rtt"]["p50_ms"] == 0.1


def test_fabric_specs_are_a_symmetric_remapping_of_overlapping_pod_cidrs() -> None:
    specs = fabric.fabric_specs("bench-x-consumer", "bench-x-provider")
    (c_local, c_remote), (p_local, p_remote) = specs["consumer"], specs["provider"]
    assert c_local.pod_cidr == p_local.pod_cidr == fabric.POD_CIDR
    assert c_remote.cluster_id == "bench-x-provider" and p_remote.cluster_id == "bench-x-consumer"
    assert c_remote.peer_view == p_remote.mapped and p_remote.peer_view == c_remote.mapped
    gp_c = plans.gateway_plan(c_local, c_remote, masquerade=False)
    gp_p = plans.gateway_plan(p_local, p_remote, masquerade=False)
    assert not gp_c.peer_pod.identity and gp_c.peer_pod.mapped.subnet_of(IPv4Network("10.64.0.0/10"))
    # what the client dials and what the server sees
    assert gp_c.peer_pod.to_mapped(fabric.SERVER_POD) == IPv4Address("10.64.0.7")
    assert gp_p.peer_pod.to_mapped(fabric.CLIENT_POD) == IPv4Address("10.64.1.10")
    rules = nft_ruleset(gp_c)
    assert "dnat ip to" in rules and "snat ip to" in rules
    assert IPv4Network(fabric.POD_CIDR) in allowed_ips(gp_c, IPv4Address("169.254.64.1"))
    assert gp_c.interface != gp_p.interface


def test_missing_requirements_names_the_wireguard_go_binary(tmp_path: Path) -> None:
    why = fabric.missing_requirements(tmp_path / "wireguard-go")
    assert any("wireguard-go" in w for w in why)


def test_fabric_is_a_part() -> None:
    assert "fabric" in PARTS
    assert _parts("fabric") == ("fabric",)


def _result() -> dict[str, Any]:
    scenarios = {
        "full": _scenario([900.0, 850.0, 1000.0], p50=0.21, p99=0.5),
        "bare": _scenario([1000.0, 990.0, 1010.0], p50=0.2, p99=0.4),
        "veth": _scenario([15000.0], p50=0.02, p99=0.05),
    }
    scenarios["full"].update(
        {
            "client": "10.244.1.10",
            "dials": "10.64.0.7",
            "server_saw_client_as": "10.64.1.10",
            "path_mtu_seen_by_client": 1420,
        }
    )
    return {
        "part": "fabric",
        "environment": {
            "mtu": 1420,
            "mtus": [1420],
            "underlay_mtu": 1500,
            "pod_link_mtu": 1500,
            "seconds_per_run": 5.0,
            "runs": 3,
            "round_trips_per_run": 2000,
            "warmup_round_trips": 100,
            "request_bytes": 64,
            "order": "full, bare, veth x 3",
            "versions": {"wireguard_go": "wireguard-go v0", "iperf3": "iperf 3.12"},
        },
        "scenarios": scenarios,
        "verdicts": fabric.verdicts(scenarios),
        "machine": {"date": "today", "cores": 2, "cpu": "cpu"},
    }


def test_the_fabric_section_has_the_figures_the_targets_and_the_mtu() -> None:
    doc = report.render({"fabric": _result(), "reflection": {"kinds": {}, "machine": {}}})
    assert doc.index("## Reflection") < doc.index("## Fabric")
    section = doc[doc.index("## Fabric") :]
    assert "| **full**: x | 10.244.1.10 → 10.64.0.7 | 900 | 900, 850, 1000 | 0.21 ms | 0.5 ms |" in section
    assert "| throughput | 0.9 | ≥ 0.90 | ✅ |" in section
    assert "| RTT p50 | 1.05 | ≤ 1.10 | ✅ |" in section
    assert "| RTT p99 | 1.25 | ≤ 1.10 (for information" in section and "❌" in section
    assert "MTU: **1420**" in section
    assert "the server saw 10.64.1.10" in section
    assert "cannot tell a 10% difference" in section  # full's runs lie 16.7% apart
    assert "throughput 0.9, 0.859, 0.99; RTT p50 1.05." in section
    table = report.TABLES["fabric"](_result())
    assert "MTU 1420" in table and "throughput: 0.9 (>= 0.90) met" in table


def test_filter_verdicts_judge_full_against_the_same_path_without_the_filter() -> None:
    scenarios = {
        "full": _scenario([950.0, 900.0, 990.0], p50=0.21, p99=0.5),
        "nofilter": _scenario([1000.0, 1000.0, 1000.0], p50=0.2, p99=0.4),
        "bare": _scenario([1000.0, 990.0, 1010.0], p50=0.2, p99=0.4),
    }
    v = fabric.verdicts(scenarios)
    assert v["filter_throughput"] == {"value": 0.95, "target": ">= 0.95", "met": True, "per_run": [0.95, 0.9, 0.99]}
    assert v["filter_rtt_p50"]["value"] == 1.05 and v["filter_rtt_p50"]["met"] is None
    scenarios["full"] = _scenario([940.0], p50=0.21, p99=0.5)
    scenarios["nofilter"] = _scenario([1000.0], p50=0.2, p99=0.4)
    assert fabric.verdicts(scenarios)["filter_throughput"]["met"] is False
    # results without the nofilter path (older runs) have no filter verdict
    del scenarios["nofilter"]
    assert "filter_throughput" not in fabric.verdicts(scenarios)


def test_the_measured_paths_include_the_one_without_the_filter() -> None:
    assert fabric.SCENARIOS == ("full", "nofilter", "bare", "veth")
    assert fabric.TARGET_FILTER_THROUGHPUT_RATIO_MIN == 0.95
    specs = fabric.fabric_specs("bench-x-consumer", "bench-x-provider")
    tunnel = (IPv4Address("169.254.64.2"), IPv4Address("169.254.64.1"))
    rules = nft_ruleset(plans.gateway_plan(*specs["consumer"], masquerade=False, tunnel=tunnel))
    # what nofilter deletes is exactly the filter's hooks
    for name in FILTER_CHAINS:
        assert f"\tchain {name} {{\n\t\ttype filter hook" in rules


def test_the_fabric_section_shows_the_filters_cost() -> None:
    result = _result()
    result["scenarios"]["nofilter"] = _scenario([1000.0, 900.0, 1000.0], p50=0.2, p99=0.45)
    result["scenarios"]["full"]["filter_drops"] = {"cgw": {"dropped_from_peer": 0, "dropped_to_peer": 0}}
    result["verdicts"] = fabric.verdicts(result["scenarios"])
    doc = report.render({"fabric": result, "reflection": {"kinds": {}, "machine": {}}})
    section = doc[doc.index("## Fabric") :]
    assert "| **nofilter**: x |" in section
    assert "| full / nofilter (the tunnel filter's cost) | measured | target | |" in section
    assert "| throughput | 0.9 | ≥ 0.95 | ❌ |" in section
    assert "The filter costs 10% of the throughput (full / nofilter per interleaved round: 0.9, 0.944, 1)" in section
    assert "it dropped 0 packets of the measured traffic" in section
    table = report.TABLES["fabric"](result)
    assert "full/nofilter filter_throughput: 0.9 (>= 0.95) MISSED" in table
    assert "full/nofilter filter_rtt_p50: 1.05 ((for information)) shown (informational)" in table
    assert ("fabric.filter_throughput", "fabric", "0.9 (target >= 0.95)") in report.missed_targets({"fabric": result})


def test_a_missed_filter_target_is_explained_by_the_runs_spread() -> None:
    result = _result()
    result["scenarios"]["nofilter"] = _scenario([1000.0, 900.0, 1000.0], p50=0.2, p99=0.45)
    result["verdicts"] = fabric.verdicts(result["scenarios"])
    doc = report.render({"fabric": result, "reflection": {"kinds": {}, "machine": {}}})
    why = doc[doc.index("**fabric.filter_throughput.**") :]
    assert "cannot tell the filter's cost from the machine's noise" in why.splitlines()[0]


def test_member_pods_are_distinct_in_the_pod_cidr_none_adjacent_and_the_server_pod_first() -> None:
    pods = fabric.member_pods(fabric.MEMBER_PODS)
    assert len(set(pods)) == fabric.MEMBER_PODS and pods[0] == fabric.SERVER_POD
    assert all(a in IPv4Network(fabric.POD_CIDR) for a in pods)
    assert fabric.CLIENT_POD not in pods
    ordered = sorted(int(a) for a in pods)
    assert all(b - a > 1 for a, b in itertools.pairwise(ordered))
