"""The controller's approval of virtual nodes' kubelet-serving CSRs, and the remote usage arithmetic."""

from __future__ import annotations

import asyncio
import base64
import copy
import ipaddress
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, SYSTEM_NAMESPACE, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from tests.unit.fakes import FakeApiServer, serve
from vkprovider.kubelet.csrapprove import AUTHENTICATED as AUTH
from vkprovider.kubelet.csrapprove import DENIED_REASON, ServingCSRApprover, virtual_node_problems
from vkprovider.kubelet.servingcert import CSR_USAGES, NODES_GROUP, SIGNER, new_key_and_csr
from vkprovider.node.provider import LogOptions, ProviderError
from vkprovider.remote.streaming import RemoteStreaming, log_params

VK_USER = "gpufed:virtual-kubelet"
VK_SA = "system:serviceaccount:gpufed:gpufed-virtual-kubelet"
PROVIDER = "prov-csr-0001"


def _peer(server: FakeApiServer, provider: str = PROVIDER) -> dict[str, Any]:
    return server.create("foreignclusters", {"kind": "ForeignCluster", "metadata": {"name": provider}}, API_VERSION)


def _node(
    server: FakeApiServer,
    name: str,
    *,
    virtual: bool = True,
    address: str = "127.0.0.1",
    owner: dict[str, Any] | None = None,
    provider: str = PROVIDER,
) -> None:
    labels = {TYPE_LABEL: VIRTUAL_NODE_TYPE, REMOTE_CLUSTER_LABEL: provider} if virtual else {}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [rest.owner_ref(owner)]
    server.create(
        "nodes",
        {"kind": "Node", "metadata": meta, "status": {"addresses": [{"type": "InternalIP", "address": address}]}},
    )


def _csr(
    server: FakeApiServer,
    name: str,
    node: str,
    *,
    user: str = VK_USER,
    groups: tuple[str, ...] = ("system:authenticated",),
    ip: str = "127.0.0.1",
    pem: bytes | None = None,
    usages: tuple[str, ...] = CSR_USAGES,
    signer: str = SIGNER,
) -> None:
    if pem is None:
        _key, pem = new_key_and_csr(node, ip)
    server.create(
        "certificatesigningrequests",
        {
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(pem).decode(),
                "signerName": signer,
                "usages": list(usages),
                "username": user,
                "groups": list(groups),
            },
        },
        "certificates.k8s.io/v1",
    )


def _decision(server: FakeApiServer, name: str) -> dict[str, Any] | None:
    csr = server.get("certificatesigningrequests", "", name)
    assert csr is not None
    conds = (csr.get("status") or {}).get("conditions") or []
    return conds[0] if conds else None


def _denied(server: FakeApiServer, name: str, why: str) -> None:
    got = _decision(server, name)
    assert got is not None and got["type"] == "Denied", got
    assert got["reason"] == DENIED_REASON and why in got["message"], got
    warned = [e for e in server.items("events", "default") if e["involvedObject"]["name"] == name]
    assert warned and warned[0]["type"] == "Warning" and why in warned[0]["message"], warned


def _request(cn: str, org: str = NODES_GROUP, *, sans: list[x509.GeneralName] | None = None) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    if sans is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


