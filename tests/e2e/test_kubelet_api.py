"""`kubectl logs/exec/attach/port-forward` and the metrics endpoints of offloaded pods, end to end.

The whole chain is real: kubectl -> consumer kube-apiserver (which verifies the virtual node's
serving certificate against the cluster CA, since it runs with --kubelet-certificate-authority)
-> gpufed's kubelet API on the virtual node -> gpu-a's kube-apiserver (pods/log, pods/exec,
pods/attach, pods/portforward, metrics.k8s.io with the peering's credentials) -> kwok's kubelet
API for the twin (logs and attach from files, exec as user nobody, port 8080 answering HTTP).

Also the door itself: anonymous callers get 401, a token without the right `nodes/*` permission
403, and a pod that is not bound to the virtual node is never served. And virtual-kubelet's own
end-to-end suite (its test/e2e package, built from the pinned module) against the same node, through
the API server's node proxy to the node's InternalIP.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import secrets
import select
import ssl
import struct
import subprocess
import termios
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from prometheus_client.parser import text_string_to_metric_families

from gpufed.apis.wire import ClusterID
from gpufed.localenv import nodeaddr
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, gpufed, out, peered_session

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8")})


@pytest.fixture(scope="module")
def vnode(ids: dict[str, ClusterID]) -> str:
    return f"gpufed-{ids['gpu-a']}"


@pytest.fixture(scope="module")
def offloaded(clusters: Clusters, ids: dict[str, ClusterID]) -> Iterator[str]:
    """An offloaded namespace with a long-running GPU pod `worker` on the virtual node."""
    ns = f"kapi-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", ns)
    eventually(
        "default ServiceAccount",
        lambda: clusters.kubectl("consumer", "get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
        timeout=30,
    )
    p = gpufed("offload-namespace", ns, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
    assert p.returncode == 0, out(p)
    clusters.run_pod("consumer", ns, "worker", gpus=1)
    try:
        yield ns
    finally:
        gpufed("unoffload-namespace", ns, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
        clusters.kubectl("consumer", "delete", "namespace", ns, "--wait=false", check=False)


def kubelet_endpoint(clusters: Clusters, node: str) -> tuple[str, int]:
    """The node's kubelet API: its InternalIP and kubelet port, as the API server and scrapers find it."""
    n = clusters.kubectl_json("consumer", "get", "node", node)
    address = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
    return address, int(n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])


def direct(
    clusters: Clusters, at: tuple[str, int], path: str, *, token: str | None = None, method: str = "GET"
) -> tuple[int, str]:
    """Call the virtual node's kubelet API directly (not through the API server), as a scraper does."""
    ctx = ssl.create_default_context(cafile=str(clusters.env.pki("consumer").ca_cert))
    req = urllib.request.Request(f"https://{at[0]}:{at[1]}{path}", method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def logs(clusters: Clusters, ns: str, *args: str) -> str:
    return clusters.kubectl("consumer", "logs", "-n", ns, *args).stdout


# ---------------------------------------------------------------------------------------- logs


def test_kubectl_logs_of_an_offloaded_pod(clusters: Clusters, offloaded: str, vnode: str) -> None:
    pod = clusters.kubectl_json("consumer", "get", "pod", "worker", "-n", offloaded)
    assert pod["spec"]["nodeName"] == vnode
    full = logs(clusters, offloaded, "worker")
    lines = full.splitlines()
    assert len(lines) >= 2 and all("served by kwok's kubelet API" in line for line in lines), full
    assert "gpu-a" in full  # read from the provider's kwok, not the consumer's
    assert logs(clusters, offloaded, "worker", "-c", "main") == full
    assert logs(clusters, offloaded, "worker", "--tail=1").splitlines() == lines[-1:]
    stamped = logs(clusters, offloaded, "worker", "--timestamps").splitlines()
    assert len(stamped) == len(lines)
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z ", s) for s in stamped), stamped
    # The lines were written when the cluster was set up: an hour covers them, one second does not.
    assert logs(clusters, offloaded, "worker", "--since=1h") == full
    assert logs(clusters, offloaded, "worker", "--since=1s") == ""
    assert len(logs(clusters, offloaded, "worker", "--limit-bytes=10")) == 10
    p = clusters.kubectl("consumer", "logs", "-n", offloaded, "worker", "-c", "nope", check=False)
    assert p.returncode != 0 and "nope" in p.stderr


def test_kubectl_logs_follow_streams_until_the_pod_ends(clusters: Clusters, offloaded: str) -> None:
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "short",
                "namespace": offloaded,
                "annotations": {"local.gpufed.io/run-duration": "15s"},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
        },
    )
    clusters.kubectl("consumer", "wait", "-n", offloaded, "--for=condition=Ready", "pod/short", "--timeout=60s")
    cmd = clusters.kubectl_argv(
        "consumer",
        "logs",
        "-f",
        "-n",
        offloaded,
        "short",
    )
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "served by kwok's kubelet API" in first
        # Streaming: the first line came while the pod still runs.
        phase = clusters.kubectl_json("consumer", "get", "pod", "short", "-n", offloaded)["status"]["phase"]
        assert phase == "Running", f"pod already {phase} after {time.monotonic() - started:.1f}s"
        rc = proc.wait(timeout=90)
        assert rc == 0, proc.stderr.read() if proc.stderr else ""
        assert (
            clusters.kubectl_json("consumer", "get", "pod", "short", "-n", offloaded)["status"]["phase"] == "Succeeded"
        )
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------- exec / attach


