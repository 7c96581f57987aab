"""Pod forge: remote twins of pods/ConfigMaps/Secrets, status mirroring, terminal status, references."""

from __future__ import annotations

import copy
from typing import Any

from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_NODE_LABEL,
    ORIGIN_UID_LABEL,
    VIRTUAL_NODE_TAINT_KEY,
)
from vkprovider.forge.meta import Target, owned_by
from vkprovider.forge.pods import (
    TERMINAL_PHASES,
    Reference,
    invalid_names,
    is_terminal,
    local_status,
    references,
    remote_pod,
    remote_scheduling,
    status_differs,
    terminated_status,
)
from vkprovider.forge.reflection import remote_config_map
from vkprovider.forge.tokens import PodIdentity

UID = "7d0c4b7e-1f0a-4d7c-9d1e-3b5f0e2a9c11"
TARGET = Target(consumer="consumer-1a2b3c4d", node="gpufed-gpu-a-3f2c91d0", namespace="team-consumer-1a2b3c4d")
H100 = "NVIDIA-H100-80GB-HBM3"

SA_VOLUME: dict[str, Any] = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ],
    },
}
SA_MOUNT = {
    "name": "kube-api-access-x7k2p",
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    "readOnly": True,
}
DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
WEBHOOK_TOLERATION = {"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_RESOURCES = {
    "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
    "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
}


