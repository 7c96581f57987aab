"""kwok configuration: stages and kubelet-API objects as kwok will read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vkprovider.localenv import kwokcfg


def _docs(job_seconds: float = 5, *, nobody: bool = True) -> list[dict[str, Any]]:
    return list(
        yaml.safe_load_all(kwokcfg.render(job_seconds, Path("/x/pod.log"), Path("/x/exec"), run_as_nobody=nobody))
    )


def _by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_all_objects_are_kwok_v1alpha1() -> None:
    docs = _docs()
    assert {d["apiVersion"] for d in docs} == {"kwok.x-k8s.io/v1alpha1"}
    assert {d["kind"] for d in docs} == {"Stage", "ClusterLogs", "ClusterExec", "ClusterPortForward"}


def test_lifecycle_stages_present() -> None:
    stages = _by_name(_docs(), "Stage")
    assert set(stages) == {"node-initialize", "node-heartbeat", "pod-running", "pod-succeed", "pod-fail", "pod-delete"}
    assert stages["pod-delete"]["spec"]["next"] == {"delete": True}


def test_job_duration_is_configurable_and_overridable_per_pod() -> None:
    stages = _by_name(_docs(job_seconds=7.5), "Stage")
    for name in ("pod-succeed", "pod-fail"):
        delay = stages[name]["spec"]["delay"]
        assert delay["durationMilliseconds"] == 7500
        assert kwokcfg.RUN_DURATION_ANNOTATION in delay["durationFrom"]["expressionFrom"]


def test_only_run_to_completion_pods_terminate() -> None:
    stages = _by_name(_docs(), "Stage")
    exprs = stages["pod-succeed"]["spec"]["selector"]["matchExpressions"]
    policy = next(e for e in exprs if e["key"] == ".spec.restartPolicy")
    assert policy == {"key": ".spec.restartPolicy", "operator": "In", "values": ["Never", "OnFailure"]}
    # Succeed and fail are mutually exclusive on the exit-code annotation.
    keys = {e["key"]: e["operator"] for e in exprs}
    fail_keys = {e["key"]: e["operator"] for e in stages["pod-fail"]["spec"]["selector"]["matchExpressions"]}
    exit_key = f'.metadata.annotations["{kwokcfg.EXIT_CODE_ANNOTATION}"]'
    assert keys[exit_key] == "DoesNotExist" and fail_keys[exit_key] == "Exists"
    assert "exitCode: 0" in stages["pod-succeed"]["spec"]["next"]["statusTemplate"]
    assert "phase: Failed" in stages["pod-fail"]["spec"]["next"]["statusTemplate"]


def test_running_pods_get_ips_from_the_node_pod_cidr() -> None:
    tmpl = _by_name(_docs(), "Stage")["pod-running"]["spec"]["next"]["statusTemplate"]
    assert "PodIPsWith .spec.nodeName" in tmpl and "phase: Running" in tmpl


def test_exec_drops_to_nobody_only_when_asked() -> None:
    local = _by_name(_docs(nobody=True), "ClusterExec")["all-pods"]["spec"]["execs"][0]["local"]
    assert local["securityContext"] == {"runAsUser": 65534, "runAsGroup": 65534}
    assert local["workDir"] == "/x/exec"
    local = _by_name(_docs(nobody=False), "ClusterExec")["all-pods"]["spec"]["execs"][0]["local"]
    assert "securityContext" not in local


def test_logs_and_port_forward_targets() -> None:
    docs = _docs()
    logs = _by_name(docs, "ClusterLogs")["all-pods"]["spec"]["logs"][0]
    assert logs == {"logsFile": "/x/pod.log", "follow": True}
    fwd = _by_name(docs, "ClusterPortForward")["all-pods"]["spec"]["forwards"][0]
    assert fwd == {"command": ["cat"]}
