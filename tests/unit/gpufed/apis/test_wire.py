"""ClusterID rules and derived names."""

from __future__ import annotations

import pytest

from gpufed.apis.wire import MAX_CLUSTER_ID, default_cluster_id, parse_cluster_id, tenant_namespace, twin_namespace


@pytest.mark.parametrize("value", ["a", "gpu-a-3f2c91d0", "x" * MAX_CLUSTER_ID])
def test_valid_ids(value: str) -> None:
    assert parse_cluster_id(value) == value


@pytest.mark.parametrize("value", ["", "-a", "a-", "A", "a_b", "x" * (MAX_CLUSTER_ID + 1), "a.b", "ünï"])
def test_invalid_ids(value: str) -> None:
    with pytest.raises(ValueError, match="invalid cluster ID"):
        parse_cluster_id(value)


def test_default_id_is_stable_and_uses_the_hint() -> None:
    uid = "3F2C91D0-1111-2222-3333-444455556666"
    assert default_cluster_id(uid, "GPU A!") == "gpu-a-3f2c91d0"
    assert default_cluster_id(uid) == "cluster-3f2c91d0"
    assert default_cluster_id(uid, "x" * 50) == default_cluster_id(uid, "x" * 50)
    assert len(default_cluster_id(uid, "x" * 50)) <= MAX_CLUSTER_ID
    with pytest.raises(ValueError, match="too few hex"):
        default_cluster_id("zz")


def test_derived_names() -> None:
    cid = parse_cluster_id("consumer-1a2b3c4d")
    assert tenant_namespace(cid) == "gpufed-tenant-consumer-1a2b3c4d"
    assert twin_namespace("team-a", cid) == "team-a-consumer-1a2b3c4d"
    with pytest.raises(ValueError, match="longer than 63"):
        twin_namespace("n" * 50, cid)
