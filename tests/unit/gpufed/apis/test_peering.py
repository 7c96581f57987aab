"""The peering kinds: ResourceSlice validation, and objects a newer version wrote are still read."""

from __future__ import annotations

import pytest

from gpufed.apis.peering import ForeignCluster, ResourceSlice, TenantPolicy


def test_resource_slice_validation() -> None:
    ok = ResourceSlice.model_validate(
        {"spec": {"providerClusterId": "gpu-a-1", "resources": {"nvidia.com/gpu": "8"}, "gpuProduct": "NVIDIA-L4"}}
    )
    assert ok.spec.resources["nvidia.com/gpu"] == "8"
    with pytest.raises(ValueError, match="must not be negative"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "p", "resources": {"nvidia.com/gpu": "-1"}}})
    with pytest.raises(ValueError, match="unknown resource"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "p", "resources": {"ephemeral-storage": "1"}}})
    with pytest.raises(ValueError, match="not a quantity"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "p", "resources": {"cpu": "lots"}}})
    with pytest.raises(ValueError, match="pattern"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "Bad_ID", "resources": {"cpu": "1"}}})


def test_tenant_policy_limits_are_checked_like_slices() -> None:
    assert TenantPolicy.model_validate({"maxResources": {"cpu": "4", "memory": "8Gi"}}).max_resources["cpu"] == "4"
    with pytest.raises(ValueError, match="unknown resource"):
        TenantPolicy.model_validate({"maxResources": {"bogus": "1"}})
    assert not TenantPolicy().pod_security.allow_privileged, "everything is refused unless allowed"


def test_objects_written_by_a_newer_version_are_read() -> None:
    """Version skew: a field added by the next version (in spec or status) is ignored, not an error."""
    newer = {
        "spec": {"clusterId": "gpu-a-1234abcd", "roles": ["Provider"], "fieldFromTheFuture": {"x": 1}},
        "status": {"phase": "Peered", "anotherNewField": True},
    }
    fc = ForeignCluster.model_validate(newer)
    assert fc.spec.cluster_id == "gpu-a-1234abcd"
    assert "fieldFromTheFuture" not in fc.model_dump(by_alias=True)["spec"]


def test_tenant_ingress_hosts_and_annotations_are_checked() -> None:
    policy = TenantPolicy.model_validate(
        {"ingressHosts": ["*.team.example.com", "web.example.com"], "ingressAnnotations": ["example.com/*", "a/b"]}
    )
    assert policy.ingress_hosts == ["*.team.example.com", "web.example.com"]
    assert TenantPolicy().ingress_hosts == [] and TenantPolicy().ingress_annotations == []
    for bad in ({"ingressHosts": ["*"]}, {"ingressHosts": ["a.*.com"]}, {"ingressAnnotations": ["bad key"]}):
        with pytest.raises(ValueError):
            TenantPolicy.model_validate(bad)
