"""The capacity model's values (gpupool.capacity): pod shapes as the scheduler counts them, and
toleration matching as Kubernetes does it."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.wire import VIRTUAL_NODE_TYPE_LABELS
from gpupool.capacity import (
    Taint,
    Toleration,
    shape_of,
)
from tests.unit.gpupool.cluster import A100, H100, GiB, pod


def test_shape_counts_requests_as_the_scheduler_does() -> None:
    p = pod("p", None, gpus=2, cpu="500m", memory="3Gi")
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]
    p["spec"]["overhead"] = {"memory": "1Gi"}
    s = shape_of(p)
    assert (s.gpus, s.cpu_millis, s.memory_bytes) == (2, 4000, 4 * GiB)
    assert s.gpu_product is None and s.node_selector == () and s.tolerations == ()


def test_shape_rounds_fractional_requests_up() -> None:
    s = shape_of(pod("p", None, cpu="0.0005", memory="1500m"))
    assert (s.cpu_millis, s.memory_bytes) == (1, 2)


def test_shape_keeps_real_selectors_and_drops_virtual_node_ones() -> None:
    selector = {
        "nvidia.com/gpu.product": H100,
        "nvidia.com/gpu.memory": "81559",
        "gpufed.io/remote-cluster-id": "gpu-a-1",
        **VIRTUAL_NODE_TYPE_LABELS,
        "zone": "b",
    }
    s = shape_of(pod("p", None, spec={"nodeSelector": selector}))
    assert s.gpu_product == H100
    assert s.node_selector == (("nvidia.com/gpu.memory", "81559"), ("zone", "b"))


def test_shape_tolerations_and_the_pool_product_override() -> None:
    tol = [
        {"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"},
        {"key": "dedicated", "value": "ml"},
        {"operator": "Exists", "tolerationSeconds": 30},
    ]
    s = shape_of(pod("p", None, spec={"tolerations": tol, "nodeSelector": {"nvidia.com/gpu.product": A100}}))
    assert s.tolerations == (
        Toleration("gpufed.io/virtual-node", "Exists", "", "NoExecute"),
        Toleration("dedicated", "Equal", "ml", ""),
        Toleration("", "Exists", "", ""),
    )
    assert s.gpu_product == A100
    assert shape_of(pod("p", None), gpu_product=H100).gpu_product == H100


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
                }
            }
        }
    }


def test_shape_product_from_required_node_affinity() -> None:
    pinned = [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100]}]
    assert shape_of(pod("p", None, spec=_affinity(pinned))).gpu_product == A100
    assert shape_of(pod("p", None, spec=_affinity(pinned, pinned))).gpu_product == A100
    two = [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100, H100]}]
    assert shape_of(pod("p", None, spec=_affinity(two))).gpu_product is None
    other = [{"key": "zone", "operator": "In", "values": ["a"]}]
    assert shape_of(pod("p", None, spec=_affinity(pinned, other))).gpu_product is None, "terms are ORed"


# ---- tolerations


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("k", "Equal", "v", "NoSchedule"), Taint("k", "v", "NoSchedule"), True),
        (Toleration("k", "Equal", "v", "NoSchedule"), Taint("k", "w", "NoSchedule"), False),
        (Toleration("k", "Equal", "v", ""), Taint("k", "v", "NoExecute"), True),
        (Toleration("k", "Equal", "v", "NoExecute"), Taint("k", "v", "NoSchedule"), False),
        (Toleration("k", "Exists", "", "NoSchedule"), Taint("k", "anything", "NoSchedule"), True),
        (Toleration("j", "Exists", "", ""), Taint("k", "", "NoSchedule"), False),
        (Toleration("", "Exists", "", ""), Taint("k", "v", "NoExecute"), True),
        (Toleration("", "Exists", "", "NoSchedule"), Taint("k", "v", "NoExecute"), False),
        (Toleration("k", "", "", ""), Taint("k", "", "NoSchedule"), True),
        (Toleration("k", "Bogus", "v", ""), Taint("k", "v", "NoSchedule"), False),
    ],
)
def test_toleration_matching_follows_kubernetes(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


# ---- snapshot
