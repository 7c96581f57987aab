"""kwok configuration for local clusters: lifecycle stages and kubelet-API simulation.

Owns: the Stage objects that make kwok's fake nodes Ready (with leases) and walk pods through
Pending -> Running -> Succeeded/Failed, and the ClusterLogs / ClusterExec / ClusterPortForward
objects that let kwok's kubelet endpoint serve `kubectl logs`, `exec` and `port-forward` for fake
pods.

Pod lifecycle on a kwok node:
- every pod becomes Running with an IP from its node's `spec.podCIDR`;
- a pod whose `restartPolicy` is `Never` or `OnFailure` (every Job pod, and the remote twin of
  one) terminates after the topology's `jobSeconds`, or after the duration in its annotation
  `local.gpufed.io/run-duration` (e.g. "30s"): exit code 0 -> Succeeded, or the code in
  `local.gpufed.io/exit-code` -> Failed; pods with `restartPolicy: Always` keep running;
- deleted pods disappear once their finalizers are gone.

Exec runs commands on this machine as user nobody in a scratch directory: it exists so that later
issues can prove the exec path end to end, and it is only ever bound to loopback.
Port-forward connects each stream to `cat`, i.e. an echo server, for the same reason.

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


def kubelet_api_objects(logs_file: Path, exec_dir: Path, *, run_as_nobody: bool) -> list[dict[str, Any]]:
    """ClusterLogs, ClusterExec and ClusterPortForward for every fake pod.

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
            "kind": "ClusterExec",
            "metadata": {"name": "all-pods"},
            "spec": {"execs": [{"local": local}]},
        },
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterPortForward",
            "metadata": {"name": "all-pods"},
            "spec": {"forwards": [{"command": ["cat"]}]},
        },
    ]


def render(job_seconds: float, logs_file: Path, exec_dir: Path, *, run_as_nobody: bool) -> str:
    """The whole kwok --config file."""
    docs = stages(job_seconds) + kubelet_api_objects(logs_file, exec_dir, run_as_nobody=run_as_nobody)
    return yaml.safe_dump_all(docs, sort_keys=False)
