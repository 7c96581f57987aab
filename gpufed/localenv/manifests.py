"""The plain workloads the demo, the e2e tests and the benchmarks create: nothing gpufed-specific.

Owns: `job`, the one builder of a batch/v1 Job (one container; GPUs as a limit, other requests,
completions and parallelism, backoff limit, labels on the Job and on its pods, pod annotations, a
node selector), the demo's GPU Job (deploy/examples/gpu-job.yaml, object for object), the demo's
Deployment of inference servers with its ClusterIP Service, and how manifests are shown (YAML).

Every field appears only when it is asked for, so a caller gets exactly the object it would have
written by hand. Pure: builds dicts and YAML text, does no I/O. Does not: create anything (`kubectl
create`, the e2e fixtures and the benchmarks' clients do), or know about virtual nodes: the
consumer's scheduler and gpufed's offloading webhook place these pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpufed.apis.pool import GPU_RESOURCE

#: The image of the GPU Jobs (kwok runs no image: any name does; this is what a user would write).
TRAINING_IMAGE = "nvcr.io/nvidia/pytorch:24.01-py3"
#: The image of the demo's inference servers.
INFERENCE_IMAGE = "nvcr.io/nvidia/tritonserver:24.01-py3"
#: The demo's GPU Job and its Deployment (and Service).
JOB = "train"
APP = "inference"
#: The inference server's port, and the Service's port in front of it.
HTTP_PORT = 8080
SERVICE_PORT = 80


def job(
    name: str,
    namespace: str,
    *,
    gpus: int | str | None = None,
    requests: Mapping[str, str] | None = None,
    image: str = TRAINING_IMAGE,
    container: str = "main",
    command: Sequence[str] | None = None,
    completions: int | None = None,
    parallelism: int | None = None,
    backoff_limit: int = 0,
    labels: Mapping[str, str] | None = None,
    pod_labels: Mapping[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A batch/v1 Job of one container that never restarts.

    `gpus` is written as the container's GPU limit as given (an int as YAML writes it, or a quantity
    string); `requests` become its resource requests. `labels` go on the Job, `pod_labels` and
    `pod_annotations` on its pod template (a template `metadata` only when either is given, even
    empty). Fields left out (None) are absent from the object."""
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if gpus is not None:
        resources["limits"] = {GPU_RESOURCE: gpus}
    main: dict[str, Any] = {"name": container, "image": image}
    if command is not None:
        main["command"] = list(command)
    if resources:
        main["resources"] = resources
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [main]}
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    template: dict[str, Any] = {}
    if pod_labels is not None or pod_annotations is not None:
        template["metadata"] = {}
        if pod_labels is not None:
            template["metadata"]["labels"] = dict(pod_labels)
        if pod_annotations is not None:
            template["metadata"]["annotations"] = dict(pod_annotations)
    template["spec"] = pod
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = dict(labels)
    spec: dict[str, Any] = {}
    if completions is not None:
        spec["completions"] = completions
    if parallelism is not None:
        spec["parallelism"] = parallelism
    spec["backoffLimit"] = backoff_limit
    spec["template"] = template
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def job_manifest(namespace: str) -> dict[str, Any]:
    """deploy/examples/gpu-job.yaml: a plain GPU Job, nothing gpufed-specific (3 completions x 2 GPUs)."""
    return job(
        JOB,
        namespace,
        container="train",
        command=["python", "train.py"],
        gpus=2,
        completions=3,
        parallelism=3,
    )


def app_manifests(namespace: str) -> list[dict[str, Any]]:
    """A plain Deployment (2 inference servers, 1 GPU each, port 8080) and its ClusterIP Service (port 80)."""
    labels = {"app": APP}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "containers": [
                            {
                                "name": "server",
                                "image": INFERENCE_IMAGE,
                                "ports": [{"name": "http", "containerPort": HTTP_PORT}],
                                "resources": {"limits": {GPU_RESOURCE: 1}},
                            }
                        ]
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": APP, "namespace": namespace},
            "spec": {
                "selector": dict(labels),
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": HTTP_PORT}],
            },
        },
    ]


def to_yaml(objects: Sequence[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML text, keys in the order they were written."""
    return "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects)
