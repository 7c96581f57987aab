"""The local environment against real control planes: versions, GPU nodes, scheduling, CSR signing,
and kwok's kubelet API behind the real apiserver."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.localenv import dra, kwokcfg
from tests.e2e.conftest import Clusters

EXPECTED_VERSION = re.search(
    r"k8s.io/kubernetes (v[0-9.]+)", (Path(__file__).resolve().parents[2] / "deploy/local/go.mod").read_text()
)
assert EXPECTED_VERSION, "deploy/local/go.mod must pin k8s.io/kubernetes"
PINNED = EXPECTED_VERSION.group(1)


def wait_for(what: str, fn: Any, timeout: float = 90, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


async def test_every_cluster_is_healthy_and_runs_the_pinned_version(clusters: Clusters, api: dict[str, Any]) -> None:
    assert [c.name for c in clusters.topology.clusters] == ["consumer", "gpu-a", "gpu-b"]
    for name, c in api.items():
        info = await client.VersionApi(c).get_code()
        assert info.git_version == PINNED, name
        v = clusters.kubectl_json(name, "version")
        assert v["serverVersion"]["gitVersion"] == PINNED
        assert v["clientVersion"]["gitVersion"] == PINNED, "kubectl must report the pinned version too"
        assert clusters.kubectl(name, "get", "--raw", "/readyz").stdout.strip() == "ok"
    statuses = await clusters.env.status()
    assert all(s.healthy and s.nodes_ready == s.nodes_total for s in statuses), statuses


async def test_gpu_nodes_are_ready_with_capacity_and_labels(clusters: Clusters, api: dict[str, Any]) -> None:
    """Device-plugin GPUs in capacity; the DRA-managed nodes (gpu-a-h100-3, gpu-b-l4-3) carry the same
    labels, no nvidia.com/gpu, and their GPUs as DRA devices of gpu.nvidia.com."""
    expected = {
        "consumer": {None: (2, 0)},
        "gpu-a": {"NVIDIA-H100-80GB-HBM3": (4, 8)},
        "gpu-b": {"NVIDIA-A100-SXM4-40GB": (2, 4), "NVIDIA-L4": (4, 1)},
    }
    dra_nodes = {"gpu-a-h100-3", "gpu-b-l4-3"}
    for name, c in api.items():
        nodes = (await client.CoreV1Api(c).list_node()).items
        devices = {
            s["spec"]["nodeName"]: len(s["spec"].get("devices") or [])
            for s in clusters.kubectl_json(name, "get", "resourceslices.resource.k8s.io")["items"]
            if s["spec"]["driver"] == dra.DRIVER
        }
        seen: dict[str | None, list[int]] = {}
        for n in nodes:
            ready = [cond.status for cond in n.status.conditions if cond.type == "Ready"]
            assert ready == ["True"], (name, n.metadata.name)
            product = n.metadata.labels.get(GPU_PRODUCT_LABEL)
            gpus = int(n.status.capacity.get(GPU_RESOURCE, "0"))
            assert int(n.status.allocatable.get(GPU_RESOURCE, "0")) == gpus
            if n.metadata.name in dra_nodes:
                assert gpus == 0, n.metadata.name  # DRA manages them: advertising both would count them twice
                gpus = devices.get(n.metadata.name, 0)
            if product == "NVIDIA-H100-80GB-HBM3":
                assert n.metadata.labels["nvidia.com/gpu.memory"] == "81559"
            assert n.spec.pod_cidr and n.spec.pod_cidr.startswith("10.244."), "pod CIDRs overlap on purpose"
            seen.setdefault(product, []).append(gpus)
        assert {p: (len(g), g[0]) for p, g in seen.items()} == expected[name]
        assert all(len(set(g)) == 1 for g in seen.values()), seen


def test_job_with_two_gpus_is_scheduled_and_completes(clusters: Clusters, namespace: str) -> None:
    clusters.run_job("gpu-a", namespace, "train", gpus=2)
    pods = clusters.kubectl_json("gpu-a", "get", "pods", "-n", namespace, "-l", "job-name=train")["items"]
    assert len(pods) == 1
    pod = pods[0]
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeName"].startswith("gpu-a-h100-"), "placed by the real scheduler on a GPU node"
    assert pod["status"]["podIP"].startswith("10.244."), pod["status"].get("podIP")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    events = clusters.kubectl_json("gpu-a", "get", "events", "-n", namespace)["items"]
    assert any(e["reason"] == "Scheduled" and e["involvedObject"]["name"] == pod["metadata"]["name"] for e in events)


def test_pod_asking_for_nine_gpus_stays_pending(clusters: Clusters, namespace: str) -> None:
    clusters.run_pod("gpu-a", namespace, "too-big", gpus=9, ready=False)

    def unschedulable() -> dict[str, Any] | None:
        p = clusters.kubectl_json("gpu-a", "get", "pod", "-n", namespace, "too-big")
        for cond in p["status"].get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return dict(cond)
        return None

    cond = wait_for("the scheduler to give up on the 9-GPU pod", unschedulable)
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"], cond["message"]
    p = clusters.kubectl_json("gpu-a", "get", "pod", "-n", namespace, "too-big")
    assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
    events = clusters.kubectl_json(
        "gpu-a", "get", "events", "-n", namespace, "--field-selector=reason=FailedScheduling"
    )["items"]
    assert any("Insufficient nvidia.com/gpu" in e["message"] for e in events)


def test_csr_for_kube_apiserver_client_signer_yields_a_working_certificate(
    clusters: Clusters, namespace: str, tmp_path: Path
) -> None:
    user = f"gpufed-e2e-{namespace}"
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufed-e2e"),
                    x509.NameAttribute(NameOID.COMMON_NAME, user),
                ]
            )
        )
        .sign(key, hashes.SHA256())
    )
    name = f"csr-{namespace}"
    obj = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "expirationSeconds": 3600,
            "usages": ["client auth"],
        },
    }
    ctx = "gpu-a"
    clusters.create(ctx, obj)
    try:
        clusters.kubectl(ctx, "certificate", "approve", name)

        def issued() -> str | None:
            st = clusters.kubectl_json(ctx, "get", "csr", name)["status"]
            return str(st["certificate"]) if st.get("certificate") else None

        pem = base64.b64decode(wait_for("the controller-manager to sign the CSR", issued, timeout=60))
        cert = x509.load_pem_x509_certificate(pem)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == user
        ca = x509.load_pem_x509_certificate(clusters.env.pki(ctx).ca_cert.read_bytes())
        cert.verify_directly_issued_by(ca)

        # Authenticate with it against the same apiserver.
        kc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "csr",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": clusters.env.server(ctx),
                        "certificate-authority-data": base64.b64encode(
                            ca.public_bytes(serialization.Encoding.PEM)
                        ).decode(),
                    },
                }
            ],
            "users": [
                {
                    "name": "u",
                    "user": {
                        "client-certificate-data": base64.b64encode(pem).decode(),
                        "client-key-data": base64.b64encode(
                            key.private_bytes(
                                serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption(),
                            )
                        ).decode(),
                    },
                }
            ],
            "contexts": [{"name": "csr", "context": {"cluster": "c", "user": "u"}}],
        }
        kcfile = tmp_path / "csr.kubeconfig"
        kcfile.write_text(yaml.safe_dump(kc))
        kubectl = str(clusters.env.binary("kubectl"))
        who = subprocess.run(
            [kubectl, f"--kubeconfig={kcfile}", "auth", "whoami", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        status = json.loads(who.stdout)["status"]["userInfo"]
        assert status["username"] == user
        assert "gpufed-e2e" in status["groups"]
        # Authenticated, but RBAC grants it nothing: a clean 403, not 401.
        denied = subprocess.run(
            [kubectl, f"--kubeconfig={kcfile}", "get", "pods", "-n", namespace],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
        # The same cert is worthless on another cluster (different CA).
        other = subprocess.run(
            [
                kubectl,
                f"--kubeconfig={kcfile}",
                f"--server={clusters.env.server('gpu-b')}",
                "--insecure-skip-tls-verify",
                "auth",
                "whoami",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert other.returncode != 0 and "unauthorized" in other.stderr.lower(), other.stderr
    finally:
        clusters.kubectl(ctx, "delete", "csr", name, check=False)


def test_kwok_serves_logs_and_exec_behind_the_apiserver(clusters: Clusters, namespace: str) -> None:
    clusters.run_pod("gpu-b", namespace, "server", gpus=1)
    logs = clusters.kubectl("gpu-b", "logs", "-n", namespace, "server", "-c", "main")
    assert "served by kwok's kubelet API" in logs.stdout
    out = clusters.kubectl("gpu-b", "exec", "-n", namespace, "server", "--", "sh", "-c", "echo hello-$((40+2))")
    assert out.stdout.strip() == "hello-42"
    # Commands exec'd on fake pods run on this machine: as nobody whenever we could drop privileges.
    uid = clusters.kubectl("gpu-b", "exec", "-n", namespace, "server", "--", "id", "-u").stdout.strip()
    assert uid == ("65534" if os.geteuid() == 0 else str(os.geteuid()))
    # restartPolicy Always: a long-running pod is not completed by the Job stage.
    time.sleep(4)
    p = clusters.kubectl_json("gpu-b", "get", "pod", "-n", namespace, "server")
    assert p["status"]["phase"] == "Running"


def test_failed_job_pods_report_their_exit_code(clusters: Clusters, namespace: str) -> None:
    annotations = {kwokcfg.EXIT_CODE_ANNOTATION: "3", kwokcfg.RUN_DURATION_ANNOTATION: "1s"}
    clusters.run_job("consumer", namespace, "crash", annotations=annotations, until="Failed")
    pod = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", "job-name=crash")["items"][0]
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


async def test_up_is_idempotent_and_keeps_running_processes(clusters: Clusters) -> None:
    before = {(s.name, c.name): c.pid for s in await clusters.env.status() for c in s.components}
    await clusters.env.up()
    after = {(s.name, c.name): c.pid for s in await clusters.env.status() for c in s.components}
    assert before == after, "a second `up` must not restart anything"
    assert all(pid for pid in after.values())


def test_kwok_serves_port_forward_as_an_echo(clusters: Clusters, namespace: str) -> None:
    clusters.run_pod("consumer", namespace, "web", container={"ports": [{"containerPort": 9090}]})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    pf = subprocess.Popen(
        [
            str(clusters.env.binary("kubectl")),
            f"--kubeconfig={clusters.kubeconfig}",
            "--context=consumer",
            "port-forward",
            "-n",
            namespace,
            "pod/web",
            f"{local_port}:9090",
            "--address=127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert pf.stdout is not None
        line = pf.stdout.readline()
        assert "Forwarding from 127.0.0.1" in line, line
        with socket.create_connection(("127.0.0.1", local_port), timeout=10) as s:
            s.sendall(b"ping through the apiserver and kwok\n")
            got = b""
            while not got.endswith(b"\n"):
                chunk = s.recv(100)
                if not chunk:
                    break
                got += chunk
        assert got == b"ping through the apiserver and kwok\n"
    finally:
        pf.terminate()
        pf.wait(timeout=10)


def test_diagnostics_dump_covers_every_cluster(clusters: Clusters) -> None:
    dump = clusters.diagnostics()
    for c in clusters.topology.clusters:
        assert f"===== cluster {c.name}" in dump
        assert f"{c.name}-" in dump, "node names appear in the dump"
        assert str(clusters.env.log_path(c.name, "kube-apiserver")) in dump
