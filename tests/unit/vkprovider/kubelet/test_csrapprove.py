"""The controller's approval of virtual nodes' kubelet-serving CSRs, and the remote usage arithmetic."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from gpufed.apis.wire import TYPE_LABEL, VIRTUAL_NODE_TYPE
from tests.unit.fakes import FakeApiServer, serve
from vkprovider.kubelet.csrapprove import ServingCSRApprover
from vkprovider.kubelet.servingcert import SIGNER, new_key_and_csr
from vkprovider.node.provider import LogOptions, ProviderError
from vkprovider.remote.streaming import RemoteStreaming, log_params

VK_USER = "gpufed:virtual-kubelet"


def _node(server: FakeApiServer, name: str, *, virtual: bool = True, address: str = "127.0.0.1") -> None:
    labels = {TYPE_LABEL: VIRTUAL_NODE_TYPE} if virtual else {}
    server.create(
        "nodes",
        {
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": address}]},
        },
    )


def _csr(server: FakeApiServer, name: str, node: str, *, user: str = VK_USER, ip: str = "127.0.0.1") -> None:
    _key, pem = new_key_and_csr(node, ip)
    server.create(
        "certificatesigningrequests",
        {
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(pem).decode(),
                "signerName": SIGNER,
                "usages": ["digital signature", "server auth"],
                "username": user,
            },
        },
        "certificates.k8s.io/v1",
    )


def _decision(server: FakeApiServer, name: str) -> dict[str, Any] | None:
    csr = server.get("certificatesigningrequests", "", name)
    assert csr is not None
    conds = (csr.get("status") or {}).get("conditions") or []
    return conds[0] if conds else None


async def test_approves_only_our_virtual_kubelets_requests_for_their_nodes() -> None:
    async with serve() as (server, api):
        approver = ServingCSRApprover(api, [VK_USER])
        _node(server, "gpufed-a")
        _node(server, "real-worker", virtual=False)
        _csr(server, "good", "gpufed-a")
        _csr(server, "someone-else", "gpufed-a", user="mallory")
        _csr(server, "not-virtual", "real-worker")
        _csr(server, "foreign-ip", "gpufed-a", ip="10.1.2.3")
        _csr(server, "early", "gpufed-b")
        assert await approver.review("good")
        good = _decision(server, "good")
        assert good is not None and good["type"] == "Approved"
        assert await approver.review("someone-else")
        assert _decision(server, "someone-else") is None  # not ours: untouched
        assert await approver.review("not-virtual")
        denied = _decision(server, "not-virtual")
        assert denied is not None and denied["type"] == "Denied" and "not a gpufed virtual node" in denied["message"]
        assert await approver.review("foreign-ip")
        denied = _decision(server, "foreign-ip")
        assert denied is not None and denied["type"] == "Denied" and "10.1.2.3" in denied["message"]
        # Its node is not registered yet: it waits instead of being denied.
        approver._pending["early"] = asyncio.get_running_loop().time()
        assert not await approver.review("early")
        assert _decision(server, "early") is None
        _node(server, "gpufed-b")
        assert await approver.review("early")
        early = _decision(server, "early")
        assert early is not None and early["type"] == "Approved"
        assert len(server.calls("PUT", "/apis/certificates.k8s.io/v1/certificatesigningrequests/good/approval")) == 1


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
