"""`gpufed peer`'s checks that run before anything is touched."""

from __future__ import annotations

import pytest

from gpufed.apis.wire import ClusterID
from peering.ops.peer import PeerError, validate_request

P = ClusterID("gpu-a-12345678")


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"nvidia.com/gpu": "-1"}, "must not be negative"),
        ({"example.com/fpga": "1"}, "unknown resource"),
        ({"cpu": "lots"}, "cpu"),
        ({"cpu": "0"}, "asks for nothing"),
        ({"storage": "-10Gi"}, "must not be negative"),
        ({"storage": "a lot"}, "storage"),
    ],
)
def test_invalid_slices_are_refused(resources: dict[str, str], message: str) -> None:
    with pytest.raises(PeerError, match=message):
        validate_request(resources, None, P)


def test_valid_slice() -> None:
    spec = validate_request({"nvidia.com/gpu": "8", "memory": "64Gi"}, "NVIDIA-H100-80GB-HBM3", P)
    assert spec.provider_cluster_id == P and spec.gpu_product == "NVIDIA-H100-80GB-HBM3"


def test_a_slice_may_ask_for_claim_storage() -> None:
    spec = validate_request({"nvidia.com/gpu": "8", "storage": "100Gi"}, None, P)
    assert spec.resources["storage"] == "100Gi"
