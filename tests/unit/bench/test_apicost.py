"""The api-cost benchmark's pure parts: parsing kube-apiserver audit lines (recorded from a local run,
tests/unit/data/apicost-*-audit.jsonl), counting a window, attribution to gpufed's components, poller
detection, the 1 -> N providers comparison, the verdicts and the markdown table. No clusters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import apicost, audit, report
from bench.audit import AuditEvent
from gpufed.localenv.components import CONTROLLER
from tests.paths import UNIT_DATA

DATA = UNIT_DATA
CONSUMER_ID = "consumer-795b1613"


def _lines(name: str) -> list[str]:
    return (DATA / f"apicost-{name}-audit.jsonl").read_text().splitlines()


def _event(
    received: float,
    *,
    verb: str = "get",
    resource: str = "pods",
    name: str = "p",
    stage: str = "ResponseComplete",
    audit_id: str = "",
    code: int = 200,
    at: float | None = None,
) -> AuditEvent:
    return AuditEvent(
        audit_id=audit_id or f"id-{received}-{verb}-{name}",
        stage=stage,
        verb=verb,
        user="gpufed:controller",
        user_agent="OpenAPI-Generator/33.3.0+snapshot/python",
        resource=resource,
        namespace="ns",
        name=name,
        selectors="",
        code=code,
        received=received,
        at=received if at is None else at,
    )


def test_parse_recorded_lines() -> None:
    events = audit.parse_lines(_lines("consumer"))
    assert len(events) == len(_lines("consumer")) == 8
    lease = events[1]
    assert (lease.stage, lease.verb, lease.user) == ("ResponseComplete", "get", "gpufed:virtual-kubelet")
    assert lease.resource == "leases.coordination.k8s.io"
    assert (lease.namespace, lease.name, lease.code) == ("kube-node-lease", "gpufed-gpu-1-ca4b0032", 200)
    assert lease.user_agent == "OpenAPI-Generator/33.3.0+snapshot/python"
    assert lease.received == pytest.approx(1795327800.029136)
    assert events[0].code == 404  # the first renewal: the Lease did not exist yet
    watch = events[4]
    assert (watch.stage, watch.verb, watch.resource, watch.long_running) == ("ResponseStarted", "watch", "nodes", True)

    provider = audit.parse_lines(_lines("provider"))
    version = provider[0]
    # A non-resource request is named by its path.
    assert (version.resource, version.user, version.verb) == ("/version", f"gpufed:consumer:{CONSUMER_ID}", "get")
    assert provider[4].resource == "resourceslices.gpufed.io"
    assert provider[4].namespace == f"gpufed-tenant-{CONSUMER_ID}"


def test_parse_skips_what_is_not_an_audit_event() -> None:
    good = _lines("consumer")[0]
    assert audit.parse_event(good[:100]) is None  # a line cut by rotation
    assert audit.parse_event("") is None
    assert audit.parse_event(json.dumps({"kind": "Status"})) is None
    assert audit.parse_lines(["", "not json", good]) == [audit.parse_event(good)]
    sub = json.loads(good)
    sub["objectRef"].update(resource="nodes", subresource="status", apiGroup="")
    ev = audit.parse_event(json.dumps(sub))
    assert ev is not None and ev.resource == "nodes/status"
    sel = json.loads(good)
    sel["requestURI"] = "/api/v1/pods?fieldSelector=spec.nodeName%3Dvn&labelSelector=a%3Db&limit=500"
    ev = audit.parse_event(json.dumps(sel))
    assert ev is not None and ev.selectors == "labelSelector=a=b&fieldSelector=spec.nodeName=vn"


def test_window_counts_a_watch_once_when_it_starts_and_its_end_apart() -> None:
    events = audit.parse_lines(_lines("consumer"))
    t0 = min(e.received for e in events) - 1
    w = audit.count_window(events, t0, t0 + 1000)
    ids = [e.audit_id[:8] for e in w.requests]
    # The kcm watch that started and then ended with 429 is one request (its start) and one end.
    assert ids.count("ccd485fa") == 1
    assert [e.audit_id[:8] for e in w.watch_ends] == ["ccd485fa"]
    assert len(w.requests) == 7
    # Only what was received inside [t0, t1).
    lease_ts = sorted(e.received for e in events if e.user == "gpufed:virtual-kubelet")
    w = audit.count_window(events, lease_ts[1], lease_ts[3])
    assert [e.verb for e in w.requests] == ["get", "update"]


def test_window_watch_edges() -> None:
    refused = _event(5, verb="watch", code=429, audit_id="refused")  # no ResponseStarted: refused before it began
    old_end = _event(1, verb="watch", audit_id="old", at=6)  # began before the log was read: only its end
    start = _event(7, verb="watch", stage="ResponseStarted", audit_id="w")
    end = _event(7, verb="watch", audit_id="w", at=30)  # ends after the window
    w = audit.count_window([refused, old_end, start, end], 0, 10)
    assert [e.audit_id for e in w.requests] == ["refused", "w"]
    assert [e.audit_id for e in w.watch_ends] == ["old"]


def test_aggregate_attributes_by_identity() -> None:
    events = audit.parse_lines(_lines("provider"))
    t0 = min(e.received for e in events)
    out = apicost.aggregate(events, t0, t0 + 60, apicost.identities("gpu-1", CONSUMER_ID))
    assert set(out) == {apicost.C_PROVIDER_CONTROLLER, apicost.C_CONSUMER_IDENTITY}  # no other client here
    ci = out[apicost.C_CONSUMER_IDENTITY]
    assert ci["requests"] == 5 and ci["by_verb"] == {"get": 4, "list": 1}
    assert ci["rps"] == pytest.approx(5 / 60, abs=1e-3)
    assert ci["top_resources"][0] == {"resource": "/version", "requests": 4, "rps": 0.067, "verbs": {"get": 4}}
    assert ci["user_agents"] == ["OpenAPI-Generator/33.3.0+snapshot/python"]
    # /version every ~5 s is a poller; named, with its gap.
    assert [(p["verb"], p["resource"], p["count"]) for p in ci["pollers"]] == [("get", "/version", 4)]
    assert ci["pollers"][0]["every_s"] == pytest.approx(5.0, abs=0.1)
    pc = out[apicost.C_PROVIDER_CONTROLLER]
    assert (pc["requests"], pc["writes"], pc["pollers"]) == (1, 1, [])
    # Consumer side: both gpufed identities present even when silent; others are kept apart.
    consumer = apicost.aggregate([], 0, 60, apicost.identities("consumer", CONSUMER_ID))
    assert consumer[apicost.C_CONTROLLER]["requests"] == consumer[apicost.C_VKS]["requests"] == 0
    assert apicost.classify("system:kube-scheduler", apicost.identities("consumer", CONSUMER_ID)) == apicost.C_OTHERS


def test_pollers_flag_more_than_once_per_period_only() -> None:
    every_10 = [_event(t, resource="leases", name="vn") for t in (0.0, 10.05, 20.1, 30.1, 40.2, 50.2)]
    every_9 = [_event(t, resource="secrets", name="s") for t in (0.0, 9.0, 18.0, 27.0)]
    burst = [_event(t, verb="list", resource="configmaps", name="") for t in (1.0, 1.2, 1.4)]
    twice = [_event(t, resource="nodes", name="n") for t in (1.0, 1.1)]
    watches = [_event(t, verb="watch", stage="ResponseStarted", resource="pods") for t in (1.0, 2.0, 3.0)]
    reads = apicost.repeated_reads(every_10 + every_9 + burst + twice + watches)
    assert [(r["resource"], r["count"], r["flagged"]) for r in reads] == [
        ("leases", 6, False),
        ("secrets", 4, True),
        ("configmaps", 3, True),
    ]
    assert [p["resource"] for p in apicost.find_pollers(every_10 + every_9 + burst)] == ["secrets", "configmaps"]
    # Different objects are different things.
    spread = [_event(t, name=f"p{t}") for t in (0.0, 1.0, 2.0, 3.0)]
    assert apicost.find_pollers(spread) == []


def _phase(providers: int, controller_rss: float, rps_each: float, vk_rss: float, pollers: int = 0) -> dict[str, Any]:
    window = 60.0
    names = [f"gpu-{i}" for i in range(1, providers + 1)]
    stats = {
        "requests": int(rps_each * window),
        "rps": rps_each,
        "by_verb": {"get": int(rps_each * window)},
        "rps_by_verb": {"get": rps_each},
        "writes": 0,
        "top_resources": [{"resource": "secrets", "requests": int(rps_each * window), "rps": rps_each, "verbs": {}}],
        "watch_starts": 0,
        "watch_ends": 0,
        "errors": {},
        "users": [],
        "user_agents": ["ua"],
        "repeated_reads": [],
        "pollers": [],
    }
    consumer = {apicost.C_CONTROLLER: dict(stats), apicost.C_VKS: dict(stats), apicost.C_OTHERS: dict(stats)}
    consumer[apicost.C_VKS]["pollers"] = [
        {"verb": "get", "resource": "/version", "namespace": "", "name": "", "selectors": "", "count": 12,
         "every_s": 5.0, "flagged": True}
    ] * pollers  # fmt: skip
    provider = {apicost.C_PROVIDER_CONTROLLER: dict(stats), apicost.C_CONSUMER_IDENTITY: dict(stats)}
    servers = {"consumer": consumer, **{n: provider for n in names}}
    procs = {
        "controller": {"pid": 1, "rss_mb": controller_rss, "rss_peak_mb": controller_rss, "cpu_s": 1.0,
                       "cpu_cores": 0.02, "gone": False},
        **{f"vk:{n}": {"pid": 2, "rss_mb": vk_rss, "rss_peak_mb": vk_rss + 1, "cpu_s": 0.5, "cpu_cores": 0.01,
                       "gone": False} for n in names},
    }  # fmt: skip
    return {
        "providers": providers,
        "peered": names,
        "window_s": window,
        "servers": servers,
        "processes": procs,
        "summary": apicost.summarise(servers, procs, window),
    }


def test_growth_verdicts_and_table() -> None:
    one, five = _phase(1, 100.0, 0.5, 90.0), _phase(5, 120.0, 0.5, 92.0, pollers=1)
    s1 = one["summary"]
    # consumer: controller + virtual kubelets; provider: its controller + the consumer's identity.
    assert s1["gpufed_rps_consumer"] == 1.0 and s1["gpufed_rps_providers"] == 1.0
    assert five["summary"]["gpufed_rps_providers"] == 5.0 and five["summary"]["gpufed_rps_per_provider"] == 1.2
    g = apicost.compare(one, five)
    assert g["controller_rss_mb"] == {"one": 100.0, "many": 120.0, "ratio": 1.2, "per_added_provider": 5.0}
    assert g["gpufed_rps_total"]["ratio"] == 3.0
    vd = apicost.verdicts([one, five], 20)
    assert vd["pollers"]["value"] == 1 and vd["pollers"]["met"] is False
    assert apicost.verdicts([five, five], 20)["pollers"]["value"] == 1  # the same series in both windows
    assert apicost.verdicts([one], 20)["pollers"] == {**vd["pollers"], "value": 0, "met": True}
    assert vd["vk_rss_mb"]["met"] is None and vd["vk_rss_mb"]["value"] == 93.0
    assert "at 20 pods" in vd["vk_rss_mb"]["note"]
    big = apicost.verdicts([_phase(1, 100.0, 0.5, 200.0)], 20)
    assert big["vk_rss_mb"]["met"] is False and "already above" in big["vk_rss_mb"]["note"]

    data = {
        "environment": {"window_s": 60.0, "settle_s": 15.0, "pods_per_provider": 20, "pods_total": 100},
        "phases": [one, five],
        "growth": g,
        "verdicts": vd,
    }
    md = apicost.table(data)
    assert "| 5 | gpu-1..gpu-5 (sum of 5) |" in md
    assert "| 1 | consumer | consumer controller (`gpufed:controller`) | **0.5** |" in md
    assert "gpufed req/s, total | 2 | 6 | 3 | 1 |" in md
    assert "`get /version`" in md and "(every 5 s)" in md
    assert "**missed**" in md  # the poller
    assert "`ua`" in md  # the shared User-Agent is named


def test_consumer_gets_kubelet_ports_for_every_provider(tmp_path: Path) -> None:
    env = apicost.environment(apicost.ApiCostOptions(state_dir=tmp_path / "s", bin_dir=tmp_path / "b"))
    assert env.settings.audit and [c.name for c in env.topology.clusters][1:] == apicost.provider_names(5)
    cmd = env._command(env.topology.cluster("consumer"), CONTROLLER)
    assert "--kubelet-ports=16350-16364" in cmd  # 3 per provider, after the 6 clusters' blocks (16200-16349)
    gpu1 = env._command(env.topology.cluster("gpu-1"), CONTROLLER)
    assert "--kubelet-ports=16239-16249" in gpu1  # providers keep the launcher's range


def test_the_pollers_explanation_reads_the_run_after_the_fixes() -> None:
    results = {
        "api-cost": {
            "phases": [
                {"providers": 1, "window_s": 45.0, "servers": {}},
                {
                    "providers": 5,
                    "window_s": 45.0,
                    "servers": {
                        "consumer": {
                            "controller": {
                                "by_verb": {"get": 60, "list": 9},
                                "top_resources": [
                                    {"resource": "foreignclusters.gpufed.io", "rps": 0.444},
                                    {"resource": "secrets", "rps": 0.222},
                                ],
                            }
                        }
                    },
                },
            ],
            "growth": {"gpufed_rps_per_provider": {"one": 1.3, "many": 1.25}},
        }
    }
    text = report._why_pollers(results)
    assert "with 5 providers, the consumer controller made 0.2 lists/s (before the first fix: 0.444)" in text
    assert "and 0.222 Secret reads/s (before the second: 0.711;" in text  # the Secrets' rate, not the FCs'
    assert "1.25 requests/s per provider (before the first fix: 1.447; before the second: 1.257)" in text
