"""The provider's grant decision: live capacity, other consumers, policy, and the reasons given."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.pool import GPU_RESOURCE as GPU
from peering import grants
from peering.grants import (
    Decision,
    GrantError,
    NodeInfo,
    OtherGrant,
    PodLoad,
    Reason,
    SliceRequest,
    TenantPolicy,
    decide,
    free_capacity,
)

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"


D = Decimal


def gpu_node(name: str, gpus: int, product: str = H100, *, schedulable: bool = True) -> NodeInfo:
    return NodeInfo(
        name,
        {"cpu": D(96), "memory": D(2**40), "pods": D(110), GPU: D(gpus)},
        {GPU_PRODUCT_LABEL: product},
        schedulable,
    )


NODES = [gpu_node(f"a{i}", 8) for i in range(4)]


def ask(gpus: int, product: str | None = None, **more: int) -> SliceRequest:
    res = {GPU: D(gpus)} | {k: D(v) for k, v in more.items()}
    return SliceRequest(res, product)


def run(
    req: SliceRequest,
    *,
    nodes: list[NodeInfo] = NODES,
    pods: list[PodLoad] | None = None,
    others: list[OtherGrant] | None = None,
    policy: TenantPolicy | None = None,
    own: dict[str, Decimal] | None = None,
) -> Decision:
    return decide(
        req, nodes=nodes, pods=pods or [], own_usage=own or {}, others=others or [], policy=policy or TenantPolicy()
    )


def test_everything_free_is_granted() -> None:
    d = run(ask(16, H100))
    assert d.accepted and d.reason is Reason.GRANTED and d.granted == {GPU: D(16)}
    assert d.available[GPU] == 32


def test_running_pods_lower_the_grant() -> None:
    pods = [PodLoad("a0", {GPU: D(8)}), PodLoad("a1", {GPU: D(6)}), PodLoad("a2", {GPU: D(8)})]
    d = run(ask(16), pods=pods)
    assert d.accepted and d.reason is Reason.PARTIAL
    assert d.granted[GPU] == 10
    assert "nvidia.com/gpu: 10 of 16" in d.message and "10 free" in d.message


def test_other_consumers_unused_grants_are_reserved_but_their_usage_not_twice() -> None:
    # Another consumer holds 12 GPUs, 8 of them in use by pods that sit on a0.
    pods = [PodLoad("a0", {GPU: D(8)})]
    others = [OtherGrant({GPU: D(12)}, {GPU: D(8)}, H100)]
    d = run(ask(32, H100), pods=pods, others=others)
    assert d.granted[GPU] == 32 - 8 - 4


def test_own_usage_is_kept_on_re_evaluation() -> None:
    # All 32 GPUs are in use, 10 of them by this consumer: it keeps 10.
    pods = [PodLoad(f"a{i}", {GPU: D(8)}) for i in range(4)]
    d = run(ask(16), pods=pods, own={GPU: D(10)})
    assert d.accepted and d.granted[GPU] == 10


def test_unschedulable_and_other_product_nodes_do_not_count() -> None:
    nodes = [gpu_node("a0", 8), gpu_node("a1", 8, schedulable=False), gpu_node("l0", 1, L4)]
    assert free_capacity(nodes, [], H100)[GPU] == 8
    assert free_capacity(nodes, [], None)[GPU] == 9
    assert free_capacity(nodes, [], L4)[GPU] == 1


def test_overcommitted_node_does_not_hide_free_space_elsewhere() -> None:
    pods = [PodLoad("a0", {GPU: D(12)})]  # impossible, but must not make a1's 8 disappear
    assert free_capacity(NODES[:2], pods, None)[GPU] == 8


def test_policy_limit_gives_a_partial_grant_saying_so() -> None:
    d = run(ask(16), policy=TenantPolicy(maximum={GPU: D(4)}))
    assert d.accepted and d.reason is Reason.PARTIAL and d.granted[GPU] == 4
    assert "policy allows at most 4" in d.message


def test_zero_capacity_is_denied_with_a_reason() -> None:
    pods = [PodLoad(f"a{i}", {GPU: D(8)}) for i in range(4)]
    d = run(ask(2), pods=pods)
    assert not d.accepted and d.reason is Reason.NO_CAPACITY and d.granted == {}
    assert "only 0 free" in d.message


def test_zero_policy_is_denied_as_policy() -> None:
    d = run(ask(2), policy=TenantPolicy(maximum={GPU: D(0)}))
    assert not d.accepted and d.reason is Reason.POLICY


def test_partial_refused_when_policy_says_so() -> None:
    d = run(ask(40), policy=TenantPolicy(allow_partial=False))
    assert not d.accepted and d.reason is Reason.PARTIAL_NOT_ALLOWED and d.granted == {}
    assert "32 of 40" in d.message


def test_product_not_allowed() -> None:
    d = run(ask(1, H100), policy=TenantPolicy(allowed_gpu_products=frozenset({L4})))
    assert not d.accepted and d.reason is Reason.PRODUCT_NOT_ALLOWED and L4 in d.message


def test_no_selector_with_restricted_products_is_refused() -> None:
    nodes = [*NODES, gpu_node("l0", 1, L4)]
    d = run(ask(1), nodes=nodes, policy=TenantPolicy(allowed_gpu_products=frozenset({L4})))
    assert not d.accepted and d.reason is Reason.PRODUCT_NOT_ALLOWED and "selector" in d.message


def test_unknown_product_names_the_available_ones() -> None:
    d = run(ask(1, "NVIDIA-B200"))
    assert not d.accepted and d.reason is Reason.NO_SUCH_PRODUCT and H100 in d.message


def test_cpu_memory_pods_are_granted_from_the_selected_pool() -> None:
    nodes = [gpu_node("a0", 8), gpu_node("l0", 1, L4)]
    d = run(SliceRequest({"cpu": D(150), "memory": D(2**30), "pods": D(50)}, L4), nodes=nodes)
    assert d.reason is Reason.PARTIAL and d.granted["cpu"] == 96 and d.granted["pods"] == 50
    assert d.granted["memory"] == 2**30


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"ephemeral-storage": D(1)}, "unknown resource"),
        ({GPU: D(-1)}, "must not be negative"),
        ({GPU: D(0)}, "asks for nothing"),
        ({}, "asks for nothing"),
    ],
)
def test_invalid_requests(resources: dict[str, Decimal], message: str) -> None:
    with pytest.raises(GrantError, match=message):
        run(SliceRequest(resources))


# ---- capacity read from API objects, and the quota partition


def test_pod_requests_follow_the_scheduler_rules() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "2"}}},
                {"resources": {"requests": {"cpu": "250m"}}},
                {},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
            "overhead": {"cpu": "100m"},
        }
    }
    r = grants.pod_requests(pod)
    assert r["cpu"] == Decimal("2.1")  # the init container's 2 beats 0.75, plus overhead
    assert r["memory"] == Decimal(1024**3)
    assert r["nvidia.com/gpu"] == 2 and r["pods"] == 1


def test_node_info_schedulability() -> None:
    def node(**spec: object) -> dict[str, object]:
        return {
            "metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "H100"}},
            "spec": spec,
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "ephemeral-storage": "1Ti"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    ok = grants.node_info(node())
    assert ok.schedulable and ok.allocatable == {"nvidia.com/gpu": 8, "cpu": 64}
    assert grants.node_info(node(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])).schedulable
    assert not grants.node_info(node(taints=[{"key": "maintenance", "effect": "NoExecute"}])).schedulable
    assert not grants.node_info(node(unschedulable=True)).schedulable
    not_ready = node()
    not_ready["status"] = {"allocatable": {}, "conditions": [{"type": "Ready", "status": "False"}]}
    assert not grants.node_info(not_ready).schedulable


def test_partition_never_sums_above_the_grant() -> None:
    grant = {"nvidia.com/gpu": Decimal(8), "cpu": Decimal("10"), "memory": Decimal(3), "pods": Decimal(10)}
    used = {
        "b": {"nvidia.com/gpu": Decimal(2), "cpu": Decimal("1.5"), "pods": Decimal(1)},
        "a": {},
        "c": {"nvidia.com/gpu": Decimal(1)},
    }
    out = grants.partition(grant, used)
    for r in grants.RESOURCES:
        assert sum(out[n][r] for n in out) == max(grant[r], sum(u.get(r, Decimal(0)) for u in used.values()))
        for n in used:
            assert out[n][r] >= used[n].get(r, Decimal(0)), "a namespace was limited below its usage"
    # 5 free GPUs over 3 namespaces: 2, 2, 1 in name order on top of usage.
    assert [out[n]["nvidia.com/gpu"] for n in ("a", "b", "c")] == [2, 4, 2]
    assert out["a"]["cpu"] + out["b"]["cpu"] + out["c"]["cpu"] == Decimal(10)


def test_partition_holds_namespaces_at_usage_when_the_grant_shrank() -> None:
    out = grants.partition({"nvidia.com/gpu": Decimal(2)}, {"x": {"nvidia.com/gpu": Decimal(3)}})
    assert out["x"]["nvidia.com/gpu"] == 3
    assert grants.partition({"cpu": Decimal(1)}, {}) == {}


def test_shared_gpu_labels_are_the_intersection_over_matching_gpu_nodes() -> None:
    from peering.grants import NodeInfo, shared_gpu_labels

    gpu = {"nvidia.com/gpu": Decimal(8)}
    nodes = [
        NodeInfo("a", gpu, {"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.memory": "81559", "zone": "x"}),
        NodeInfo("b", gpu, {"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.memory": "81920"}),
        NodeInfo("c", gpu, {"nvidia.com/gpu.product": "L4", "nvidia.com/gpu.memory": "23034"}),
        NodeInfo("cpu", {"cpu": Decimal(4)}, {"nvidia.com/gpu.product": "H100"}),
        NodeInfo("cordoned", gpu, {"nvidia.com/gpu.product": "H100"}, schedulable=False),
    ]
    assert shared_gpu_labels(nodes, "H100") == {"nvidia.com/gpu.product": "H100"}
    assert shared_gpu_labels(nodes[:1], None) == {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "H100"}
    assert shared_gpu_labels(nodes, None) == {}
    assert shared_gpu_labels(nodes, "B200") == {}


def test_node_info_lists_the_resources_no_grant_is_made_of() -> None:
    node = {
        "metadata": {"name": "n"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {
                "cpu": "8",
                "memory": "64Gi",
                "pods": "110",
                "ephemeral-storage": "100Gi",
                "nvidia.com/gpu": "4",
                "nvidia.com/mig-1g.10gb": "7",
                "hugepages-2Mi": "0",
                "example.com/fpga": "1",
            },
        },
    }
    assert grants.node_info(node).extended == {"nvidia.com/mig-1g.10gb", "hugepages-2Mi", "example.com/fpga"}


def test_the_quota_holds_the_grant_storage_zero_of_the_rest_and_object_counts() -> None:
    limits = {"cpu": Decimal(2), "memory": Decimal(2**30), "nvidia.com/gpu": Decimal(1), "pods": Decimal(3)}
    hard = grants.quota_hard(limits, {"nvidia.com/mig-1g.10gb", "nvidia.com/gpu"}, tenant=False)
    assert hard["requests.cpu"] == "2" and hard["requests.memory"] == "1Gi" and hard["pods"] == "3"
    assert hard["requests.nvidia.com/gpu"] == "1" and hard["requests.nvidia.com/mig-1g.10gb"] == "0"
    assert hard["requests.ephemeral-storage"] == hard["limits.ephemeral-storage"] == "60Gi"
    assert hard["services.nodeports"] == hard["services.loadbalancers"] == "0"
    assert hard["requests.storage"] == hard["persistentvolumeclaims"] == "0", "no storage grant: no claims"
    # reflected Secrets, and one service-account token Secret per pod slot
    assert hard["count/secrets"] == "1003" and "count/twinnamespaces.gpufed.io" not in hard
    tenant = grants.quota_hard({r: Decimal(0) for r in grants.RESOURCES}, (), tenant=True)
    assert tenant["pods"] == "0" and tenant["limits.ephemeral-storage"] == "0"
    assert tenant["count/twinnamespaces.gpufed.io"] == "200" and tenant["count/secrets"] == "1000"
