"""Kueue flavors of the federated pool (gpupool.flavors): one flavor per pool node, GPU quotas that
never promise more than the grant."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpupool.flavors import Pool, caps, clamp, flavor, gpu_quotas, with_gpu_quotas

H100 = Pool("gpufed-gpu-a-h100", "gpu-a", total=32, granted=16)
A100 = Pool("gpufed-gpu-a-a100", "gpu-a", total=8, granted=16)
L4 = Pool("gpufed-gpu-b", "gpu-b", total=None, granted=4)
POOLS = {p.node: p for p in (H100, A100, L4)}


def test_a_flavor_pins_to_its_pool_node_and_tolerates_virtual_nodes() -> None:
    f = flavor(H100)
    assert f["kind"] == "ResourceFlavor" and f["metadata"]["name"] == H100.node
    assert f["spec"]["nodeLabels"] == {"kubernetes.io/hostname": H100.node}
    assert f["spec"]["tolerations"] == [{"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"}]
    assert f["metadata"]["labels"]["gpufed.io/remote-cluster-id"] == "gpu-a"
    # Kueue's current API by default; the same object in the version an older Kueue serves
    assert f["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    old = flavor(H100, "v1beta1")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1" and old["spec"] == f["spec"]


def test_a_flavor_says_the_most_gpus_one_pod_can_get_on_its_pool_when_known() -> None:
    sized = flavor(dataclasses.replace(H100, pod_gpus=8))
    assert sized["spec"]["nodeLabels"] == {"kubernetes.io/hostname": H100.node, "gpufed.io/pod-gpus-max": "8"}


def test_caps_are_the_product_within_the_grant_and_the_grant_per_provider() -> None:
    per_flavor, per_provider = caps(POOLS)
    assert per_flavor == {H100.node: 16, A100.node: 8, L4.node: 4}
    assert per_provider == {"gpu-a": 16, "gpu-b": 4}


def test_quotas_within_the_grant_are_kept_as_asked() -> None:
    asked = {("team-a", H100.node): 8, ("team-b", H100.node): 8, ("team-a", L4.node): 4}
    assert clamp(asked, POOLS) == asked


def test_quotas_over_a_flavor_or_a_providers_grant_are_shared_in_proportion() -> None:
    # 24 asked of gpu-b's 4: 3 to 1
    assert clamp({("a", L4.node): 18, ("b", L4.node): 6}, POOLS) == {("a", L4.node): 3, ("b", L4.node): 1}
    # gpu-a's H100 and A100 pools share one grant of 16
    got = clamp({("a", H100.node): 16, ("b", A100.node): 8}, POOLS)
    assert sum(got.values()) == 16 and got[("b", A100.node)] <= 8
    # a flavor that is not gpufed's is left as asked
    assert clamp({("a", "on-prem"): 100}, POOLS) == {("a", "on-prem"): 100}


@given(st.dictionaries(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(list(POOLS))), st.integers(0, 64)))
def test_the_promise_never_exceeds_a_grant_and_no_queue_gets_more_than_it_asked(asked: dict[Any, int]) -> None:
    got = clamp(asked, POOLS)
    per_flavor, per_provider = caps(POOLS)
    for name, cap in per_flavor.items():
        assert sum(v for (_, f), v in got.items() if f == name) <= cap
    for provider, grant in per_provider.items():
        assert sum(v for (_, f), v in got.items() if POOLS[f].provider == provider) <= grant
    assert all(0 <= got[k] <= asked[k] for k in asked)


def test_gpu_quotas_are_read_and_written_in_place() -> None:
    cq: dict[str, Any] = {
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": H100.node,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "64"},
                                {"name": "nvidia.com/gpu", "nominalQuota": 12},
                            ],
                        },
                        {"name": "on-prem", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "2"}]},
                    ],
                }
            ]
        }
    }
    assert gpu_quotas(cq) == {H100.node: 12, "on-prem": 2}
    groups = with_gpu_quotas(cq, {H100.node: 8})
    assert groups[0]["flavors"][0]["resources"] == [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "nvidia.com/gpu", "nominalQuota": "8"},
    ]
    assert groups[0]["flavors"][1] == cq["spec"]["resourceGroups"][0]["flavors"][1]
