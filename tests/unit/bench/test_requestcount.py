"""`bench.requestcount`: requests per pod per side, actor and verb, from audit lines written to a file."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from bench import requestcount
from bench.audit import AuditEvent


def _line(user: str, verb: str, resource: str, *, stage: str = "ResponseComplete", at: float | None = None) -> str:
    stamp = dt.datetime.fromtimestamp(at or time.time(), dt.UTC).isoformat().replace("+00:00", "Z")
    group, _, sub = resource.partition("/")
    ref: dict[str, Any] = {"resource": group, "namespace": "ns", "name": "p"}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "kind": "Event",
            "stage": stage,
            "auditID": f"{user}-{verb}-{resource}-{time.monotonic_ns()}",
            "verb": verb,
            "user": {"username": user},
            "objectRef": ref,
            "requestURI": f"/api/v1/namespaces/ns/{group}",
            "requestReceivedTimestamp": stamp,
            "stageTimestamp": stamp,
            "responseStatus": {"code": 201},
        }
    )


def test_requests_are_counted_per_pod_per_actor_and_verb() -> None:
    def ev(user: str, verb: str, resource: str) -> AuditEvent:
        return AuditEvent("i", "ResponseComplete", verb, user, "", resource, "ns", "p", "", 200, 0.0, 0.0)

    requests = [
        *(ev("gpufed:virtual-kubelet", "create", "pods") for _ in range(4)),
        *(ev("gpufed:consumer:c-1", "patch", "pods/status") for _ in range(2)),
        ev("gpufed:controller", "get", "secrets"),
        ev("gpufed:virtual-kubelet", "create", "serviceaccounts/token"),
        *(ev("system:serviceaccount:kube-system:kwok-controller", "patch", "pods/status") for _ in range(4)),
        ev("system:kube-scheduler", "create", "pods/binding"),
        ev("gpufed-local-admin", "create", "pods"),
    ]
    got = requestcount.per_pod(requests, 4)
    # a TokenRequest is signed, not stored: not a write
    assert got["gpufed"]["writes"] == 1.5 and got["gpufed"]["reads"] == 0.5
    assert got["gpufed"]["by_verb"] == {
        "create pods": 1.0,
        "patch pods/status": 0.5,
        "get secrets": 0.25,
        "create serviceaccounts/token": 0.25,
    }
    assert got["kwok"]["writes"] == 1.0
    assert got["control-plane"]["by_verb"] == {"create pods/binding": 0.25}
    assert got["client"]["writes"] == 0.25
    assert "create pods 1" in requestcount.summary({"consumer": got})


def test_a_window_counts_only_what_each_log_gained_after_it_opened(tmp_path: Path) -> None:
    consumer, provider = tmp_path / "consumer.log", tmp_path / "provider.log"
    consumer.write_text(_line("gpufed:virtual-kubelet", "create", "pods", at=time.time() - 60) + "\n")
    provider.write_text("")
    window = requestcount.Window.open({"consumer": consumer, "provider": provider})
    with consumer.open("a") as f:
        f.write(_line("gpufed:virtual-kubelet", "patch", "pods/status") + "\n")
        f.write(_line("gpufed:virtual-kubelet", "watch", "pods", stage="ResponseStarted") + "\n")
    with provider.open("a") as f:
        f.write(_line("gpufed:consumer:c-1", "create", "pods") + "\n")
        f.write(_line("gpufed:consumer:c-1", "create", "secrets") + "\n")
    got = window.close(pods=1)
    assert got["consumer"]["gpufed"]["by_verb"] == {"patch pods/status": 1.0, "watch pods": 1.0}
    assert got["provider"]["gpufed"]["pod"] == 2.0
    assert got["provider"]["gpufed"]["background_per_s"] == 0.0
    assert {k: v for k, v in got["provider"]["gpufed"].items() if k not in ("pod", "background_per_s")} == {
        "writes": 2.0,
        "reads": 0.0,
        "by_verb": {"create pods": 1.0, "create secrets": 1.0},
    }


def test_pod_requests_are_counted_per_pod_and_the_rest_per_second() -> None:
    def ev(verb: str, resource: str) -> AuditEvent:
        return AuditEvent("i", "ResponseComplete", verb, "gpufed:vk", "", resource, "ns", "p", "", 200, 0.0, 0.0)

    requests = [
        *(ev("create", "serviceaccounts/token") for _ in range(10)),
        *(ev("patch", "pods/status") for _ in range(10)),
        *(ev("create", "events") for _ in range(2)),
        *(ev("patch", "nodes/status") for _ in range(6)),
        *(ev("update", "leases.coordination.k8s.io") for _ in range(2)),
    ]
    got = requestcount.per_pod(requests, 10, seconds=4.0)["gpufed"]
    assert got["pod"] == 2.2, "token, status and Events are the pods'"
    assert got["background_per_s"] == 2.0, "8 node and lease writes over 4 s"
    assert got["writes"] + got["reads"] == 3.0
    assert "pod" not in requestcount.per_pod(requests, 10)["gpufed"], "no window length: no split"
