"""Attacks on gpufed's own identities and components, on the real local clusters.

Grouped by attacker position:
- consumer (or anyone who can file a certificate request on a provider): a CSR squatting the name
  the provider's handshake would use, or swapped in under the name it recorded, asking for
  `CN=system:kube-controller-manager` — never approved (peering.controllers.tenant_handshake);
- component (a compromised virtual kubelet, with its real client certificate): kubelet-serving
  certificates for a real node or for another identity (vkprovider.kubelet.csrapprove), writes to
  real Nodes, their Leases and pods bound to no virtual node (the ValidatingAdmissionPolicy
  gpufed-virtual-kubelet, deploy/rbac/virtual-kubelet.yaml);
- network (anyone who can open a connection): the controller's /metrics off loopback, and a flood
  of unknown bearer tokens on a virtual node's kubelet API (vkprovider.kubelet.auth's budgets).

Each test asserts the refusal, what the attacked side records (the CSR's Denied condition and a
Warning Event, the API server's 403 naming the policy), and that nothing leaked (no certificate
issued, nothing changed, no token review beyond the budget).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import ipaddress
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import PROVIDER_ALLOCATION_ANNOTATION, TYPE_LABEL, VIRTUAL_NODE_TYPE, ClusterID
from gpufed.localenv.components import CONTROLLER, VIRTUAL_KUBELET
from peering import handshake
from peering.controllers.tenant_handshake import CSR_REJECTED, CSR_SIGNER, CSR_USAGES
from tests.e2e.conftest import REPO, Clusters
from tests.e2e.helpers import eventually, peered_session
from vkprovider.kubelet.auth import UNKNOWN_TOKEN_BURST, UNKNOWN_TOKEN_RATE
from vkprovider.kubelet.csrapprove import DENIED_REASON
from vkprovider.kubelet.servingcert import CSR_USAGES as SERVING_USAGES
from vkprovider.kubelet.servingcert import NODES_GROUP
from vkprovider.kubelet.servingcert import SIGNER as SERVING_SIGNER

pytestmark = pytest.mark.timeout(600)

C, P = "consumer", "gpu-a"
POLICY = "gpufed-virtual-kubelet"
KUBE_CONTROLLER_MANAGER = "system:kube-controller-manager"


# ---------------------------------------------------------------- helpers


def as_virtual_kubelet(
    clusters: Clusters, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl on the consumer with the virtual kubelets' own client certificate."""
    kubeconfig = clusters.env.kubeconfig_path(C, VIRTUAL_KUBELET)
    return subprocess.run(
        [str(clusters.env.binary("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        input=input_text,
        timeout=60,
        check=False,
    )


def real_node(clusters: Clusters, context: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = clusters.kubectl_json(context, "get", "nodes", "-l", f"!{TYPE_LABEL}")["items"]
    assert nodes, f"no real node on {context}"
    return nodes[0]


def refused_by_policy(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode != 0, f"the request went through: {p.stdout}"
    assert "Forbidden" in p.stderr or "forbidden" in p.stderr, p.stderr
    assert POLICY in p.stderr, f"not refused by {POLICY}: {p.stderr}"


def csr_request(cn: str, org: str | None, sans: list[x509.GeneralName]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = ([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []) + [
        x509.NameAttribute(NameOID.COMMON_NAME, cn)
    ]
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def csr_object(name: str, pem: bytes, signer: str, usages: tuple[str, ...], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, **meta},
        "spec": {
            "request": base64.b64encode(pem).decode(),
            "signerName": signer,
            "usages": list(usages),
            "expirationSeconds": 3600,
        },
    }


def decided(clusters: Clusters, context: str, name: str) -> dict[str, Any] | None:
    """The CSR once someone decided on it (a condition), else None."""
    csr: dict[str, Any] = clusters.kubectl_json(context, "get", "csr", name)
    return csr if (csr.get("status") or {}).get("conditions") else None


def warning_events(clusters: Clusters, context: str, involved: str, reason: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = clusters.kubectl_json(context, "get", "events", "-n", "default")["items"]
    return [
        e
        for e in events
        if e["involvedObject"].get("name") == involved and e.get("reason") == reason and e.get("type") == "Warning"
    ]


def assert_denied_not_issued(
    clusters: Clusters, context: str, name: str, reason: str, why: str, *, event_on_csr: bool = True
) -> None:
    """The CSR is Denied for `reason` (its message says `why`), nothing issued; with `event_on_csr`, the
    refusal is also a Warning Event on the CSR (the handshake's refusals are Events on the Tenant)."""
    csr = eventually(f"a decision on CSR {name}", lambda: decided(clusters, context, name), timeout=60)
    conditions = csr["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Denied"], conditions
    assert conditions[0]["reason"] == reason and why in conditions[0]["message"], conditions
    assert not csr["status"].get("certificate"), "a certificate was issued"
    if event_on_csr:
        eventually(f"a Warning Event {reason} on CSR {name}", lambda: warning_events(clusters, context, name, reason))


@contextlib.contextmanager
def deleting(clusters: Clusters, context: str, *what: str) -> Iterator[None]:
    try:
        yield
    finally:
        clusters.kubectl(context, "delete", *what, "--ignore-not-found", "--wait=false", check=False)


# ---------------------------------------------------------------- consumer (on a provider)


def _tenant(clusters: Clusters) -> tuple[ClusterID, Ed25519PrivateKey]:
    """A Tenant for a consumer whose key this test holds, challenged by gpu-a's controller."""
    consumer = ClusterID(f"e2eatk-{secrets.token_hex(4)}")
    key = Ed25519PrivateKey.generate()
    tenant = {
        "apiVersion": API_VERSION,
        "kind": "Tenant",
        "metadata": {"name": consumer},
        "spec": {"consumerClusterId": consumer, "publicKey": handshake.public_key_pem(key)},
    }
    clusters.create(P, tenant)
    eventually(
        "the provider's challenge",
        lambda: (clusters.kubectl_json(P, "get", "tenant", consumer).get("status") or {}).get("challenge"),
    )
    return consumer, key


def _impostor(clusters: Clusters, name: str, consumer: ClusterID) -> None:
    """A request for the kube-controller-manager's identity, dressed like gpufed's (labels, owner,
    signer, usages), filed by someone else than the provider's controller."""
    tenant = clusters.kubectl_json(P, "get", "tenant", consumer)
    owner = {"apiVersion": API_VERSION, "kind": "Tenant", "name": consumer, "uid": tenant["metadata"]["uid"]}
    pem = csr_request(KUBE_CONTROLLER_MANAGER, None, [])
    labels = {"app.kubernetes.io/managed-by": "gpufed", "gpufed.io/consumer-cluster-id": consumer}
    clusters.create(P, csr_object(name, pem, CSR_SIGNER, CSR_USAGES, labels=labels, ownerReferences=[owner]))


def test_consumer_csr_squatting_the_handshake_name_as_kube_controller_manager_is_not_approved(
    clusters: Clusters,
) -> None:
    consumer, key = _tenant(clusters)
    with deleting(clusters, P, "tenant", consumer):
        challenge = handshake.Challenge.from_wire(
            clusters.kubectl_json(P, "get", "tenant", consumer)["status"]["challenge"]
        )
        nonce = base64.b64encode(challenge.nonce).decode()
        squatted = f"gpufed-{consumer}-{hashlib.sha256(nonce.encode()).hexdigest()[:10]}"
        with deleting(clusters, P, "csr", squatted):
            _impostor(clusters, squatted, consumer)
            csr = handshake.make_csr(consumer, ec.generate_private_key(ec.SECP256R1()))
            answer = {
                "nonce": nonce,
                "csr": csr.decode(),
                "signature": base64.b64encode(handshake.sign(key, challenge, csr)).decode(),
            }
            clusters.kubectl(
                P, "patch", "tenant", consumer, "--type=merge", "-p", json.dumps({"spec": {"answer": answer}})
            )
            status = eventually(
                "the consumer's own certificate",
                lambda: (
                    (s := clusters.kubectl_json(P, "get", "tenant", consumer).get("status") or {}).get("certificate")
                    and s
                ),
                timeout=90,
            )
            assert status["csrName"] != squatted, "the handshake used the squatted request"
            with deleting(clusters, P, "csr", status["csrName"]):
                cert = x509.load_pem_x509_certificate(status["certificate"].encode())
                cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
                assert cns == [handshake.consumer_user(consumer)], cns
                squatter = clusters.kubectl_json(P, "get", "csr", squatted)
                types = [c["type"] for c in (squatter.get("status") or {}).get("conditions") or []]
                assert "Approved" not in types and not (squatter.get("status") or {}).get("certificate"), squatter


def test_consumer_csr_swapped_in_under_the_recorded_name_is_denied_and_the_handshake_refused(
    clusters: Clusters,
) -> None:
    consumer, _key = _tenant(clusters)
    name = f"gpufed-{consumer}-swapped"
    with deleting(clusters, P, "tenant", consumer), deleting(clusters, P, "csr", name):
        _impostor(clusters, name, consumer)
        # Whatever request carries the recorded name is reviewed, not trusted for its name.
        patch = json.dumps({"status": {"csrName": name, "phase": "Challenged"}})
        clusters.kubectl(P, "patch", "tenant", consumer, "--subresource=status", "--type=merge", "-p", patch)
        assert_denied_not_issued(clusters, P, name, CSR_REJECTED, "not by this controller", event_on_csr=False)
        tenant = eventually(
            "the refused handshake",
            lambda: (
                (t := clusters.kubectl_json(P, "get", "tenant", consumer)).get("status", {}).get("phase") == "Refused"
                and t
            ),
        )
        assert not tenant["status"].get("certificate")
        reasons = {c["type"]: c.get("reason") for c in tenant["status"]["conditions"]}
        assert reasons.get("Authentication") == CSR_REJECTED, reasons
        eventually("a Warning Event on the Tenant", lambda: warning_events(clusters, P, consumer, CSR_REJECTED))


# ---------------------------------------------------------------- component (the virtual kubelet's identity)


def _serving_csr(clusters: Clusters, node: str, pem: bytes) -> str:
    name = f"gpufed-atk-{secrets.token_hex(4)}"
    p = as_virtual_kubelet(
        clusters, "create", "-f", "-", input_text=json.dumps(csr_object(name, pem, SERVING_SIGNER, SERVING_USAGES))
    )
    assert p.returncode == 0, p.stderr
    return name


def test_component_kubelet_serving_csr_for_a_real_node_is_denied(clusters: Clusters) -> None:
    node = real_node(clusters, C)["metadata"]["name"]
    sans: list[x509.GeneralName] = [x509.DNSName(node), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    name = _serving_csr(clusters, node, csr_request(f"system:node:{node}", NODES_GROUP, sans))
    with deleting(clusters, C, "csr", name):
        assert_denied_not_issued(clusters, C, name, DENIED_REASON, "is not a gpufed virtual node")


def test_component_kubelet_serving_csr_as_kube_controller_manager_is_denied(clusters: Clusters) -> None:
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    name = _serving_csr(clusters, "", csr_request(KUBE_CONTROLLER_MANAGER, NODES_GROUP, sans))
    with deleting(clusters, C, "csr", name):
        assert_denied_not_issued(clusters, C, name, DENIED_REASON, "common name must be")


def test_component_virtual_kubelet_cannot_label_a_real_node_as_virtual(clusters: Clusters) -> None:
    node = real_node(clusters, C)["metadata"]["name"]
    label = json.dumps({"metadata": {"labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE}}})
    refused_by_policy(as_virtual_kubelet(clusters, "patch", "node", node, "--type=merge", "-p", label))
    after = clusters.kubectl_json(C, "get", "node", node)
    assert TYPE_LABEL not in (after["metadata"].get("labels") or {}), "the real node was labelled virtual"


def test_component_virtual_kubelet_cannot_cordon_a_real_node(clusters: Clusters) -> None:
    node = real_node(clusters, C)["metadata"]["name"]
    p = as_virtual_kubelet(clusters, "patch", "node", node, "--type=merge", "-p", '{"spec":{"unschedulable":true}}')
    try:
        refused_by_policy(p)
    finally:
        if p.returncode == 0:
            clusters.kubectl(C, "uncordon", node)
    assert not clusters.kubectl_json(C, "get", "node", node)["spec"].get("unschedulable")


def test_component_virtual_kubelet_cannot_delete_a_real_node(clusters: Clusters) -> None:
    node = real_node(clusters, C)["metadata"]["name"]
    # A server-side dry run goes through authentication, authorization and admission like the
    # deletion itself, and leaves the node in place should the policy ever let it through.
    refused_by_policy(as_virtual_kubelet(clusters, "delete", "node", node, "--dry-run=server"))
    assert clusters.kubectl(C, "get", "node", node).returncode == 0


def test_component_virtual_kubelet_cannot_renew_a_real_nodes_lease(clusters: Clusters) -> None:
    node = real_node(clusters, C)["metadata"]["name"]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 3600, "renewTime": now},
    }
    # --force-conflicts: kwok owns the lease's fields; the write must reach admission to be refused there.
    apply = ("apply", "--server-side", "--force-conflicts", "-f", "-")
    refused_by_policy(as_virtual_kubelet(clusters, *apply, input_text=json.dumps(lease)))
    got = clusters.kubectl(C, "get", "lease", "-n", "kube-node-lease", node, "-o", "json", check=False)
    if got.returncode == 0:
        assert json.loads(got.stdout)["spec"].get("leaseDurationSeconds") != 3600, "the lease was rewritten"


def test_component_virtual_kubelet_cannot_delete_a_pod_in_kube_system(clusters: Clusters) -> None:
    name = f"gpufed-atk-{secrets.token_hex(3)}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]},
    }
    clusters.create(C, pod)
    with deleting(clusters, C, "pod", "-n", "kube-system", name):
        refused_by_policy(as_virtual_kubelet(clusters, "delete", "pod", "-n", "kube-system", name, "--wait=false"))
        status = json.dumps({"status": {"phase": "Failed", "reason": "Evicted"}})
        patched = as_virtual_kubelet(
            clusters, "patch", "pod", "-n", "kube-system", name, "--subresource=status", "--type=merge", "-p", status
        )
        # kubectl reads the status before it patches: RBAC (no get of pods/status) refuses that read,
        # and the patch itself is the policy's to refuse. Either way nothing is written.
        assert patched.returncode != 0 and "orbidden" in patched.stderr, patched.stderr
        after = clusters.kubectl_json(C, "get", "pod", "-n", "kube-system", name)
        assert not after["metadata"].get("deletionTimestamp") and after["status"].get("phase") != "Failed"


# ---------------------------------------------------------------- network


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _outward_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # nothing is sent: the route picks the source address
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def _listening_addresses(port: int) -> set[str]:
    """IPv4 addresses with a socket listening on `port` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hex_ip, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(str(ipaddress.IPv4Address(bytes.fromhex(hex_ip)[::-1])))
    return found


def test_network_controller_metrics_are_not_reachable_off_loopback_by_default(clusters: Clusters) -> None:
    """A controller replica started with only --metrics-port (no host): it serves /metrics before it
    is leader, so a candidate that never becomes one shows where it listens."""
    port = _free_port()
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpufed-controller", "namespace": "gpufed"},
        "spec": {
            "holderIdentity": "e2e-attack-holder",
            "leaseDurationSeconds": 3600,
            "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    clusters.kubectl(C, "apply", "--server-side", "-f", "-", input_text=json.dumps(lease))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFED_")}
    kubeconfig = clusters.env.kubeconfig_path(C, CONTROLLER)
    args = [sys.executable, "-m", "gpufed.cli", "controller", f"--kubeconfig={kubeconfig}", "--leader-elect"]
    proc = subprocess.Popen(
        [*args, "--leader-election-id=e2e-attack-candidate", f"--metrics-port={port}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                assert proc.poll() is None, f"the controller exited: {proc.stderr.read() if proc.stderr else ''}"
                return False

        eventually("the candidate's /healthz on loopback", healthy, timeout=60)
        assert _listening_addresses(port) == {"127.0.0.1"}, _listening_addresses(port)
        outward = _outward_address()
        if outward is not None:
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((outward, port)) != 0, f"/metrics answered on {outward}:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        clusters.kubectl(C, "delete", "lease", "-n", "gpufed", "gpufed-controller", "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def vnode(clusters: Clusters) -> Iterator[dict[str, Any]]:
    """The consumer peered with gpu-a: its virtual node."""
    session = peered_session(clusters, {P: ()})
    next(session)
    try:
        nodes = eventually(
            "the virtual node",
            lambda: clusters.kubectl_json(C, "get", "nodes", "-l", f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}")["items"],
        )
        yield nodes[0]
    finally:
        next(session, None)


def _token_reviews(clusters: Clusters) -> float:
    """TokenReviews the consumer's API server has answered since it started (its own metrics)."""
    text = clusters.kubectl(C, "get", "--raw", "/metrics").stdout
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="tokenreviews"' in line and 'verb="POST"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_network_flood_of_unknown_tokens_makes_a_bounded_number_of_token_reviews(
    clusters: Clusters, vnode: dict[str, Any]
) -> None:
    address = next(a["address"] for a in vnode["status"]["addresses"] if a["type"] == "InternalIP")
    port = int(vnode["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])

    def serving() -> bool:
        # the node is registered before its kubelet API serves (that waits for its serving certificate)
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=2):
            return True
        return False

    eventually("the virtual node's kubelet API serving", serving, timeout=60)
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the attacker does not care who serves
    flood = 200
    before = _token_reviews(clusters)
    started = time.monotonic()
    statuses: list[int] = []
    for _ in range(flood):
        req = urllib.request.Request(
            f"https://{address}:{port}/pods", headers={"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10, context=insecure) as r:
                statuses.append(r.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
    elapsed = time.monotonic() - started
    made = _token_reviews(clusters) - before
    budget = UNKNOWN_TOKEN_BURST + UNKNOWN_TOKEN_RATE * elapsed
    assert 200 not in statuses, "an unknown token was let in"
    assert set(statuses) <= {401, 429}, statuses
    # Other clients may review a few tokens meanwhile; the flood itself stays within its budget.
    assert made <= budget + 5, (
        f"{made:.0f} TokenReviews for {flood} unknown tokens in {elapsed:.1f}s (budget {budget:.0f})"
    )
    assert statuses.count(429) >= flood - budget - 5, statuses


# ---------------------------------------------------------------- DRA


def test_component_virtual_kubelet_cannot_publish_devices_of_another_driver(clusters: Clusters) -> None:
    node = real_node(clusters, C)["metadata"]["name"]
    forged: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"gpufed-atk-{secrets.token_hex(3)}"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }
    refused_by_policy(as_virtual_kubelet(clusters, "create", "-f", "-", input_text=json.dumps(forged)))
    forged["spec"]["driver"] = "gpu.gpufed.io"  # its own driver, but for a real node
    refused_by_policy(as_virtual_kubelet(clusters, "create", "-f", "-", input_text=json.dumps(forged)))


def test_component_virtual_kubelet_cannot_write_a_device_class_of_its_choosing(clusters: Clusters) -> None:
    grab: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.gpufed.io"},
        "spec": {"selectors": [{"cel": {"expression": "true"}}]},
    }
    apply = ("apply", "--server-side", "--force-conflicts", "-f", "-")
    refused_by_policy(as_virtual_kubelet(clusters, *apply, input_text=json.dumps(grab)))
    grab["metadata"]["name"] = f"atk-{secrets.token_hex(3)}"
    refused_by_policy(as_virtual_kubelet(clusters, "create", "-f", "-", input_text=json.dumps(grab)))


def test_component_virtual_kubelet_may_only_annotate_a_claim_with_the_providers_allocation(clusters: Clusters) -> None:
    name = f"atk-{secrets.token_hex(3)}"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "labels": {"team": "a"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufed.io"}}]}},
    }
    clusters.create(C, claim)
    try:
        path = ("patch", "resourceclaims.resource.k8s.io", name, "-n", "default", "--type=merge", "-p")
        ours = json.dumps({"metadata": {"annotations": {PROVIDER_ALLOCATION_ANNOTATION: "p: d/p/x"}}})
        p = as_virtual_kubelet(clusters, *path, ours)
        assert p.returncode == 0, p.stderr
        for other in ({"labels": {"team": "b"}}, {"annotations": {"else": "x"}}, {"finalizers": ["atk/hold"]}):
            refused_by_policy(as_virtual_kubelet(clusters, *path, json.dumps({"metadata": other})))
        after = clusters.kubectl_json(C, "get", "resourceclaims.resource.k8s.io", name, "-n", "default")
        assert after["metadata"]["labels"] == {"team": "a"} and "finalizers" not in after["metadata"]
    finally:
        clusters.kubectl(C, "delete", "resourceclaims.resource.k8s.io", name, "-n", "default", check=False)
