"""Storage drill on the real local clusters: gpu-a's virtual kubelet (the provisioner of the claims
scheduled to its node) is killed with SIGKILL while the first half of the claims bind, and the
second half is created while it is gone; the controller's supervisor restarts it, and afterwards
every claim is bound exactly once: one virtual volume per claim on the consumer, one claim of the
consumer's per claim in the twin namespace on the provider, no volume or provider claim without its
consumer claim, every pod of the burst run.

The module peers the consumer with gpu-a only (8 GPUs, 40Gi of storage) and offloads one namespace
(`--pod-strategy Remote`). The recovery time is printed as `DRILL storage-vk-kill-9 recovery_s=<x>`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ORIGIN_UID_LABEL, REMOTE_CLUSTER_LABEL, ClusterID
from gpufed.localenv.kwokcfg import RUN_DURATION_ANNOTATION
from tests.e2e.conftest import Clusters
from tests.e2e.drills.ledger import record
from tests.e2e.drills.test_control_plane import gone, pids_of
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = [pytest.mark.e2e, pytest.mark.drill, pytest.mark.timeout(600)]

CLAIMS = 12
NAMESPACE = "drills-storage"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    peers: dict[str, tuple[str, ...]] = {"gpu-a": ("--gpus", "8", "--storage", "40Gi", "--no-network")}
    with contextlib.contextmanager(peered_session)(clusters, peers) as found:
        clusters.kubectl("consumer", "create", "namespace", NAMESPACE)
        eventually(
            "the default ServiceAccount",
            lambda: clusters.kubectl("consumer", "get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0,
            timeout=30,
        )
        offload(clusters, NAMESPACE, "--pod-strategy", "Remote")
        try:
            yield found
        finally:
            for kind in ("pods", "pvc"):
                clusters.kubectl("consumer", "delete", kind, "--all", "-n", NAMESPACE, "--timeout=120s", check=False)
            eventually("the drill's virtual volumes gone", lambda: not volumes(clusters), timeout=120)
            clusters.kubectl("consumer", "delete", "namespace", NAMESPACE, "--timeout=120s", check=False)


def volumes(clusters: Clusters) -> list[dict[str, Any]]:
    pvs: list[dict[str, Any]] = clusters.kubectl_json("consumer", "get", "pv")["items"]
    return [pv for pv in pvs if (pv["spec"].get("claimRef") or {}).get("namespace") == NAMESPACE]


def claim_and_pod(i: int) -> list[dict[str, Any]]:
    name = f"ckpt-{i}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "storageClassName": "gpufed",
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {RUN_DURATION_ANNOTATION: "600s"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "local/train:1",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
            },
        },
    ]


def test_kill_virtual_kubelet_while_claims_bind(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    def vk() -> int | None:
        pids = pids_of(clusters, "virtual-kubelet", f"--provider-cluster-id={ids['gpu-a']}")
        return pids[0] if len(pids) == 1 else None

    old: int = eventually("gpu-a's virtual kubelet", vk, timeout=90)
    first, second = range(CLAIMS // 2), range(CLAIMS // 2, CLAIMS)
    for i in first:
        for obj in claim_and_pod(i):
            clusters.create("consumer", obj)
    # the first claims are being bound: the provisioner dies; the second half arrives while it is gone
    eventually("the first virtual volume", lambda: len(volumes(clusters)) >= 1, timeout=120)
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    eventually("the killed virtual kubelet gone", lambda: gone(old), timeout=30)
    at_kill = len(volumes(clusters))
    for i in second:
        for obj in claim_and_pod(i):
            clusters.create("consumer", obj)
    new: int = eventually("the restarted virtual kubelet", vk, timeout=120)
    assert new != old

    def all_running() -> bool:
        pods = clusters.kubectl_json("consumer", "get", "pods", "-n", NAMESPACE)["items"]
        return len(pods) == CLAIMS and all(p["status"].get("phase") == "Running" for p in pods)

    eventually(f"all {CLAIMS} pods running", all_running, timeout=300)
    recovered = time.monotonic() - t0
    # every claim bound exactly once, on both sides
    claims = clusters.kubectl_json("consumer", "get", "pvc", "-n", NAMESPACE)["items"]
    assert len(claims) == CLAIMS and all(c["status"]["phase"] == "Bound" for c in claims), claims
    uids = {c["metadata"]["uid"] for c in claims}
    pvs = volumes(clusters)
    assert sorted(pv["spec"]["claimRef"]["uid"] for pv in pvs) == sorted(uids), pvs
    assert all(pv["metadata"]["labels"][REMOTE_CLUSTER_LABEL] == ids["gpu-a"] for pv in pvs)
    twin_ns = f"{NAMESPACE}-{ids['consumer']}"
    remote = clusters.kubectl_json("gpu-a", "get", "pvc", "-n", twin_ns)["items"]
    assert sorted(r["metadata"]["labels"][ORIGIN_UID_LABEL] for r in remote) == sorted(uids), remote
    assert all(r["status"]["phase"] == "Bound" for r in remote), [r["status"] for r in remote]
    record("storage-vk-kill-9", recovered, claims=CLAIMS, volumes_at_kill=at_kill)
