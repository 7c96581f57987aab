"""kwok configuration: stages and kubelet-API objects as kwok will read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufed.localenv import kwokcfg


def _docs(job_seconds: float = 5, *, nobody: bool = True) -> list[dict[str, Any]]:
    return list(
        yaml.safe_load_all(kwokcfg.render(job_seconds, Path("/x/pod.log"), Path("/x/exec"), run_as_nobody=nobody))
    )


def _by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_all_objects_are_kwok_v1alpha1() -> None:
    docs = _docs()
    assert {d["apiVersion"] for d in docs} == {"kwok.x-k8s.io/v1alpha1"}
    assert {d["kind"] for d in docs} == {
        "Stage",
        "ClusterLogs",
        "ClusterAttach",
        "ClusterExec",
        "ClusterPortForward",
        "ClusterResourceUsage",
        "Metric",
    }


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
    attach = _by_name(docs, "ClusterAttach")["all-pods"]["spec"]["attaches"][0]
    assert attach == {"logsFile": "/x/attach.log"}
    http, echo = _by_name(docs, "ClusterPortForward")["all-pods"]["spec"]["forwards"]
    assert echo == {"command": ["cat"]}
    assert http["ports"] == [kwokcfg.HTTP_PORT] and http["command"][:2] == ["sh", "-c"]


def test_port_8080_answers_http() -> None:
    import subprocess

    fwd = _by_name(_docs(), "ClusterPortForward")["all-pods"]["spec"]["forwards"][0]
    answer = subprocess.run(
        fwd["command"], input=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", capture_output=True, timeout=10, check=True
    ).stdout
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == kwokcfg.HTTP_BODY.encode() + b"\n"
    assert f"Content-Length: {len(body)}".encode() in head


def test_resource_metrics_are_served_per_node_under_the_annotated_path() -> None:
    metric = _by_name(_docs(), "Metric")["resource-metrics"]["spec"]
    # One kwok serves every node: the node name is a path parameter, and the launcher writes each
    # node's own path into the annotation metrics-server reads.
    assert metric["path"] == "/metrics/nodes/{nodeName}/metrics/resource"
    assert kwokcfg.node_metrics_path("gpu-a-h100-0") == "/metrics/nodes/gpu-a-h100-0/metrics/resource"
    assert kwokcfg.RESOURCE_METRICS_PATH_ANNOTATION == "metrics.k8s.io/resource-metrics-path"


def test_resource_metrics_have_the_kubelet_series_metrics_server_parses() -> None:
    series = {m["name"]: m for m in _by_name(_docs(), "Metric")["resource-metrics"]["spec"]["metrics"]}
    parsed = {
        "node_cpu_usage_seconds_total": ("node", "counter"),
        "node_memory_working_set_bytes": ("node", "gauge"),
        "container_cpu_usage_seconds_total": ("container", "counter"),
        "container_memory_working_set_bytes": ("container", "gauge"),
        "container_start_time_seconds": ("container", "gauge"),
    }
    for name, (dimension, kind) in parsed.items():
        assert (series[name]["dimension"], series[name]["kind"]) == (dimension, kind), name
    labels = [label["name"] for label in series["container_cpu_usage_seconds_total"]["labels"]]
    assert labels == ["container", "namespace", "pod"]
    assert [label["name"] for label in series["pod_cpu_usage_seconds_total"]["labels"]] == ["namespace", "pod"]
    assert "labels" not in series["node_cpu_usage_seconds_total"]
    # Non-zero from the first scrape on, and a start time that never moves (metrics-server drops
    # containers whose start time goes backwards).
    assert (
        series["container_cpu_usage_seconds_total"]["value"] == 'pod.Usage("cpu", container.name) * pod.SinceSecond()'
    )
    assert series["container_start_time_seconds"]["value"] == "UnixSecond(pod.metadata.creationTimestamp)"
    # Nodes without pods still report usage (metrics-server drops a node whose CPU or memory is 0).
    assert "node.SinceSecond() * 0.05" in series["node_cpu_usage_seconds_total"]["value"]
    assert str(float(kwokcfg.NODE_SYSTEM_MEMORY_BYTES)) in series["node_memory_working_set_bytes"]["value"]


def test_every_container_uses_something_annotation_request_or_default() -> None:
    usage = _by_name(_docs(), "ClusterResourceUsage")["all-pods"]["spec"]
    assert "selector" not in usage, "every pod on a kwok node"
    [entry] = usage["usages"]
    assert "containers" not in entry, "every container"
    cpu, memory = entry["usage"]["cpu"]["expression"], entry["usage"]["memory"]["expression"]
    for expr, annotation, resource, floor, default in (
        (cpu, "kwok.x-k8s.io/usage-cpu", "cpu", "1m", kwokcfg.DEFAULT_CPU_USAGE),
        (memory, "kwok.x-k8s.io/usage-memory", "memory", "1Mi", kwokcfg.DEFAULT_MEMORY_USAGE),
    ):
        assert expr == (
            f'"{annotation}" in pod.metadata.annotations ? Quantity(pod.metadata.annotations["{annotation}"])'
            f' : "{resource}" in container.resources.requests'
            f' ? container.resources.requests["{resource}"] / 2 + Quantity("{floor}")'
            f' : Quantity("{default}")'
        )
