"""Credential renewal drill on the real local clusters: the consumer's client certificate on gpu-a
lives 10 minutes (the CSR API's minimum) and renews after a twentieth of that (30 s), so the drill
sees at least `RENEWALS` renewals in about 95 s while offloaded pods run and are used.

Both controllers are restarted for the module with `GPUFED_CLIENT_CERT_LIFETIME=600` (gpu-a issues
10-minute certificates) and `GPUFED_CLIENT_CERT_RENEW_FRACTION=0.05` (the consumer renews after
30 s), and with the same two settings for the virtual kubelets' serving certificates
(`GPUFED_SERVING_CERT_*`: the virtual kubelets inherit them from the consumer's controller), then
the consumer peers with gpu-a and offloads a namespace with `PODS` long-running pods.
Throughout, every few seconds: `kubectl logs` and `kubectl exec` of a pod through the virtual node's
kubelet API (to gpu-a with the current credentials), and the pods' status as the virtual kubelet
reflects it. Afterwards:
- every request answered (no failed logs or exec call);
- no pod disturbed: the same pods (UIDs) Running and Ready on the virtual node, no restarts, no
  fail-back, and the drills' ledger finds nothing lost, duplicated or orphaned;
- each renewal is a new certificate (serial) in Secret `gpufed/gpufed-remote-<gpu-a>`, the
  ForeignCluster reports it (`CredentialsRenewal=True`, `Renewed`), and the virtual kubelet swapped
  in every one without a restart: its log names each new serial, the last one the Secret's, so
  the old certificates are no longer used;
- the certificate the virtual node's kubelet API serves (read at its InternalIP and port, as `gpufed
  doctor` does) was renewed at least `SERVING_RENEWALS` times, and no more often than due, while
  the logs and exec calls through it kept being answered.

The controllers are restarted without the variables when the module ends. The time the renewals
took is printed as `DRILL credential-renewal recovery_s=<x> renewals=<n>`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from gpufed.apis.wire import ClusterID, remote_kubeconfig_secret
from tests.e2e.conftest import Clusters
from tests.e2e.drills.ledger import Ledger, record
from tests.e2e.drills.test_control_plane import component, restart_missing, stop
from tests.e2e.helpers import deployment, eventually, offload, out, peered_session, vk_log_lines

pytestmark = [pytest.mark.e2e, pytest.mark.drill, pytest.mark.timeout(600)]

NAMESPACE = "drills-renewal"
PODS = 3
RENEWALS = 3
#: What the controllers run with for this module.
SHORT_LIVED = {
    "GPUFED_CLIENT_CERT_LIFETIME": "600",
    "GPUFED_CLIENT_CERT_RENEW_FRACTION": "0.05",
    # the virtual kubelets (children of the consumer's controller) inherit these
    "GPUFED_SERVING_CERT_LIFETIME": "600",
    "GPUFED_SERVING_CERT_RENEW_FRACTION": "0.05",
}
#: Renewals of the virtual node's serving certificate the same run must see.
SERVING_RENEWALS = 2
#: Seconds between rounds of requests.
ROUND_S = 4.0
#: Longest the renewals may take (3 x 30 s, the consumer's resync and the reloads on top).
WINDOW_S = 300.0
CONTROLLER = "gpufed-controller"


def restart_controllers(clusters: Clusters, env: dict[str, str | None]) -> None:
    """Restart the consumer's and gpu-a's controllers with `env` set (None: unset)."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for cluster in ("consumer", "gpu-a"):
        stop(component(clusters, cluster, CONTROLLER), signal.SIGTERM)
    restart_missing(clusters)


