"""kwok configuration for local clusters: lifecycle stages and kubelet-API simulation.

Owns: the Stage objects that make kwok's fake nodes Ready (with leases) and walk pods through
Pending -> Running -> Succeeded/Failed, the ClusterLogs / ClusterExec / ClusterPortForward
objects that let kwok's kubelet endpoint serve `kubectl logs`, `exec` and `port-forward` for fake
pods, and the Metric / ClusterResourceUsage objects that make it serve simulated kubelet resource
metrics (what metrics-server scrapes for `kubectl top`).

Pod lifecycle on a kwok node:
- every pod becomes Running with an IP from its node's `spec.podCIDR`;
- a pod whose `restartPolicy` is `Never` or `OnFailure` (every Job pod, and the remote twin of
  one) terminates after the topology's `jobSeconds`, or after the duration in its annotation
  `local.gpufed.io/run-duration` (e.g. "30s"): exit code 0 -> Succeeded, or the code in
  `local.gpufed.io/exit-code` -> Failed; pods with `restartPolicy: Always` keep running;
- deleted pods disappear once their finalizers are gone.

Exec runs commands on this machine as user nobody in a scratch directory: it exists so that later
issues can prove the exec path end to end, and it is only ever bound to loopback.
Port-forward connects port 8080 to a one-shot HTTP responder (`sh`: reads the request head,
answers 200 with a line of text) and every other port to `cat`, i.e. an echo server, for the same
reason. Attach follows the file `attach.log` beside the logs file (append CRI-format lines to it
to see them arrive in `kubectl attach`).

Resource metrics: one kwok process serves every fake node of a cluster on one port, so each node's
metrics live under its own path, `node_metrics_path(node)`; the launcher puts that path in the
node's annotation `metrics.k8s.io/resource-metrics-path`, which metrics-server uses instead of
`/metrics/resource`. Every container of a pod on a kwok node uses, per resource, the quantity in
the pod annotation `kwok.x-k8s.io/usage-cpu` / `kwok.x-k8s.io/usage-memory` (kwok's own
convention), else half its request plus 1m / 1Mi, else 10m CPU and 32Mi memory — never zero, so
metrics-server never drops a pod. Cumulative CPU is usage x seconds since the pod was created, so
the first scrape already counts; a node adds a constant system share (50m, 256Mi) to its pods'
sum, so empty nodes report usage too.

Pure: builds YAML text, does no I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RUN_DURATION_ANNOTATION = "local.gpufed.io/run-duration"
EXIT_CODE_ANNOTATION = "local.gpufed.io/exit-code"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_API = "kwok.x-k8s.io/v1alpha1"
NOBODY_UID = 65534
#: Node annotation metrics-server reads the resource-metrics path from (default `/metrics/resource`).
RESOURCE_METRICS_PATH_ANNOTATION = "metrics.k8s.io/resource-metrics-path"
#: Pod annotations with the CPU / memory usage every container of the pod reports (kwok's convention).
USAGE_CPU_ANNOTATION = "kwok.x-k8s.io/usage-cpu"
USAGE_MEMORY_ANNOTATION = "kwok.x-k8s.io/usage-memory"
#: Usage of a container without annotation or request.
DEFAULT_CPU_USAGE = "10m"
DEFAULT_MEMORY_USAGE = "32Mi"
#: What every node uses besides its pods (the kubelet, the runtime, the OS), in cores and bytes.
NODE_SYSTEM_CPU_CORES = 0.05
NODE_SYSTEM_MEMORY_BYTES = 256 * 1024 * 1024

_NODE_CONDITIONS = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
"""

_NODE_INIT = (
    _NODE_CONDITIONS
    + """\
allocatable:
{{ with .status.allocatable }}{{ YAML . 1 }}{{ else }}  cpu: "1"
{{ end }}
capacity:
{{ with .status.capacity }}{{ YAML . 1 }}{{ else }}  cpu: "1"
{{ end }}
nodeInfo:
  architecture: amd64
  bootID: ""
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: ""
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  machineID: ""
  operatingSystem: linux
  osImage: gpufed local (kwok)
  systemUUID: ""
phase: Running
"""
)

_POD_RUNNING = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _pod_terminated(phase: str, exit_code: str, reason: str) -> str:
    return (
        """\
{{ $now := Now }}
{{ $started := or .status.startTime $now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
  reason: PodCompleted
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: ContainersReady
  reason: PodCompleted
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
"""
        + f"      exitCode: {exit_code}\n      reason: {reason}\n"
        + """\
      startedAt: {{ $started | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
"""
        + f"phase: {phase}\n"
    )