def test_kubectl_exec(clusters: Clusters, offloaded: str) -> None:
    p = clusters.kubectl("consumer", "exec", "-n", offloaded, "worker", "--", "echo", "hi")
    assert p.stdout == "hi\n"
    # (kwok keeps a command's stdin open after the client closed it, so `cat` would never end there;
    # reading one line proves stdin travels just as well.)
    p = clusters.kubectl(
        "consumer",
        "exec",
        "-i",
        "-n",
        offloaded,
        "worker",
        "--",
        "sh",
        "-c",
        'read l; echo "got $l"',
        input_text="hello stdin\n",
    )
    assert p.stdout == "got hello stdin\n"
    p = clusters.kubectl(
        "consumer", "exec", "-n", offloaded, "worker", "--", "sh", "-c", "echo oops >&2; exit 3", check=False
    )
    assert p.returncode == 3, out(p)
    assert "oops" in p.stderr
    p = clusters.kubectl("consumer", "exec", "-n", offloaded, "worker", "-c", "nope", "--", "true", check=False)
    assert p.returncode != 0 and "nope" in p.stderr


def _under_pty(cmd: list[str], rows: int, cols: int, timeout: float = 30) -> tuple[int, str]:
    """Run `cmd` with a pseudo-terminal of rows x cols as its terminal; (exit code, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True, start_new_session=True)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_kubectl_exec_with_a_terminal_gets_its_size(clusters: Clusters, offloaded: str) -> None:
    cmd = clusters.kubectl_argv(
        "consumer",
        "exec",
        "-it",
        "-n",
        offloaded,
        "worker",
        "--",
        "sh",
        "-c",
        "stty size; sleep 1",
    )
    rc, output = _under_pty(cmd, 33, 97)
    assert rc == 0, output
    # The remote command saw the user's terminal size: it travelled as a resize message. (kwok's
    # pty may drop output written just before the command exits, hence the sleep.)
    assert "33 97" in output, output


def test_kubectl_attach(clusters: Clusters, offloaded: str) -> None:
    attach_log = clusters.env.cluster_dir("gpu-a") / "attach.log"
    cmd = clusters.kubectl_argv(
        "consumer",
        "attach",
        "-n",
        offloaded,
        "worker",
        "-c",
        "main",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marker = f"attached-{secrets.token_hex(4)}"
    seen = b""
    try:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        deadline = time.monotonic() + 40
        while marker.encode() not in seen and time.monotonic() < deadline:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
            with attach_log.open("a") as f:
                f.write(f"{stamp} stdout F {marker}\n")
            time.sleep(0.5)
            chunk = proc.stdout.read()
            if chunk:
                seen += chunk
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()
        assert marker.encode() in seen, seen
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------- port-forward


def test_kubectl_port_forward_carries_http(clusters: Clusters, offloaded: str) -> None:
    cmd = clusters.kubectl_argv(
        "consumer",
        "port-forward",
        "-n",
        offloaded,
        "pod/worker",
        ":8080",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
        assert m, line + (proc.stderr.read() if proc.stderr else "")
        for _ in range(2):  # two connections: each is its own stream pair end to end
            with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/healthz", timeout=20) as r:
                assert r.status == 200
                assert "port-forward" in r.read().decode()
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------- metrics


def test_metrics_resource_and_stats_summary_carry_usage(clusters: Clusters, offloaded: str, vnode: str) -> None:
    # Scraped directly at the node's InternalIP, as metrics-server does, with a token allowed
    # nodes/metrics and nodes/stats.
    token = _token(clusters, offloaded, "scraper")
    role = f"kapi-scraper-{offloaded}"
    clusters.kubectl("consumer", "create", "clusterrole", role, "--verb=get", "--resource=nodes/metrics,nodes/stats")
    at = kubelet_endpoint(clusters, vnode)
    last = [""]

    def usage() -> dict[str, float] | None:
        status, body = direct(clusters, at, "/metrics/resource", token=token)
        last[0] = f"{status} {body[-1500:]}"
        if status != 200:
            return None
        found: dict[str, float] = {}
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                if s.labels.get("pod") == "worker" and s.labels.get("namespace") == offloaded:
                    found[s.name] = s.value
        cpu = found.get("container_cpu_usage_seconds_total", 0)
        return found if cpu > 0 and found.get("container_memory_working_set_bytes", 0) > 0 else None

    try:
        clusters.kubectl(
            "consumer",
            "create",
            "clusterrolebinding",
            role,
            f"--clusterrole={role}",
            f"--serviceaccount={offloaded}:scraper",
        )
        try:
            found = eventually("non-zero usage of worker in /metrics/resource", usage, timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}; last answer:\n{last[0]}") from None
        assert found["container_start_time_seconds"] > 0
        status, body = direct(clusters, at, "/stats/summary", token=token)
        assert status == 200, body
        summary = json.loads(body)
        assert summary["node"]["nodeName"] == vnode
        pod = next(
            p for p in summary["pods"] if p["podRef"]["name"] == "worker" and p["podRef"]["namespace"] == offloaded
        )
        assert pod["cpu"]["usageNanoCores"] > 0 and pod["memory"]["workingSetBytes"] > 0
        # metrics access opens no logs
        assert direct(clusters, at, f"/containerLogs/{offloaded}/worker/main", token=token)[0] == 403
    finally:
        clusters.kubectl("consumer", "delete", "clusterrolebinding", role, "--ignore-not-found", check=False)
        clusters.kubectl("consumer", "delete", "clusterrole", role, "--ignore-not-found", check=False)


def test_kubectl_top_pod_on_the_consumer(clusters: Clusters, offloaded: str) -> None:
    def top() -> str | None:
        p = clusters.kubectl("consumer", "top", "pod", "worker", "-n", offloaded, "--no-headers", check=False)
        return p.stdout if p.returncode == 0 and p.stdout.strip() else None

    line = eventually("kubectl top pod worker", top, timeout=120)
    _name, cpu, mem = line.split()[:3]
    assert cpu != "0m" and mem not in ("0Mi", "0"), line


# ---------------------------------------------------------------------------------------- the door


def _token(clusters: Clusters, ns: str, sa: str) -> str:
    clusters.kubectl("consumer", "create", "serviceaccount", sa, "-n", ns)
    return clusters.kubectl("consumer", "create", "token", sa, "-n", ns, "--duration=10m").stdout.strip()


def test_kubelet_api_refuses_anonymous_and_unauthorised_callers(clusters: Clusters, offloaded: str, vnode: str) -> None:
    at = kubelet_endpoint(clusters, vnode)
    assert direct(clusters, at, "/pods")[0] == 401
    assert direct(clusters, at, "/containerLogs/x/y/z", token="not-a-token")[0] == 401
    nobody = _token(clusters, offloaded, "nobody")
    status, body = direct(clusters, at, f"/containerLogs/{offloaded}/worker/main", token=nobody)
    assert status == 403 and "subresource=proxy" in body, body
    assert direct(clusters, at, "/metrics/resource", token=nobody)[0] == 403
    # A GET-only nodes/proxy grant (what monitoring gets) reads pods but opens no shell.
    reader = _token(clusters, offloaded, "reader")
    role = f"kapi-reader-{offloaded}"
    clusters.kubectl("consumer", "create", "clusterrole", role, "--verb=get", "--resource=nodes/proxy")
    try:
        clusters.kubectl(
            "consumer",
            "create",
            "clusterrolebinding",
            role,
            f"--clusterrole={role}",
            f"--serviceaccount={offloaded}:reader",
        )

        def can_read() -> bool:
            return direct(clusters, at, "/pods", token=reader)[0] == 200

        eventually("reader may GET /pods", can_read, timeout=60)
        status, body = direct(clusters, at, f"/exec/{offloaded}/worker/main?command=id&output=1", token=reader)
        assert status == 403 and "verb=create" in body, body
        # Pods of other nodes are never served, whoever asks.
        clusters.kubectl("consumer", "run", "local-pod", "-n", "default", "--image=x", "--restart=Never")
        status, body = direct(clusters, at, "/containerLogs/default/local-pod/local-pod", token=reader)
        assert status == 404, body
    finally:
        clusters.kubectl("consumer", "delete", "clusterrolebinding", role, "--ignore-not-found", check=False)
        clusters.kubectl("consumer", "delete", "clusterrole", role, "--ignore-not-found", check=False)
        clusters.kubectl(
            "consumer", "delete", "pod", "local-pod", "-n", "default", "--ignore-not-found", "--wait=false", check=False
        )


def test_serving_certificate_is_issued_by_the_cluster_for_the_node(
    clusters: Clusters, offloaded: str, vnode: str
) -> None:
    at = kubelet_endpoint(clusters, vnode)
    pem = ssl.get_server_certificate(at)
    cert = x509.load_pem_x509_certificate(pem.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"system:node:{vnode}"
    ca = x509.load_pem_x509_certificate(Path(clusters.env.pki("consumer").ca_cert).read_bytes())
    assert cert.issuer == ca.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert at[0] in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    # The request was approved by gpufed's controller and removed once the certificate was read.
    csrs: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "csr", "-l", f"gpufed.io/virtual-node={vnode}"
    )["items"]
    assert csrs == [], [c["metadata"]["name"] for c in csrs]


# ---------------------------------------------------------------------------------------- upstream suite

#: virtual-kubelet's own end-to-end suite (deploy/local/vke2e, built by deploy/local/build.sh).
VK_SUITE = "vk-e2e.test"
VK_SUITE_TESTS = {
    "TestGetPods",
    "TestGetStatsSummary",
    "TestGetMetricsResource",
    "TestPodLifecycleGracefulDelete",
    "TestPodLifecycleForceDelete",
    "TestCreatePodWithOptionalInexistentSecrets",
    "TestCreatePodWithMandatoryInexistentSecrets",
    "TestCreatePodWithOptionalInexistentConfigMap",
    "TestCreatePodWithMandatoryInexistentConfigMap",
}
#: The suite's tests gpufed's node cannot serve as written. Both read the stats through the API
#: server's *pod* proxy, `/api/v1/namespaces/<ns>/pods/https:<node name>:10250/proxy/...`: they
#: assume the virtual kubelet runs as a pod named like its node, in the suite's namespace, serving on
#: port 10250 (the upstream mock provider's deployment). gpufed's kubelet API is the node's own
#: (InternalIP and `daemonEndpoints`), as a kubelet's is; the same endpoints are tested above through
#: that address (`test_metrics_resource_and_stats_summary_carry_usage`).
VK_SUITE_SKIPPED = {"TestGetStatsSummary", "TestGetMetricsResource"}


def test_virtual_kubelets_own_end_to_end_suite_passes(clusters: Clusters, offloaded: str, vnode: str) -> None:
    address, _port = kubelet_endpoint(clusters, vnode)
    assert nodeaddr.proxyable(address), (
        f"the virtual node publishes {address}, which the API server never proxies to: the local "
        "environment could not add its node address (see `gpufed local up`'s warning; it needs root)"
    )
    suite = clusters.env.binary(VK_SUITE)
    assert suite.exists(), f"{suite} is missing: `make binaries` builds it"
    p = subprocess.run(
        [
            str(suite),
            "-test.v",
            "-test.timeout=300s",
            f"-kubeconfig={clusters.env.kubeconfig_path('consumer')}",
            f"-namespace={offloaded}",
            f"-node-name={vnode}",
            "-watch-timeout=60s",
            f"-skip-tests=^({'|'.join(sorted(VK_SUITE_SKIPPED))})$",
        ],
        capture_output=True,
        text=True,
        timeout=330,
        check=False,
    )
    report = p.stdout[-6000:] + p.stderr[-2000:]
    results = {name: verdict for verdict, name in re.findall(r"--- (PASS|FAIL|SKIP): TestEndToEnd/(\w+)", p.stdout)}
    assert set(results) == VK_SUITE_TESTS, report
    assert {t for t, r in results.items() if r == "SKIP"} == VK_SUITE_SKIPPED, report
    assert {t for t, r in results.items() if r == "PASS"} == VK_SUITE_TESTS - VK_SUITE_SKIPPED, report
    assert p.returncode == 0, report