async def test_approves_only_our_virtual_kubelets_requests_for_their_nodes() -> None:
    async with serve() as (server, api):
        approver = ServingCSRApprover(api, [VK_USER, VK_SA])
        fc = _peer(server)
        _node(server, "gpufed-a", owner=fc)
        _csr(server, "good", "gpufed-a")
        _csr(server, "as-sa", "gpufed-a", user=VK_SA, groups=(f"system:serviceaccounts:{SYSTEM_NAMESPACE}", AUTH))
        _csr(server, "someone-else", "gpufed-a", user="mallory")
        _csr(server, "foreign-ip", "gpufed-a", ip="10.1.2.3")
        _csr(server, "early", "gpufed-b")
        assert await approver.review("good")
        good = _decision(server, "good")
        assert good is not None and good["type"] == "Approved"
        assert await approver.review("as-sa")
        assert (_decision(server, "as-sa") or {}).get("type") == "Approved"
        assert await approver.review("someone-else")
        assert _decision(server, "someone-else") is None  # not ours: untouched
        assert await approver.review("foreign-ip")
        _denied(server, "foreign-ip", "10.1.2.3")
        # Its node is not registered yet: it waits instead of being denied.
        approver._pending["early"] = asyncio.get_running_loop().time()
        assert not await approver.review("early")
        assert _decision(server, "early") is None
        _node(server, "gpufed-b", owner=fc)
        assert await approver.review("early")
        early = _decision(server, "early")
        assert early is not None and early["type"] == "Approved"
        approvals = server.calls("PUT", "/apis/certificates.k8s.io/v1/certificatesigningrequests/good/approval")
        assert len(approvals) == 1
        assert approvals[0].body["metadata"]["uid"], "the approval names the reviewed object's UID"


async def test_a_real_node_labelled_virtual_gets_no_serving_certificate() -> None:
    """The label alone proves nothing: a virtual kubelet could put it on a real node."""
    async with serve() as (server, api):
        approver = ServingCSRApprover(api, [VK_USER])
        fc = _peer(server)
        _node(server, "worker-1", virtual=False)
        _node(server, "worker-2")  # labelled virtual, but named like a real node and owned by nobody
        _node(server, "gpufed-orphan")  # labelled, prefixed, but not owned by the ForeignCluster
        _node(server, "gpufed-elsewhere", provider="prov-unpeered", owner=fc)
        for n in ("worker-1", "worker-2", "gpufed-orphan", "gpufed-elsewhere"):
            _csr(server, n, n)
            assert await approver.review(n)
        _denied(server, "worker-1", "not a gpufed virtual node")
        _denied(server, "worker-2", "does not start with gpufed-")
        _denied(server, "worker-2", "not owned by the ForeignCluster")
        _denied(server, "gpufed-orphan", f"not owned by the ForeignCluster {PROVIDER}")
        _denied(server, "gpufed-elsewhere", "not peered")


