"""The PodProvider conformance suite (tests/unit/provider_conformance.py) against the REAL
`RemoteProvider`: the consumer's credentials for gpu-a, a real twin namespace, kwok running the twins.

The provider under test owns its own virtual-node label (`conformance-…`), so the virtual kubelet
that serves gpu-a never touches its twins. Phases are driven the way a provider's kubelet would
move them: kwok makes a scheduled twin Running; Succeeded/Failed are written to the twin's status
with the provider's admin identity; `vanish` force-deletes the twin behind the provider's back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import yaml

from gpufed.apis.wire import ClusterID
from gpufed.kube import rest
from gpufed.kube.client import client_from_dict
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import gpufed, out, peered_session
from tests.unit import provider_conformance as conf
from vkprovider.remote.provider import RemoteProvider, RemoteSettings

pytestmark = pytest.mark.e2e

NAMESPACE = "conformance"
RUN_DURATION = "local.gpufed.io/run-duration"
EXIT_CODE = "local.gpufed.io/exit-code"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8")})


@pytest.fixture(scope="module")
def offloaded(clusters: Clusters, ids: dict[str, ClusterID]) -> Iterator[str]:
    clusters.kubectl("consumer", "create", "namespace", NAMESPACE)
    p = gpufed(
        "offload-namespace",
        NAMESPACE,
        "--kubeconfig",
        str(clusters.kubeconfig),
        "--context",
        "consumer",
        "--pod-strategy",
        "Remote",
    )
    assert p.returncode == 0, out(p)
    yield f"{NAMESPACE}-{ids['consumer']}"
    clusters.kubectl("consumer", "delete", "namespace", NAMESPACE, "--wait=false")


@pytest.fixture
async def remote_api(api: dict[str, Any], ids: dict[str, ClusterID]) -> AsyncIterator[Any]:
    secret = await rest.get(
        api["consumer"], rest.path("v1", "secrets", f"gpufed-remote-{ids['gpu-a']}", namespace="gpufed")
    )
    assert secret is not None
    client = await client_from_dict(yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"])))
    try:
        yield client
    finally:
        await client.close()


def make_pod(namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # kwok runs a `Never` pod for its run-duration annotation; an hour keeps it Running until
        # set_phase shortens it (the twin carries the local pod's annotations).
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "labels": {"app": "conformance"},
            "annotations": {RUN_DURATION: "1h"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


@pytest.mark.parametrize("check", conf.CHECKS, ids=[c.__name__ for c in conf.CHECKS])
async def test_remote_provider_conforms(
    check: Callable[[conf.ConformanceHarness], Awaitable[None]],
    clusters: Clusters,
    ids: dict[str, ClusterID],
    offloaded: str,
    api: dict[str, Any],
    remote_api: Any,
) -> None:
    provider = RemoteProvider(
        api["consumer"],
        remote_api,
        RemoteSettings(ids["consumer"], ids["gpu-a"], f"conformance-{uuid.uuid4().hex[:6]}", "127.0.0.1"),
    )
    admin = api["gpu-a"]

    async def set_phase(namespace: str, name: str, phase: str) -> None:
        url = rest.path("v1", "pods", name, namespace=offloaded)
        if phase == "Running":  # kwok starts a scheduled twin; wait for that
            for _ in range(300):
                pod = await rest.get(admin, url)
                if pod and (pod.get("status") or {}).get("phase") == "Running":
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"twin {name} never became Running")
        # As a kubelet would: the container exits (kwok's completion stage), 0 or an error code.
        await set_phase(namespace, name, "Running")
        annotations = {RUN_DURATION: "0s", **({EXIT_CODE: "3"} if phase == "Failed" else {})}
        await rest.merge_patch(admin, url, {"metadata": {"annotations": annotations}})

    async def vanish(namespace: str, name: str) -> None:
        await rest.delete(admin, rest.path("v1", "pods", name, namespace=offloaded), grace_period_s=0)

    async def wait_for(predicate: Callable[[], bool]) -> None:
        for _ in range(600):
            if predicate():
                return
            await asyncio.sleep(0.1)
        raise AssertionError("timed out after 60 s")

    await check(conf.ConformanceHarness(provider, NAMESPACE, make_pod, set_phase, vanish, wait_for))
    # Nothing the check created may stay behind on the provider.
    left = await rest.list_items(
        admin, rest.path("v1", "pods", namespace=offloaded), params={"labelSelector": "app=conformance"}
    )
    live = [p["metadata"]["name"] for p in left if not p["metadata"].get("deletionTimestamp")]
    assert live == [], json.dumps(live)