def admitted_pod() -> dict[str, Any]:
    """A Job's pod as the consumer's API server returns it after admission and binding."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-7x2kq",
            "generateName": "train-",
            "namespace": "team",
            "uid": UID,
            "resourceVersion": "48213",
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {"job-name": "train", "batch.kubernetes.io/controller-uid": "c1"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                "gpufed.io/offloaded-by": "webhook",
                "prometheus.io/scrape": "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": "c1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
        },
        "spec": {
            "nodeName": "gpufed-gpu-a-3f2c91d0",
            "priority": 1000,
            "priorityClassName": "team-high",
            "preemptionPolicy": "PreemptLowerPriority",
            "schedulerName": "volcano",
            "serviceAccountName": "trainer",
            "serviceAccount": "trainer",
            "restartPolicy": "Never",
            "dnsPolicy": "ClusterFirst",
            "hostname": "train-0",
            "subdomain": "train",
            "runtimeClassName": "nvidia",
            "overhead": {"cpu": "250m"},
            "securityContext": {"runAsNonRoot": True},
            "enableServiceLinks": True,
            "initContainers": [
                {
                    "name": "fetch",
                    "image": "busybox:1.36",
                    "volumeMounts": [SA_MOUNT, {"name": "data", "mountPath": "/data"}],
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.04-py3",
                    "resources": GPU_RESOURCES,
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}, SA_MOUNT],
                },
                {"name": "sidecar", "image": "busybox:1.36", "volumeMounts": [SA_MOUNT]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, SA_VOLUME],
            "nodeSelector": {"gpufed.io/type": "virtual-node", "nvidia.com/gpu.product": H100},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gpufed.io/type", "operator": "In", "values": ["virtual-node"]},
                                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]},
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [WEBHOOK_TOLERATION, GPU_TOLERATION, *DEFAULT_TOLERATIONS],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


# ---------------------------------------------------------------- remote_pod


def test_remote_pod_of_an_admitted_pod() -> None:
    local = admitted_pod()
    before = copy.deepcopy(local)
    assert remote_pod(local, TARGET) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-7x2kq",
            "namespace": "team-consumer-1a2b3c4d",
            "labels": {
                "job-name": "train",
                "batch.kubernetes.io/controller-uid": "c1",
                ORIGIN_CLUSTER_LABEL: "consumer-1a2b3c4d",
                ORIGIN_UID_LABEL: UID,
                ORIGIN_NODE_LABEL: "gpufed-gpu-a-3f2c91d0",
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "annotations": {"prometheus.io/scrape": "true"},
        },
        "spec": {
            "restartPolicy": "Never",
            "dnsPolicy": "ClusterFirst",
            "hostname": "train-0",
            "subdomain": "train",
            "runtimeClassName": "nvidia",
            "securityContext": {"runAsNonRoot": True},
            "enableServiceLinks": True,
            "automountServiceAccountToken": False,
            "initContainers": [
                {"name": "fetch", "image": "busybox:1.36", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.04-py3",
                    "resources": GPU_RESOURCES,
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
                {"name": "sidecar", "image": "busybox:1.36"},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "nodeSelector": {"nvidia.com/gpu.product": H100},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]},
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [GPU_TOLERATION],
        },
    }
    assert local == before, "the input must not be mutated"


def test_remote_pod_origin_labels_win_over_forged_local_labels() -> None:
    local = admitted_pod()
    local["metadata"]["labels"][ORIGIN_CLUSTER_LABEL] = "someone-else"
    local["metadata"]["labels"][ORIGIN_UID_LABEL] = "forged"
    labels = remote_pod(local, TARGET)["metadata"]["labels"]
    assert labels[ORIGIN_CLUSTER_LABEL] == "consumer-1a2b3c4d"
    assert labels[ORIGIN_UID_LABEL] == UID


def test_remote_pod_without_an_identity_drops_ephemeral_containers_and_any_token_projection() -> None:
    local = admitted_pod()
    local["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    local["spec"]["volumes"] = [
        {"name": "vault", "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "t"}}]}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
    ]
    local["spec"]["containers"] = [
        {"name": "c", "image": "i", "volumeMounts": [{"name": "vault", "mountPath": "/v"}]},
    ]
    local["spec"]["initContainers"] = []
    spec = remote_pod(local, TARGET, identity=None)["spec"]
    assert "ephemeralContainers" not in spec
    assert spec["volumes"] == [{"name": "cfg", "configMap": {"name": "cfg"}}]
    assert spec["containers"] == [{"name": "c", "image": "i"}]
    assert spec["automountServiceAccountToken"] is False


IDENTITY = PodIdentity(secret_name="gpufed-token-train-7x2kq", api_host="10.96.0.1", api_port=443)
API_ENV = [
    {"name": "KUBERNETES_SERVICE_HOST", "value": "10.96.0.1"},
    {"name": "KUBERNETES_SERVICE_PORT", "value": "443"},
]


def token_item(key: str, path: str) -> dict[str, Any]:
    return {"secret": {"name": "gpufed-token-train-7x2kq", "items": [{"key": key, "path": path}]}}


def test_remote_pod_with_an_identity_serves_the_token_volume_from_the_token_secret() -> None:
    local = admitted_pod()
    before = copy.deepcopy(local)
    spec = remote_pod(local, TARGET, IDENTITY)["spec"]
    # Same volume name and defaultMode, so every volumeMount (init container included) stays valid.
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {
            "name": "kube-api-access-x7k2p",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    token_item("token-0", "token"),
                    token_item("ca.crt", "ca.crt"),
                    token_item("namespace", "namespace"),
                ],
            },
        },
    ]
    assert spec["initContainers"] == [
        {
            "name": "fetch",
            "image": "busybox:1.36",
            "volumeMounts": [SA_MOUNT, {"name": "data", "mountPath": "/data"}],
            "env": API_ENV,
        }
    ]
    assert [c["volumeMounts"] for c in spec["containers"]] == [
        [{"name": "data", "mountPath": "/data"}, SA_MOUNT],
        [SA_MOUNT],
    ]
    assert [c["env"] for c in spec["containers"]] == [API_ENV, API_ENV]
    # The provider still adds no token of its own, and the consumer's service account is not named.
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    assert "serviceAccount" not in spec
    # Neither the token Secret nor the consumer's kube-root-ca.crt is a reference to copy.
    assert references(local) == []
    assert local == before, "the input must not be mutated"


def test_remote_pod_with_an_identity_still_drops_a_service_account_volume_without_a_token() -> None:
    local = admitted_pod()
    ca_only = {"name": "kube-api-access-old", "projected": {"sources": [SA_VOLUME["projected"]["sources"][1]]}}
    local["spec"]["volumes"] = [SA_VOLUME, ca_only]
    spec = remote_pod(local, TARGET, IDENTITY)["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["kube-api-access-x7k2p"]


def test_remote_pod_without_volumes_has_no_volumes_key() -> None:
    local = admitted_pod()
    local["spec"]["volumes"] = [SA_VOLUME]
    assert "volumes" not in remote_pod(local, TARGET)["spec"]


def required_terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": list(values)}


def spec_with_affinity(affinity: dict[str, Any]) -> dict[str, Any]:
    local = admitted_pod()
    local["spec"]["affinity"] = affinity
    spec: dict[str, Any] = remote_pod(local, TARGET)["spec"]
    return spec


def test_required_term_that_becomes_empty_drops_the_whole_required_block() -> None:
    # Term 1 was satisfied by the virtual node alone; term 2 is another OR branch. An empty term would
    # match NO node, so the block goes: nothing is left to require remotely.
    spec = spec_with_affinity(
        required_terms(
            {"matchExpressions": [expr("gpufed.io/type", "virtual-node"), expr("type", "virtual-kubelet")]},
            {"matchExpressions": [expr("topology.kubernetes.io/zone", "eu-1")]},
        )
    )
    assert "affinity" not in spec


def test_required_term_made_of_virtual_fields_and_hostname_becomes_empty() -> None:
    spec = spec_with_affinity(
        required_terms(
            {
                "matchExpressions": [expr("kubernetes.io/hostname", "gpufed-x"), expr("kubernetes.io/role", "agent")],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpufed-x"]}],
            }
        )
    )
    assert "affinity" not in spec


def test_required_terms_that_keep_requirements_are_kept_and_other_affinities_untouched() -> None:
    pod_anti = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }
    affinity = required_terms(
        {"matchExpressions": [expr(ORIGIN_CLUSTER_LABEL.replace("origin", "remote"), "p"), expr("zone", "a")]},
        {"matchExpressions": [expr("zone", "b")]},
    )
    affinity["podAntiAffinity"] = pod_anti
    spec = spec_with_affinity(affinity)
    assert spec["affinity"] == {
        **required_terms({"matchExpressions": [expr("zone", "a")]}, {"matchExpressions": [expr("zone", "b")]}),
        "podAntiAffinity": pod_anti,
    }


def test_preferred_terms_that_become_empty_are_dropped() -> None:
    spec = spec_with_affinity(
        {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "preference": {"matchExpressions": [expr("gpufed.io/remote-cluster-id", "p")]}},
                    {
                        "weight": 10,
                        "preference": {
                            "matchExpressions": [
                                expr("gpufed.io/type", "virtual-node"),
                                expr("nvidia.com/gpu.product", H100),
                            ]
                        },
                    },
                ]
            }
        }
    )
    assert spec["affinity"] == {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [expr("nvidia.com/gpu.product", H100)]}}
            ]
        }
    }


def test_all_preferred_terms_empty_drops_affinity() -> None:
    spec = spec_with_affinity(
        {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [expr("gpufed.io/type", "virtual-node")]}}
                ]
            }
        }
    )
    assert "affinity" not in spec


def test_node_selector_of_only_virtual_keys_is_dropped() -> None:
    local = admitted_pod()
    local["spec"]["nodeSelector"] = {"type": "virtual-kubelet", "kubernetes.io/hostname": "gpufed-x"}
    assert "nodeSelector" not in remote_pod(local, TARGET)["spec"]


def test_user_tuned_not_ready_toleration_is_kept() -> None:
    local = admitted_pod()
    tuned = {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 30,
    }
    local["spec"]["tolerations"] = [WEBHOOK_TOLERATION, tuned, DEFAULT_TOLERATIONS[1]]
    assert remote_pod(local, TARGET)["spec"]["tolerations"] == [tuned]


def test_only_webhook_and_default_tolerations_leave_none() -> None:
    local = admitted_pod()
    local["spec"]["tolerations"] = [WEBHOOK_TOLERATION, *DEFAULT_TOLERATIONS]
    assert "tolerations" not in remote_pod(local, TARGET)["spec"]


# ---------------------------------------------------------------- status


def remote_running() -> dict[str, Any]:
    return {
        "metadata": {"name": "train-7x2kq"},
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "nominatedNodeName": "gpu-node-3",
            "hostIP": "192.168.5.10",
            "hostIPs": [{"ip": "192.168.5.10"}],
            "podIP": "10.244.1.7",
            "podIPs": [{"ip": "10.244.1.7"}, {"ip": "fd00::7"}],
            "startTime": "2024-05-01T10:00:05Z",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": "t0"},
                {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": "t2"},
            ],
            "initContainerStatuses": [
                {
                    "name": "fetch",
                    "ready": True,
                    "restartCount": 0,
                    "image": "busybox:1.36",
                    "imageID": "sha256:1",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": "t1"}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "nvcr.io/nvidia/pytorch:24.04-py3",
                    "imageID": "sha256:2",
                    "containerID": "containerd://abc",
                    "state": {"running": {"startedAt": "2024-05-01T10:01:00Z"}},
                }
            ],
        },
    }


def sent(patch: Any) -> Any:
    """`patch` without the nulls that name the container states left behind (checked on their own in
    test_container_states_name_the_states_left_behind): what the API server stores afterwards."""
    if isinstance(patch, dict):
        return {
            k: ({sk: sv for sk, sv in v.items() if sv is not None} if k in ("state", "lastState") else sent(v))
            for k, v in patch.items()
        }
    if isinstance(patch, list):
        return [sent(v) for v in patch]
    return patch


def test_container_states_name_the_states_left_behind() -> None:
    remote = remote_running()
    status = local_status(remote, admitted_pod(), host_ip="h")["status"]
    assert status["containerStatuses"][0]["state"] == {
        "waiting": None,
        "running": {"startedAt": "2024-05-01T10:01:00Z"},
        "terminated": None,
    }
    final = terminated_status(admitted_pod(), remote, now=NOW, message="m")["status"]
    assert final["containerStatuses"][0]["state"]["running"] is None
    assert final["containerStatuses"][0]["state"]["waiting"] is None
    assert final["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def translate(ip: str) -> str:
    return {"10.244.1.7": "10.71.1.7"}.get(ip, ip)


def test_local_status_mirrors_remote_and_translates_ips() -> None:
    remote = remote_running()
    patch = sent(local_status(remote, admitted_pod(), host_ip="172.18.0.5", to_local_ip=translate))
    assert patch == {
        "status": {
            "phase": "Running",
            "reason": None,
            "message": None,
            "conditions": remote["status"]["conditions"],
            "initContainerStatuses": remote["status"]["initContainerStatuses"],
            "containerStatuses": remote["status"]["containerStatuses"],
            "startTime": "2024-05-01T10:00:05Z",
            "podIP": "10.71.1.7",
            "podIPs": [{"$patch": "replace"}, {"ip": "10.71.1.7"}, {"ip": "fd00::7"}],
            "hostIP": "172.18.0.5",
            "hostIPs": [{"$patch": "replace"}, {"ip": "172.18.0.5"}],
        }
    }
    assert "qosClass" not in patch["status"] and "nominatedNodeName" not in patch["status"]


def test_local_status_of_a_pending_remote_keeps_reason_and_clears_ips() -> None:
    remote = {
        "status": {
            "phase": "Pending",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    }
    assert local_status(remote, admitted_pod(), host_ip="") == {
        "status": {
            "phase": "Pending",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            "podIP": None,
            "podIPs": None,
            "hostIP": None,
            "hostIPs": None,
        }
    }


def test_local_readiness_gates_hold_ready_false_until_true_locally() -> None:
    local = admitted_pod()
    local["spec"]["readinessGates"] = [{"conditionType": "lb.example.com/ready"}]
    assert "readinessGates" not in remote_pod(local, TARGET)["spec"]
    ready = next(
        c for c in local_status(remote_running(), local, host_ip="h")["status"]["conditions"] if c["type"] == "Ready"
    )
    assert ready == {
        "type": "Ready",
        "status": "False",
        "reason": "ReadinessGatesNotReady",
        "message": 'corresponding condition of pod readiness gate "lb.example.com/ready" does not exist.',
        "lastProbeTime": None,
        "lastTransitionTime": "t2",
    }
    local["status"]["conditions"] = [{"type": "lb.example.com/ready", "status": "True"}]
    ready = next(
        c for c in local_status(remote_running(), local, host_ip="h")["status"]["conditions"] if c["type"] == "Ready"
    )
    assert ready["status"] == "True"


def applied(patch: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """What the API server would hold after the patch (enough of strategic merge for these tests)."""
    out = copy.deepcopy(local)
    status = out.setdefault("status", {})
    for key, value in patch["status"].items():
        if value is None:
            status.pop(key, None)
        elif key == "conditions":
            by_type = {c["type"]: c for c in status.get("conditions", [])}
            for condition in value:
                by_type[condition["type"]] = condition
            status["conditions"] = list(by_type.values())
        elif isinstance(value, list):
            status[key] = sent([v for v in value if "$patch" not in v])
        else:
            status[key] = value
    return out


def test_status_differs() -> None:
    local = admitted_pod()
    patch = local_status(remote_running(), local, host_ip="172.18.0.5", to_local_ip=translate)
    assert status_differs(patch, local)
    synced = applied(patch, local)
    assert synced["status"]["qosClass"] == "Burstable"
    assert not status_differs(patch, synced)

    # lastProbeTime noise is no change...
    noisy = copy.deepcopy(remote_running())
    noisy["status"]["conditions"][1]["lastProbeTime"] = "2024-05-01T11:00:00Z"
    assert not status_differs(local_status(noisy, synced, host_ip="172.18.0.5", to_local_ip=translate), synced)
    # ...but a new IP, a container restart, a condition flip, a new host IP are.
    moved = copy.deepcopy(remote_running())
    moved["status"]["podIPs"] = [{"ip": "10.244.9.9"}]
    assert status_differs(local_status(moved, synced, host_ip="172.18.0.5", to_local_ip=translate), synced)
    restarted = copy.deepcopy(remote_running())
    restarted["status"]["containerStatuses"][0]["restartCount"] = 1
    assert status_differs(local_status(restarted, synced, host_ip="172.18.0.5", to_local_ip=translate), synced)
    flipped = copy.deepcopy(remote_running())
    flipped["status"]["conditions"][1]["status"] = "False"
    assert status_differs(local_status(flipped, synced, host_ip="172.18.0.5", to_local_ip=translate), synced)
    assert status_differs(local_status(remote_running(), synced, host_ip="172.18.0.6", to_local_ip=translate), synced)


def test_status_differs_null_against_absent_is_no_change() -> None:
    local = {"status": {"phase": "Pending"}}
    assert not status_differs({"status": {"phase": "Pending", "reason": None, "podIPs": None}}, local)
    assert status_differs({"status": {"reason": None}}, {"status": {"reason": "Evicted"}})


def test_is_terminal() -> None:
    assert frozenset({"Succeeded", "Failed"}) == TERMINAL_PHASES
    assert is_terminal({"status": {"phase": "Failed"}})
    assert not is_terminal({"status": {"phase": "Running"}})
    assert not is_terminal({})


# ---------------------------------------------------------------- terminated_status


NOW = "2024-05-01T12:00:00Z"


def test_terminated_status_of_a_pending_pod_without_remote() -> None:
    assert sent(terminated_status(admitted_pod(), None, now=NOW, message="deleted")) == {
        "status": {
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.04-py3",
                    "imageID": "",
                    "restartCount": 0,
                    "ready": False,
                    "started": False,
                    "state": {
                        "terminated": {"exitCode": 137, "reason": "Killed", "message": "deleted", "finishedAt": NOW}
                    },
                },
                {
                    "name": "sidecar",
                    "image": "busybox:1.36",
                    "imageID": "",
                    "restartCount": 0,
                    "ready": False,
                    "started": False,
                    "state": {
                        "terminated": {"exitCode": 137, "reason": "Killed", "message": "deleted", "finishedAt": NOW}
                    },
                },
            ],
            "initContainerStatuses": [
                {
                    "name": "fetch",
                    "image": "busybox:1.36",
                    "imageID": "",
                    "restartCount": 0,
                    "ready": False,
                    "started": False,
                    "state": {
                        "terminated": {"exitCode": 137, "reason": "Killed", "message": "deleted", "finishedAt": NOW}
                    },
                }
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "PodDeleted",
                    "lastProbeTime": None,
                    "lastTransitionTime": NOW,
                },
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "reason": "PodDeleted",
                    "lastProbeTime": None,
                    "lastTransitionTime": NOW,
                },
            ],
        }
    }


def test_terminated_status_uses_remote_terminated_states_and_running_start_times() -> None:
    remote = remote_running()
    # The remote saw the trainer exit on its own before the delete.
    remote["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "startedAt": "s", "finishedAt": "f"}
    }
    local = admitted_pod()
    mirrored = local_status(remote_running(), local, host_ip="h")["status"]
    local["status"].update(mirrored)
    local["status"]["containerStatuses"] = copy.deepcopy(remote_running()["status"]["containerStatuses"])
    local["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastTransitionTime": "t2"},
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": "t3"},
    ]
    local_before = copy.deepcopy(local)
    status = sent(terminated_status(local, remote, now=NOW, message="gone"))["status"]
    assert local == local_before
    assert "phase" not in status
    trainer, sidecar = status["containerStatuses"]
    assert trainer == {
        **remote_running()["status"]["containerStatuses"][0],
        "ready": False,
        "started": False,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "s", "finishedAt": "f"}},
    }
    assert sidecar["state"] == {
        "terminated": {"exitCode": 137, "reason": "Killed", "message": "gone", "finishedAt": NOW}
    }
    # The init container had already terminated locally: kept exactly.
    assert status["initContainerStatuses"] == remote_running()["status"]["initContainerStatuses"]
    # Ready transitions now; ContainersReady was already False and keeps its transition time.
    assert [(c["type"], c["lastTransitionTime"]) for c in status["conditions"]] == [
        ("Ready", NOW),
        ("ContainersReady", "t3"),
    ]


def test_terminated_status_killed_running_container_keeps_start_time() -> None:
    local = admitted_pod()
    local["status"]["containerStatuses"] = copy.deepcopy(remote_running()["status"]["containerStatuses"])
    trainer = sent(terminated_status(local, remote_running(), now=NOW, message="m"))["status"]["containerStatuses"][0]
    assert trainer["state"] == {
        "terminated": {
            "exitCode": 137,
            "reason": "Killed",
            "message": "m",
            "startedAt": "2024-05-01T10:01:00Z",
            "finishedAt": NOW,
        }
    }
    assert trainer["containerID"] == "containerd://abc"


# ---------------------------------------------------------------- references


def test_references_from_every_place_deduplicated_and_sorted() -> None:
    pod = {
        "spec": {
            "volumes": [
                SA_VOLUME,
                {"name": "a", "configMap": {"name": "app-config"}},
                {"name": "b", "secret": {"secretName": "tls", "optional": True}},
                {
                    "name": "c",
                    "projected": {
                        "sources": [
                            {"configMap": {"name": "bundle", "optional": True}},
                            {"secret": {"name": "creds"}},
                            {"downwardAPI": {"items": []}},
                        ]
                    },
                },
                {"name": "d", "emptyDir": {}},
            ],
            "initContainers": [
                {"name": "i", "envFrom": [{"configMapRef": {"name": "env-cm", "optional": True}}]},
            ],
            "containers": [
                {
                    "name": "c",
                    "env": [
                        {"name": "A", "value": "x"},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "tls", "key": "k"}}},
                        {
                            "name": "C",
                            "valueFrom": {"configMapKeyRef": {"name": "bundle", "key": "k", "optional": True}},
                        },
                        {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "envFrom": [{"secretRef": {"name": "env-secret"}}],
                }
            ],
            "ephemeralContainers": [
                {"name": "e", "envFrom": [{"configMapRef": {"name": "debug-cm"}}]},
            ],
            "imagePullSecrets": [{"name": "registry"}, {"name": "creds"}],
        }
    }
    assert references(pod) == [
        Reference("ConfigMap", "app-config", False),
        Reference("ConfigMap", "bundle", True),
        Reference("ConfigMap", "debug-cm", False),
        Reference("ConfigMap", "env-cm", True),
        Reference("Secret", "creds", False),  # required by the volume, optional as a pull secret
        Reference("Secret", "env-secret", False),
        Reference("Secret", "registry", True),
        Reference("Secret", "tls", False),  # optional volume, required env
    ]


def test_references_of_the_admitted_pod_skip_the_service_account_volume() -> None:
    assert references(admitted_pod()) == []


# ---------------------------------------------------------------- owned_by


def local_object(kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": "app",
            "namespace": "team",
            "uid": "u-1",
            "resourceVersion": "9",
            "labels": {"app": "x"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "note": "keep"},
            "ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "d1"}],
        },
        **fields,
    }


ORIGIN = {ORIGIN_CLUSTER_LABEL: "consumer-1a2b3c4d", ORIGIN_UID_LABEL: "u-1", MANAGED_BY_LABEL: MANAGED_BY}


def test_owned_by() -> None:
    twin = remote_pod(admitted_pod(), TARGET)
    assert owned_by(twin, "consumer-1a2b3c4d")
    assert owned_by(twin, "consumer-1a2b3c4d", UID)
    assert not owned_by(twin, "consumer-1a2b3c4d", "other-uid")
    assert not owned_by(twin, "consumer-ffffffff")
    assert not owned_by({"metadata": {"name": "x"}}, "consumer-1a2b3c4d")
    config_map = remote_config_map(local_object("ConfigMap", data={}), TARGET)
    assert config_map is not None and owned_by(config_map, "consumer-1a2b3c4d", "u-1")
    assert ORIGIN_NODE_LABEL not in config_map["metadata"]["labels"]


# ---------------------------------------------------------------- names and addresses from peers


def test_invalid_names_catch_a_traversal_in_any_reference() -> None:
    pod = admitted_pod()
    assert invalid_names(pod) == []
    pod["spec"]["imagePullSecrets"] = [{"name": "../../gpufed/secrets/x"}]
    pod["spec"]["volumes"].append({"name": "v", "configMap": {"name": "a/b"}})
    pod["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "E", "valueFrom": {"secretKeyRef": {"name": "..", "key": "k"}}}
    )
    pod["spec"]["serviceAccountName"] = "../default"
    assert invalid_names(pod) == [
        "ConfigMap 'a/b'",
        "Secret '..'",
        "Secret '../../gpufed/secrets/x'",
        "ServiceAccount '../default'",
    ]


def test_local_status_leaves_out_a_refused_address() -> None:
    refused = local_status(remote_running(), {}, host_ip="192.0.2.10", to_local_ip=lambda ip: None)
    assert refused["status"]["podIP"] is None and refused["status"]["podIPs"] is None
    some = local_status(
        remote_running(), {}, host_ip="192.0.2.10", to_local_ip=lambda ip: None if ip == "10.244.1.7" else ip
    )
    assert some["status"]["podIP"] == "fd00::7"


def test_remote_scheduling_leaves_out_what_only_the_virtual_node_satisfies() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "w-0"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpufed-gpu-a", "nvidia.com/gpu.product": "NVIDIA-H100"},
            "containers": [{"name": "c"}],
        },
    }
    out = remote_scheduling(pod)
    assert out["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100"}
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "gpufed-gpu-a", "the input is not changed"
