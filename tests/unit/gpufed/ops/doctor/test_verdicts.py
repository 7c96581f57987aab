"""gpufed.ops.doctor.verdicts: the verdicts that are pure functions of what was read."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpufed.ops.doctor.checks import Check
from gpufed.ops.doctor.verdicts import human, judge_mtu, judge_nodes, one_line
from tests.unit.gpufed.ops.doctor.scenario import NODE, PROVIDER, stamp


def test_mtu_must_leave_room_for_the_wireguard_overhead() -> None:
    def gw(mtu: int, endpoint: str = "192.0.2.7:51820", configured: int = 0) -> dict[str, Any]:
        return {"spec": {"endpoint": endpoint, "mtu": configured}, "status": {"mtu": mtu}}

    def judge(g: dict[str, Any], underlay: int = 1500) -> Check:
        return judge_mtu(PROVIDER, g, underlay_mtu=underlay, connect_cmd="gpufed network connect X")

    assert judge(gw(1440)).status == "OK", "IPv4 underlay: 60 B of overhead"
    bad = judge(gw(1440, "[fd00::7]:51820"))
    assert bad.status == "WARN" and "80 B WireGuard-over-IPv6" in bad.finding
    assert bad.fix.startswith("lower it: gpufed network connect X --mtu 1420")
    assert judge(gw(1480)).status == "WARN"
    assert judge(gw(8920), underlay=9000).status == "OK"
    assert judge(gw(1200)).status == "FAIL"
    assert judge(gw(1400, configured=1380)).status == "WARN", "configured and applied differ"
    assert judge(gw(0)).status == "WARN", "nothing applied yet"


def test_a_node_without_a_lease_is_fine_only_just_after_it_registered() -> None:
    now = dt.datetime.now(dt.UTC)
    ready = {"type": "Ready", "status": "True"}

    def node(seconds_ago: float) -> dict[str, Any]:
        return {"metadata": {"name": NODE, "creationTimestamp": stamp(seconds_ago)}, "status": {"conditions": [ready]}}

    fresh = judge_nodes(PROVIDER, [node(5)], {NODE: None}, now)
    assert fresh.status == "OK" and "lease not created yet" in fresh.finding
    old = judge_nodes(PROVIDER, [node(300)], {NODE: None}, now)
    assert old.status == "FAIL" and "renewed never" in old.finding


def test_findings_are_one_line_with_human_durations() -> None:
    assert [human(s) for s in (42, -42, 300, 3 * 3600, 12 * 86400)] == ["42 s", "42 s", "5 min", "3.0 h", "12 days"]
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("x" * 10, limit=5) == "xxxx…"