def _expr(key: str, op: str, values: list[str] | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values is not None:
        e["values"] = values
    return e


def _stage(
    name: str, kind: str, exprs: list[dict[str, Any]], nxt: dict[str, Any], delay: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": exprs},
        "next": nxt,
    }
    if delay:
        spec["delay"] = delay
    return {"apiVersion": KWOK_API, "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def stages(job_seconds: float) -> list[dict[str, Any]]:
    """The lifecycle stages; `job_seconds` is how long run-to-completion pods run by default."""
    ready = '.status.conditions.[] | select( .type == "Ready" ) | .status'
    run_delay = {
        "durationMilliseconds": round(job_seconds * 1000),
        "durationFrom": {"expressionFrom": f'.metadata.annotations["{RUN_DURATION_ANNOTATION}"]'},
    }
    finite = _expr(".spec.restartPolicy", "In", ["Never", "OnFailure"])
    alive = _expr(".metadata.deletionTimestamp", "DoesNotExist")
    running = _expr(".status.phase", "In", ["Running"])
    exit_code = f'.metadata.annotations["{EXIT_CODE_ANNOTATION}"]'
    return [
        _stage("node-initialize", "Node", [_expr(ready, "NotIn", ["True"])], {"statusTemplate": _NODE_INIT}),
        _stage(
            "node-heartbeat",
            "Node",
            [_expr(".status.phase", "In", ["Running"]), _expr(ready, "In", ["True"])],
            {"statusTemplate": _NODE_CONDITIONS},
            {"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000},
        ),
        _stage(
            "pod-running",
            "Pod",
            [
                alive,
                _expr(".status.phase", "In", ["Pending"]),
                _expr(".status.containerStatuses.[].state.running.startedAt", "DoesNotExist"),
            ],
            {"statusTemplate": _POD_RUNNING},
        ),
        _stage(
            "pod-succeed",
            "Pod",
            [alive, running, finite, _expr(exit_code, "DoesNotExist")],
            {"statusTemplate": _pod_terminated("Succeeded", "0", "Completed")},
            run_delay,
        ),
        _stage(
            "pod-fail",
            "Pod",
            [alive, running, finite, _expr(exit_code, "Exists")],
            {
                "statusTemplate": _pod_terminated(
                    "Failed", '{{ index $.metadata.annotations "' + EXIT_CODE_ANNOTATION + '" }}', "Error"
                )
            },
            run_delay,
        ),
        _stage(
            "pod-delete",
            "Pod",
            [_expr(".metadata.deletionTimestamp", "Exists"), _expr(".metadata.finalizers", "DoesNotExist")],
            {"delete": True},
        ),
    ]


#: Port on which fake pods answer HTTP through port-forward.
HTTP_PORT = 8080
HTTP_BODY = "gpufed local port-forward: HTTP answered on port 8080"
_HTTP_RESPONDER = (
    "cr=$(printf '\\r'); "
    'while IFS= read -r l; do [ "$l" = "$cr" ] || [ -z "$l" ] && break; done; '
    f"body='{HTTP_BODY}'; "
    "printf 'HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: %d\\r\\n"
    'Connection: close\\r\\n\\r\\n%s\\n\' $((${#body}+1)) "$body"'
)


def attach_file(logs_file: Path) -> Path:
    """The file `kubectl attach` follows (beside the logs file)."""
    return logs_file.with_name("attach.log")


def kubelet_api_objects(logs_file: Path, exec_dir: Path, *, run_as_nobody: bool) -> list[dict[str, Any]]:
    """ClusterLogs, ClusterAttach, ClusterExec and ClusterPortForward for every fake pod.

    `run_as_nobody` drops exec'd commands to uid/gid 65534 (needs root, which is when it matters).
    """
    local: dict[str, Any] = {"workDir": str(exec_dir)}
    if run_as_nobody:
        local["securityContext"] = {"runAsUser": NOBODY_UID, "runAsGroup": NOBODY_UID}
    return [
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterLogs",
            "metadata": {"name": "all-pods"},
            "spec": {"logs": [{"logsFile": str(logs_file), "follow": True}]},
        },
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterAttach",
            "metadata": {"name": "all-pods"},
            "spec": {"attaches": [{"logsFile": str(attach_file(logs_file))}]},
        },
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterExec",
            "metadata": {"name": "all-pods"},
            "spec": {"execs": [{"local": local}]},
        },
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterPortForward",
            "metadata": {"name": "all-pods"},
            "spec": {
                "forwards": [{"ports": [HTTP_PORT], "command": ["sh", "-c", _HTTP_RESPONDER]}, {"command": ["cat"]}]
            },
        },
    ]


def node_metrics_path(node: str) -> str:
    """Where kwok serves `node`'s resource metrics (the `Metric` below, with {nodeName} filled in)."""
    return f"/metrics/nodes/{node}/metrics/resource"


