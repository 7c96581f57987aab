"""Twins of offloaded pods' ResourceClaims (vkprovider.forge.dra_claims): re-created without the
consumer's allocation and with the provider's class; what would not mean the same is refused."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.wire import DRA_DRIVER, ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL
from vkprovider.forge.dra_claims import (
    ClaimRefusedError,
    pod_claims,
    provider_allocation,
    twin_claim,
    twin_pod_claims,
    with_owner,
)
from vkprovider.forge.meta import Target

NODE = "gpufed-gpu-a-h100"
TARGET = Target("consumer1", NODE, "team-consumer1", "gpu-a", None)
SELECTOR = {"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}


def claim(
    *, exactly: dict[str, Any] | None = None, pool: str = NODE, driver: str = DRA_DRIVER, **spec: Any
) -> dict[str, Any]:
    request = {"deviceClassName": "gpu.gpufed.io", "selectors": [SELECTOR], "count": 1, **(exactly or {})}
    return {
        "metadata": {"namespace": "team", "name": "big", "uid": "claim-uid", "labels": {"app": "x"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}], **spec}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": driver, "pool": pool, "device": "g1-0"}]}
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        },
    }


def classes(device: str) -> str | None:
    return {"g1-0": "gpu.nvidia.com"}.get(device)


def test_the_twin_asks_the_providers_class_with_the_same_selectors_and_no_allocation() -> None:
    twin = twin_claim(claim(), TARGET, classes)
    assert twin["metadata"]["namespace"] == "team-consumer1" and twin["metadata"]["name"] == "big"
    assert twin["metadata"]["labels"][ORIGIN_CLUSTER_LABEL] == "consumer1"
    assert twin["metadata"]["labels"][ORIGIN_UID_LABEL] == "claim-uid"
    assert "status" not in twin
    (request,) = twin["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [SELECTOR],
            "count": 1,
            "allocationMode": "ExactCount",
        },
    }


@pytest.mark.parametrize(
    ("changed", "words"),
    [
        ({"pool": "gpufed-gpu-b"}, "not on virtual node"),
        ({"driver": "gpu.nvidia.com"}, "not on virtual node"),
        ({"exactly": {"adminAccess": True}}, "admin access"),
        ({"exactly": {"allocationMode": "All"}}, "all devices"),
        ({"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]}, "driver configuration"),
        ({"constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.gpufed.io/provider"}]}, "gpufed's own"),
    ],
)
def test_what_would_not_mean_the_same_at_the_provider_is_refused(changed: dict[str, Any], words: str) -> None:
    with pytest.raises(ClaimRefusedError, match=words):
        twin_claim(claim(**changed), TARGET, classes)


def test_an_unallocated_claim_or_an_unknown_device_is_refused() -> None:
    c = claim()
    c["status"] = {}
    with pytest.raises(ClaimRefusedError, match="not allocated"):
        twin_claim(c, TARGET, classes)
    with pytest.raises(ClaimRefusedError, match="no longer offered"):
        twin_claim(claim(), TARGET, lambda _d: None)


def test_pod_claims_and_the_twin_pods_entries() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]},
    }
    assert pod_claims(pod) == [("a", "shared"), ("b", "p-b-x1")]
    assert pod_claims({"spec": pod["spec"]}) == [("a", "shared"), ("b", None)]
    assert twin_pod_claims(pod, {"a": "shared", "b": "p-b-x1"}) == [
        {"name": "a", "resourceClaimName": "shared"},
        {"name": "b", "resourceClaimName": "p-b-x1"},
    ]


def test_owners_accumulate_once() -> None:
    twin: dict[str, Any] = {"metadata": {}}
    pod = {"metadata": {"name": "p", "uid": "u1"}}
    refs = with_owner(twin, pod)
    assert refs == [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1"}]
    assert with_owner({"metadata": {"ownerReferences": refs}}, pod) is None


def test_the_providers_allocation_is_checked_before_it_is_shown() -> None:
    allocated = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "gpu.nvidia.com", "pool": "gpu-a-h100-3", "device": "gpu-0"},
                        {"driver": "gpu.nvidia.com", "pool": "Evil Pool\n", "device": "gpu-1"},
                    ]
                }
            }
        }
    }
    assert provider_allocation([allocated]) == "gpu.nvidia.com/gpu-a-h100-3/gpu-0, gpu.nvidia.com/?/gpu-1"
    assert provider_allocation([{"status": {}}]) is None
