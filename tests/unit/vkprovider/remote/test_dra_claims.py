"""The twins of offloaded pods' ResourceClaims against two fake API servers
(vkprovider.remote.dra_claims.ClaimOffloader): planned from the consumer's claim and the node's
published slice, created owned by the twin pod, adopted by a second pod, refused when shared across
nodes, and the provider's allocation shown on the consumer's claim once."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.wire import DRA_DRIVER, PROVIDER_ALLOCATION_ANNOTATION
from tests.unit.fakes import serve
from vkprovider.forge.devices import CLASS_ATTRIBUTE
from vkprovider.forge.meta import Target
from vkprovider.node.provider import ProviderError
from vkprovider.remote.dra_claims import NOT_OFFLOADABLE, ClaimOffloader
from vkprovider.remote.events_relay import EventRelay

NODE = "gpufed-gpu-a"
TARGET = Target("c1", NODE, "team-c1", "gpu-a", None)


def consumer_claim(pool: str = NODE) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": "big", "uid": "claim-uid"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufed.io"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRA_DRIVER, "pool": pool, "device": "g1-0"}]}
            }
        },
    }


def pod(name: str, uid: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": name, "uid": uid},
        "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": "big"}]},
    }


async def test_plan_ensure_adopt_and_report() -> None:
    async with serve() as (local, local_api), serve() as (remote, remote_api):
        local.create("resourceclaims", consumer_claim(), "resource.k8s.io/v1")
        local.create(
            "resourceslices",
            {
                "metadata": {"name": NODE},
                "spec": {"devices": [{"name": "g1-0", "attributes": {CLASS_ATTRIBUTE: {"string": "gpu.nvidia.com"}}}]},
            },
            "resource.k8s.io/v1",
        )
        events = EventRelay(local_api, "gpu-a", "test")
        dra = ClaimOffloader(local_api, remote_api, None, "gpu-a", "c1", events)
        plan = await dra.plan(pod("p1", "u1"), TARGET)
        ((entry, twin),) = plan
        assert (
            entry == "gpu" and twin["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
        )
        await dra.ensure({"metadata": {"name": "p1", "uid": "u1"}}, plan)
        await dra.ensure({"metadata": {"name": "p2", "uid": "u2"}}, plan)  # a second pod shares the claim
        made = remote.get("resourceclaims", "team-c1", "big")
        assert made is not None
        assert [o["uid"] for o in made["metadata"]["ownerReferences"]] == ["u1", "u2"]
        assert "status" not in made or not made["status"].get("allocation")

        twin_pod = {
            "metadata": {"namespace": "team-c1", "name": "p1", "uid": "t1"},
            "spec": {"nodeName": "gpu-a-h100-3", "resourceClaims": [{"name": "gpu", "resourceClaimName": "big"}]},
        }
        await dra.report("team", twin_pod)  # not allocated yet: nothing shown
        claim = local.get("resourceclaims", "team", "big")
        assert claim is not None and PROVIDER_ALLOCATION_ANNOTATION not in (claim["metadata"].get("annotations") or {})
        remote.update(
            "resourceclaims",
            "team-c1",
            "big",
            lambda o: o.setdefault("status", {}).update(
                allocation={
                    "devices": {"results": [{"driver": "gpu.nvidia.com", "pool": "gpu-a-h100-3", "device": "gpu-0"}]}
                }
            ),
        )
        await dra.report("team", twin_pod)
        claim = local.get("resourceclaims", "team", "big")
        assert claim is not None
        assert (
            claim["metadata"]["annotations"][PROVIDER_ALLOCATION_ANNOTATION]
            == "gpu-a: gpu.nvidia.com/gpu-a-h100-3/gpu-0"
        )
        patches = len([r for r in local.requests if r.method == "PATCH"])
        await dra.report("team", twin_pod)  # reported once per twin
        assert len([r for r in local.requests if r.method == "PATCH"]) == patches


async def test_a_claim_held_on_another_node_refuses_the_pod() -> None:
    async with serve() as (local, local_api), serve() as (_remote, remote_api):
        local.create("resourceclaims", consumer_claim(pool="gpufed-gpu-b"), "resource.k8s.io/v1")
        dra = ClaimOffloader(local_api, remote_api, None, "gpu-a", "c1", EventRelay(local_api, "gpu-a", "test"))
        with pytest.raises(ProviderError) as refused:
            await dra.plan(pod("p1", "u1"), TARGET)
        assert refused.value.reason == NOT_OFFLOADABLE and not refused.value.retry
        assert "gpufed-gpu-b" in str(refused.value)