def _usage_expression(resource: str, annotation: str, floor: str, default: str) -> str:
    """CEL for one container's usage of `resource`: annotation, else request / 2 + floor, else default."""
    return (
        f'"{annotation}" in pod.metadata.annotations'
        f' ? Quantity(pod.metadata.annotations["{annotation}"])'
        f' : "{resource}" in container.resources.requests'
        f' ? container.resources.requests["{resource}"] / 2 + Quantity("{floor}")'
        f' : Quantity("{default}")'
    )


def resource_usage() -> dict[str, Any]:
    """ClusterResourceUsage: what every container on a kwok node uses (see the module docstring)."""
    return {
        "apiVersion": KWOK_API,
        "kind": "ClusterResourceUsage",
        "metadata": {"name": "all-pods"},
        "spec": {
            "usages": [
                {
                    "usage": {
                        "cpu": {"expression": _usage_expression("cpu", USAGE_CPU_ANNOTATION, "1m", DEFAULT_CPU_USAGE)},
                        "memory": {
                            "expression": _usage_expression(
                                "memory", USAGE_MEMORY_ANNOTATION, "1Mi", DEFAULT_MEMORY_USAGE
                            )
                        },
                    }
                }
            ]
        },
    }


def _metric(name: str, dimension: str, kind: str, value: str, help_text: str) -> dict[str, Any]:
    """One series of a kwok Metric; container and pod series carry the kubelet's labels."""
    m: dict[str, Any] = {"name": name, "dimension": dimension, "kind": kind, "help": help_text, "value": value}
    if dimension in ("container", "pod"):
        labels = [
            {"name": "namespace", "value": "pod.metadata.namespace"},
            {"name": "pod", "value": "pod.metadata.name"},
        ]
        if dimension == "container":
            labels.insert(0, {"name": "container", "value": "container.name"})
        m["labels"] = labels
    return m


def resource_metrics() -> dict[str, Any]:
    """The kubelet's `/metrics/resource` for every kwok node, at `node_metrics_path(node)`.

    The series and labels are the kubelet's (what metrics-server parses). Containers count CPU as
    usage x age, which is what a constant usage since the start amounts to, and is already non-zero
    at the first scrape and after a kwok restart; their start time is the pod's creation.
    """
    since = "pod.SinceSecond()"
    node_cpu = f'node.CumulativeUsage("cpu") + node.SinceSecond() * {NODE_SYSTEM_CPU_CORES}'
    node_memory = f'node.Usage("memory") + {float(NODE_SYSTEM_MEMORY_BYTES)}'
    return {
        "apiVersion": KWOK_API,
        "kind": "Metric",
        "metadata": {"name": "resource-metrics"},
        "spec": {
            "path": node_metrics_path("{nodeName}"),
            "metrics": [
                _metric("scrape_error", "node", "gauge", "0", "1 if there was an error while getting metrics"),
                _metric(
                    "container_start_time_seconds",
                    "container",
                    "gauge",
                    "UnixSecond(pod.metadata.creationTimestamp)",
                    "Start time of the container since unix epoch in seconds",
                ),
                _metric(
                    "container_cpu_usage_seconds_total",
                    "container",
                    "counter",
                    f'pod.Usage("cpu", container.name) * {since}',
                    "Cumulative cpu time consumed by the container in core-seconds",
                ),
                _metric(
                    "container_memory_working_set_bytes",
                    "container",
                    "gauge",
                    'pod.Usage("memory", container.name)',
                    "Current working set of the container in bytes",
                ),
                _metric(
                    "pod_cpu_usage_seconds_total",
                    "pod",
                    "counter",
                    f'pod.Usage("cpu") * {since}',
                    "Cumulative cpu time consumed by the pod in core-seconds",
                ),
                _metric(
                    "pod_memory_working_set_bytes",
                    "pod",
                    "gauge",
                    'pod.Usage("memory")',
                    "Current working set of the pod in bytes",
                ),
                _metric(
                    "node_cpu_usage_seconds_total",
                    "node",
                    "counter",
                    node_cpu,
                    "Cumulative cpu time consumed by the node in core-seconds",
                ),
                _metric(
                    "node_memory_working_set_bytes",
                    "node",
                    "gauge",
                    node_memory,
                    "Current working set of the node in bytes",
                ),
            ],
        },
    }


def render(job_seconds: float, logs_file: Path, exec_dir: Path, *, run_as_nobody: bool) -> str:
    """The whole kwok --config file."""
    docs = (
        stages(job_seconds)
        + kubelet_api_objects(logs_file, exec_dir, run_as_nobody=run_as_nobody)
        + [resource_usage(), resource_metrics()]
    )
    return yaml.safe_dump_all(docs, sort_keys=False)
