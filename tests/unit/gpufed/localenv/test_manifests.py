"""The plain workloads of the demo, the e2e tests and the benchmarks: one Job builder, exact objects."""

from __future__ import annotations

import yaml

from gpufed.localenv.manifests import app_manifests, job, job_manifest, to_yaml
from tests.paths import REPO


def test_the_demo_job_is_the_example_a_user_writes() -> None:
    example = yaml.safe_load((REPO / "deploy" / "examples" / "gpu-job.yaml").read_text())
    assert job_manifest("team-a") == example
    assert job_manifest("other")["metadata"]["namespace"] == "other"


def test_the_deployment_asks_for_gpus_and_its_service_targets_the_server_port() -> None:
    deploy, svc = app_manifests("team-a")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # so it can only run on virtual nodes
    assert svc["spec"]["selector"] == deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["ports"][0]["targetPort"] == container["ports"][0]["containerPort"]
    # nothing gpufed-specific: no toleration, no node selector
    assert "tolerations" not in deploy["spec"]["template"]["spec"]
    assert "nodeSelector" not in deploy["spec"]["template"]["spec"]


def test_the_demo_job_is_shown_in_the_order_it_is_written() -> None:
    text = to_yaml([job_manifest("team-a")])
    keys = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  ") and ":" in line]
    assert keys[:6] == ["name", "namespace", "completions", "parallelism", "backoffLimit", "template"]


def test_a_one_pod_job_with_annotations_and_an_optional_gpu_limit() -> None:
    # tests/e2e/conftest.py: Clusters.run_job
    assert job("j", "ns", gpus="2", pod_annotations={"a": "b"}) == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"a": "b"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                            "resources": {"limits": {"nvidia.com/gpu": "2"}},
                        }
                    ],
                },
            },
        },
    }
    cpu_only = job("j", "ns", pod_annotations={})
    assert cpu_only["spec"]["template"]["metadata"] == {"annotations": {}}
    assert "resources" not in cpu_only["spec"]["template"]["spec"]["containers"][0]


def test_a_job_with_pod_labels_and_a_node_selector() -> None:
    # tests/e2e/test_gpu_pool.py: job()
    got = job("big", "ns", gpus="8", pod_labels={"job": "big"}, node_selector={"gpufed.io/x": "y"})
    assert got["spec"] == {
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {"job": "big"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
                "nodeSelector": {"gpufed.io/x": "y"},
            },
        },
    }
    assert "nodeSelector" not in job("big", "ns", node_selector={})["spec"]["template"]["spec"]


def test_a_parallel_job_of_cpu_requests() -> None:
    # tests/e2e/test_offload_pods.py: the 50-pod burst
    got = job("burst", "ns", image="x", requests={"cpu": "10m", "memory": "16Mi"}, completions=50, parallelism=50)
    assert got["spec"] == {
        "completions": 50,
        "parallelism": 50,
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "main", "image": "x", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
                ],
            }
        },
    }


def test_a_benchmark_job_with_labels_on_the_job_and_its_pods() -> None:
    # bench/gpupool.py: job_body
    got = job(
        "live-1",
        "bench-gpu",
        gpus="4",
        requests={"cpu": "100m", "memory": "128Mi"},
        image="registry.example/gpu-train:1",
        container="train",
        backoff_limit=6,
        labels={"mode": "live"},
        pod_labels={"mode": "live"},
        pod_annotations={"local.gpufed.io/run-duration": "5s"},
    )
    assert got == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "live-1", "namespace": "bench-gpu", "labels": {"mode": "live"}},
        "spec": {
            "backoffLimit": 6,
            "template": {
                "metadata": {"labels": {"mode": "live"}, "annotations": {"local.gpufed.io/run-duration": "5s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.example/gpu-train:1",
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"nvidia.com/gpu": "4"},
                            },
                        }
                    ],
                },
            },
        },
    }
    # the builder copies what it is given: a caller's dicts are never shared with the object
    labels = {"mode": "live"}
    built = job("j", "ns", labels=labels, pod_labels=labels)
    built["metadata"]["labels"]["x"] = "y"
    assert labels == {"mode": "live"} and built["spec"]["template"]["metadata"]["labels"] == {"mode": "live"}