@pytest.fixture(scope="module")
def renewal(clusters: Clusters) -> Iterator[tuple[dict[str, ClusterID], Ledger]]:
    restart_controllers(clusters, dict(SHORT_LIVED))
    try:
        peers: dict[str, tuple[str, ...]] = {"gpu-a": ("--gpus", "8", "--no-network")}
        with contextlib.contextmanager(peered_session)(clusters, peers) as ids:
            clusters.kubectl("consumer", "create", "namespace", NAMESPACE)
            eventually(
                "the default ServiceAccount",
                lambda: (
                    clusters.kubectl("consumer", "get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0
                ),
                timeout=30,
            )
            offload(clusters, NAMESPACE, "--pod-strategy", "Remote")
            clusters.create("consumer", deployment("worker", NAMESPACE, PODS))
            ledger = Ledger(clusters, (NAMESPACE,))
            try:
                yield ids, ledger
            finally:
                clusters.kubectl("consumer", "delete", "namespace", NAMESPACE, "--timeout=120s", check=False)
    finally:
        restart_controllers(clusters, dict.fromkeys(SHORT_LIVED))


def pods(clusters: Clusters) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json("consumer", "get", "pods", "-n", NAMESPACE)["items"]
    return items


def healthy(pod: dict[str, Any], node: str) -> bool:
    st = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return pod["spec"].get("nodeName") == node and st.get("phase") == "Running" and ready


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def secret_serial(clusters: Clusters, provider: ClusterID) -> str:
    secret = clusters.kubectl_json("consumer", "get", "secret", "-n", "gpufed", remote_kubeconfig_secret(provider))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    return f"{cert.serial_number:x}"


def served_serial(clusters: Clusters, node: str) -> str | None:
    """The serial of the certificate the virtual node's kubelet API serves (read like `gpufed doctor`'s
    serving-certificates check: a TLS handshake with its InternalIP and kubelet port); None when it
    does not answer."""
    obj = clusters.kubectl_json("consumer", "get", "node", node)
    status = obj.get("status") or {}
    address = next((a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), None)
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    if not address or not port:
        return None
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only the serial is read; the API server verifies the chain
    try:
        with socket.create_connection((address, int(port)), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
            der = tls.getpeercert(binary_form=True)
    except OSError:
        return None
    return f"{x509.load_der_x509_certificate(der).serial_number:x}" if der else None


def reloaded_serials(clusters: Clusters, provider: ClusterID) -> list[str]:
    """The serials the virtual kubelet logged swapping in, oldest first."""
    found = (re.search(r"serial[\"=:\s]+\"?([0-9a-f]+)", line) for line in vk_log_lines(clusters, provider, "reloaded"))
    return [m[1] for m in found if m]


def test_client_certificates_renew_without_disturbing_pods_or_requests(
    clusters: Clusters, renewal: tuple[dict[str, ClusterID], Ledger]
) -> None:
    ids, ledger = renewal
    provider = ids["gpu-a"]
    node = f"gpufed-{provider}"
    eventually(
        f"{PODS} pods Running and Ready on {node}",
        lambda: sum(healthy(p, node) for p in pods(clusters)) == PODS,
        timeout=120,
    )
    ledger.settle("the drill's pods", timeout=60)
    before = {p["metadata"]["uid"]: p for p in pods(clusters)}
    serials = [secret_serial(clusters, provider)]
    serving = [s for s in (served_serial(clusters, node),) if s]
    failures: list[str] = []
    requests = 0
    # the log holds every run of this provider's virtual kubelet in the session (earlier drills peer
    # gpu-a too): only starts after this point count
    starts_before = len(vk_log_lines(clusters, provider, "virtual kubelet starting"))
    began = time.monotonic()
    while (len(serials) <= RENEWALS or len(serving) <= SERVING_RENEWALS) and time.monotonic() - began < WINDOW_S:
        name = sorted(p["metadata"]["name"] for p in before.values())[requests % PODS]
        for argv in (("logs", "-n", NAMESPACE, name, "--tail=1"), ("exec", "-n", NAMESPACE, name, "--", "echo", "ok")):
            p = clusters.kubectl("consumer", *argv, check=False, timeout=30)
            requests += 1
            if p.returncode != 0 or (argv[0] == "exec" and p.stdout != "ok\n"):
                failures.append(f"{' '.join(argv)} at {time.monotonic() - began:.0f} s: {out(p)}")
        now = pods(clusters)
        bad = [p["metadata"]["name"] for p in now if not healthy(p, node) or restarts(p)]
        if bad or {p["metadata"]["uid"] for p in now} != set(before):
            failures.append(f"pods disturbed at {time.monotonic() - began:.0f} s: {bad or 'the set changed'}")
        ledger.observe()
        serial = secret_serial(clusters, provider)
        if serial != serials[-1]:
            serials.append(serial)
        served = served_serial(clusters, node)
        if served is None:
            failures.append(f"the kubelet API of {node} did not answer at {time.monotonic() - began:.0f} s")
        elif not serving or served != serving[-1]:
            serving.append(served)
        time.sleep(ROUND_S)
    took = time.monotonic() - began
    renewed = len(serials) - 1
    assert renewed >= RENEWALS, f"{renewed} renewals in {took:.0f} s (serials {serials})"
    assert len(serving) - 1 >= SERVING_RENEWALS, f"serving certificate serials {serving} in {took:.0f} s"
    # ... and no more often than due (a certificate due at once would be renewed in a loop).
    due_every = float(SHORT_LIVED["GPUFED_SERVING_CERT_LIFETIME"]) * float(
        SHORT_LIVED["GPUFED_SERVING_CERT_RENEW_FRACTION"]
    )
    assert len(serving) - 1 <= took / due_every + 1, f"serving certificate serials {serving} in {took:.0f} s"
    assert not failures, f"{len(failures)} of {requests} requests or checks failed:\n" + "\n".join(failures[:10])
    assert not ledger.problems(), ledger.problems()
    fc = clusters.kubectl_json("consumer", "get", "foreignclusters.gpufed.io", provider)
    cond = next(c for c in fc["status"]["conditions"] if c["type"] == "CredentialsRenewal")
    assert (cond["status"], cond["reason"]) == ("True", "Renewed"), cond
    # The virtual kubelet swapped in each renewed certificate without a restart; the last one it
    # uses is the Secret's.
    try:
        eventually(
            "the virtual kubelet to swap in every renewed certificate",
            lambda: set(serials[1:]) <= set(reloaded_serials(clusters, provider)),
            timeout=30,
        )
    finally:
        seen = reloaded_serials(clusters, provider)
        print(f"\nsecret serials {serials}\nvirtual kubelet reloads {seen}", flush=True)
    starts = vk_log_lines(clusters, provider, "virtual kubelet starting")[starts_before:]
    assert not starts, f"the virtual kubelet restarted during the renewals: {starts}"
    assert secret_serial(clusters, provider) == serials[-1] == seen[-1], (serials, seen)
    record("credential-renewal", took, renewals=renewed, serving_renewals=len(serving) - 1, requests=requests)