async def test_a_request_with_the_expected_shape_but_another_identity_is_denied() -> None:
    async with serve() as (server, api):
        approver = ServingCSRApprover(api, [VK_USER, VK_SA])
        fc = _peer(server)
        _node(server, "gpufed-a", owner=fc)
        own = [x509.DNSName("gpufed-a"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cases = {
            "controller-manager": (_request("system:kube-controller-manager", sans=own), "common name must be"),
            "masters": (_request("system:node:gpufed-a", "system:masters", sans=own), "organization must be"),
            "no-sans": (_request("system:node:gpufed-a"), "no subject alternative names"),
            "other-dns": (
                _request("system:node:gpufed-a", sans=[x509.DNSName("kubernetes.default.svc")]),
                "kubernetes.default.svc",
            ),
        }
        for name, (pem, _why) in cases.items():
            _csr(server, name, "gpufed-a", pem=pem)
        _csr(server, "client-auth", "gpufed-a", usages=("digital signature", "server auth", "client auth"))
        _csr(server, "no-group", "gpufed-a", groups=())
        _csr(server, "sa-wrong-ns", "gpufed-a", user=VK_SA, groups=("system:serviceaccounts:default", AUTH))
        for name in [*cases, "client-auth", "no-group", "sa-wrong-ns"]:
            assert await approver.review(name)
        for name, (_pem, why) in cases.items():
            _denied(server, name, why)
        _denied(server, "controller-manager", "no node (none named) is registered")
        _denied(server, "client-auth", "usages must be exactly")
        _denied(server, "no-group", "system:authenticated")
        _denied(server, "sa-wrong-ns", "lacks the group system:serviceaccounts:gpufed")
        assert not server.calls("PUT", "/apis/certificates.k8s.io/v1/certificatesigningrequests/x/approval")


async def test_an_approval_of_a_request_replaced_since_review_is_refused() -> None:
    """The approval carries the reviewed object's resourceVersion: a swapped request is not approved."""
    async with serve() as (server, api):
        approver = ServingCSRApprover(api, [VK_USER])
        fc = _peer(server)
        _node(server, "gpufed-a", owner=fc)
        _csr(server, "swap", "gpufed-a")
        reviewed = server.get("certificatesigningrequests", "", "swap")
        assert reviewed is not None
        snapshot = copy.deepcopy(reviewed)
        server.update("certificatesigningrequests", "", "swap", lambda c: c["spec"].update(usages=["client auth"]))
        with pytest.raises(KubeError):
            await approver._decide(snapshot, True, "reviewed")
        assert _decision(server, "swap") is None


def test_virtual_node_problems_need_label_prefix_and_owner() -> None:
    fc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ForeignCluster",
        "metadata": {"name": PROVIDER, "uid": "u1"},
    }
    node = {
        "metadata": {
            "name": "gpufed-x",
            "labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE, REMOTE_CLUSTER_LABEL: PROVIDER},
            "ownerReferences": [rest.owner_ref(fc)],
        }
    }
    assert virtual_node_problems(node, fc) == []
    assert virtual_node_problems(node, None)
    other = copy.deepcopy(fc)
    other["metadata"]["uid"] = "u2"
    assert virtual_node_problems(node, other), "a ForeignCluster of the same name but another UID"
    gone = copy.deepcopy(fc)
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert virtual_node_problems(node, gone)


def test_log_params() -> None:
    assert log_params("main", LogOptions()) == {"container": "main"}
    assert log_params(
        "c", LogOptions(follow=True, timestamps=True, tail_lines=0, limit_bytes=5, since_time="2026-01-01T00:00:00Z")
    ) == {
        "container": "c",
        "follow": "true",
        "timestamps": "true",
        "tailLines": "0",
        "limitBytes": "5",
        "sinceTime": "2026-01-01T00:00:00Z",
    }
    assert "stream" not in log_params("c", LogOptions(stream="All"))
    assert log_params("c", LogOptions(stream="Stderr"))["stream"] == "Stderr"


def _pod(uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": "p", "uid": uid},
        "status": {
            "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": "2026-11-21T10:00:00Z"}}}]
        },
    }


def test_cumulative_cpu_is_integrated_from_the_providers_rates() -> None:
    rs = RemoteStreaming(None, "gpu-a", lambda pod: ("team-a-c1", pod["metadata"]["name"]))
    start = 1_795_255_200.0  # 2026-11-21T10:00:00Z

    def sample(ts: str, cpu: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "p"},
            "timestamp": ts,
            "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": "64Mi"}}],
        }

    first = rs._usage(_pod(), sample("2026-11-21T10:01:40Z", "500m"))
    c = first.containers[0]
    assert c.start_time == start
    assert c.cpu_cores == 0.5 and c.memory_working_set_bytes == 64 * 2**20
    assert c.cpu_seconds == pytest.approx(50.0)  # 0.5 cores x 100 s since the container started
    second = rs._usage(_pod(), sample("2026-11-21T10:01:50Z", "2"))
    assert second.containers[0].cpu_seconds == pytest.approx(70.0)  # + 2 cores x 10 s
    # The same sample again (the provider has not re-scraped): the counter does not move.
    again = rs._usage(_pod(), sample("2026-11-21T10:01:50Z", "2"))
    assert again.containers[0].cpu_seconds == pytest.approx(70.0)


async def test_usage_of_pods_without_twins_asks_the_provider_nothing() -> None:
    def missing(pod: Any) -> tuple[str, str]:
        raise ProviderError("no twin", reason="NotFound")

    # remote API None: any request would fail, so an empty answer proves none was made.
    rs = RemoteStreaming(None, "gpu-a", missing)
    assert await rs.pod_usage([_pod("u1"), _pod("u2")]) == []
