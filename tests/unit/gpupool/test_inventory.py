"""The live capacity model (gpupool.inventory): the snapshot, placement and replica counts, with the
scheduler's rules (taints, selectors, terminal pods) and property tests."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufed.apis.wire import GPU_HEALTH_ANNOTATION, GPU_SOURCE_ANNOTATION, GPU_UNHEALTHY, VIRTUAL_NODE_TYPE_LABELS
from gpupool.capacity import (
    Bucket,
    PodShape,
    Snapshot,
    Toleration,
)
from gpupool.inventory import Inventory
from tests.unit.gpupool.cluster import A100, H100, GiB, inventory, node, pod


def test_snapshot_figures_per_product() -> None:
    inv = inventory(
        node("h0", labels={"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper"}),
        node("h1", labels={"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper"}),
        node("h2", labels={"nvidia.com/gpu.memory": "81559"}),
        node("h3", ready=False),
        node("a0", gpus=4, product=A100),
        node("cpu0", gpus=0, product=None, cpu="16", memory="64Gi"),
        pods=[
            pod("p1", "h0", gpus=6, cpu="10", memory="100Gi"),
            pod("p2", "h1", gpus=2),
            pod("p3", "h1", gpus=1),
            pod("done", "h2", gpus=8, phase="Succeeded"),
            pod("pending", None, gpus=8),
            pod("cpu", "cpu0", cpu="4", memory="16Gi"),
        ],
    )
    snap = inv.snapshot(7, 123.5)
    assert (snap.revision, snap.observed_at) == (7, 123.5)
    assert [p.product for p in snap.products] == ["", A100, H100]
    assert snap.gpu_products() == [A100, H100]
    h = snap.product(H100)
    assert h is not None
    assert (h.nodes, h.unhealthy_nodes, h.total, h.allocatable, h.in_use, h.free) == (3, 1, 32, 24, 9, 15)
    assert h.largest_shape == 8
    assert h.histogram == (Bucket(8, 1), Bucket(5, 1), Bucket(2, 1))
    assert h.largest_node == 8  # the most one pod could ever get on one counted node
    assert h.free_cpu_millis == 3 * 96_000 - 10_000 - 2_000
    assert h.free_memory_bytes == 3 * 1024 * GiB - 100 * GiB - 2 * GiB
    assert h.free_pods == 3 * 110 - 3
    assert dict(h.labels) == {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": H100}
    assert h.gpu_memory_mib == 81559
    assert h.source == "labels"
    cpu = snap.product("")
    assert cpu is not None and (cpu.nodes, cpu.total, cpu.free, cpu.free_cpu_millis) == (1, 0, 0, 12_000)
    assert snap.product("NVIDIA-B200") is None


def test_snapshot_excludes_cordoned_tainted_and_gpu_unhealthy_nodes() -> None:
    inv = inventory(
        node("ok"),
        node("gpu-taint", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        node("soft", taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
        node("cordoned", unschedulable=True),
        node("maint", taints=[{"key": "maintenance", "effect": "NoExecute"}]),
        node("sick", annotations={GPU_HEALTH_ANNOTATION: GPU_UNHEALTHY}),
    )
    h = inv.snapshot(1, 0).product(H100)
    assert h is not None
    assert (h.nodes, h.unhealthy_nodes, h.total, h.allocatable, h.free) == (3, 3, 48, 24, 24)


def test_snapshot_total_is_capacity_and_overcommit_floors_per_node() -> None:
    # The device plugin lowered allocatable (a GPU failed) under a pod that holds 8.
    inv = inventory(node("h0", gpus=6, capacity_gpus=8), node("h1"), pods=[pod("big", "h0", gpus=8)])
    h = inv.snapshot(1, 0).product(H100)
    assert h is not None
    assert (h.total, h.allocatable, h.in_use, h.free) == (16, 14, 8, 8), "h0 is 0 free, not -2"


def test_snapshot_source_is_nvml_only_when_every_node_says_so() -> None:
    nvml = {GPU_SOURCE_ANNOTATION: "nvml"}
    assert inventory(node("a", annotations=nvml), node("b", annotations=nvml)).snapshot(1, 0).products[0].source == (
        "nvml"
    )
    mixed = inventory(node("a", annotations=nvml), node("b", annotations={GPU_SOURCE_ANNOTATION: "labels"}))
    assert mixed.snapshot(1, 0).products[0].source == "labels"


def test_snapshot_largest_shape_skips_nodes_without_a_pod_slot() -> None:
    inv = inventory(node("full", pods=1), node("roomy", gpus=2), pods=[pod("x", "full", gpus=1)])
    h = inv.snapshot(1, 0).product(H100)
    assert h is not None and h.free == 9 and h.largest_shape == 2


def test_virtual_nodes_are_not_capacity() -> None:
    vn = node("gpufed-gpu-b", labels={**VIRTUAL_NODE_TYPE_LABELS, "gpufed.io/type": "virtual-node"})
    inv = inventory(node("h0"), vn)
    h = inv.snapshot(1, 0).product(H100)
    assert h is not None and h.total == 8
    # A real node turned into a virtual one (name reuse) is dropped.
    inv.set_node(node("h0", labels={"gpufed.io/type": "virtual-node"}))
    assert inv.snapshot(1, 0).products == ()


def test_incremental_updates_and_the_change_counter() -> None:
    inv = inventory(node("h0"))
    before = inv.changes
    inv.set_node(node("h0"))  # a heartbeat: nothing that matters changed
    assert inv.changes == before
    inv.set_pod(pod("p", None, gpus=4))  # pending: no load
    assert inv.changes == before
    inv.set_pod(pod("p", "h0", gpus=4))  # bound
    assert inv.changes == before + 1
    inv.set_pod(pod("p", "h0", gpus=4))  # status update of a bound pod
    assert inv.changes == before + 1
    assert _free(inv) == 4
    inv.set_pod(pod("p", "h0", gpus=4, phase="Succeeded"))
    assert _free(inv) == 8
    inv.set_pod(pod("q", "h0", gpus=3))
    inv.delete_pod("team", "q")
    inv.delete_pod("team", "never-seen")
    assert _free(inv) == 8
    inv.delete_node("h0")
    assert inv.snapshot(1, 0).products == ()
    # A pod seen before its node is load once the node appears.
    inv.set_pod(pod("early", "h9", gpus=5))
    inv.set_node(node("h9"))
    assert _free(inv) == 3


def test_unreadable_pod_quantities_do_not_break_the_inventory() -> None:
    inv = inventory(node("h0"), pods=[pod("ok", "h0", gpus=1)])
    inv.set_pod(pod("bad", "h0", cpu="lots"))
    assert _free(inv) == 7


def _free(inv: Inventory, product: str = H100) -> int:
    p = inv.snapshot(1, 0).product(product)
    assert p is not None
    return p.free


# ---- placement


def test_can_place_fits_and_says_where() -> None:
    inv = inventory(node("h0"), node("h1"), node("a0", gpus=4, product=A100), pods=[pod("x", "h0", gpus=6)])
    p = inv.can_place(PodShape(gpus=4, gpu_product=H100))
    assert p.placeable and p.nodes == 1
    assert p.reason == f"a pod of 4 GPUs fits on 1 node of {H100} (largest free on one node: 8 GPUs)"
    anywhere = inv.can_place(PodShape(gpus=2))
    assert anywhere.placeable and anywhere.nodes == 3


def test_can_place_refuses_a_fragmented_product() -> None:
    inv = inventory(
        *(node(f"h{i}") for i in range(4)),
        pods=[pod(f"p{i}", f"h{i}", gpus=6) for i in range(4)],
    )
    p = inv.can_place(PodShape(gpus=4, gpu_product=H100))
    assert not p.placeable and p.nodes == 0
    assert p.reason == f"no node of {H100} has 4 free GPUs (largest free on one node: 2; 8 free in total)"
    assert inv.max_replicas(PodShape(gpus=4, gpu_product=H100)) == (0, p.reason)
    assert inv.max_replicas(PodShape(gpus=2, gpu_product=H100))[0] == 4


def test_can_place_unknown_product_names_the_ones_present() -> None:
    inv = inventory(node("h0"), node("a0", product=A100))
    p = inv.can_place(PodShape(gpus=1, gpu_product="NVIDIA-B200"))
    assert not p.placeable
    assert p.reason == (
        f"no schedulable node matches nvidia.com/gpu.product=NVIDIA-B200 (GPU products here: {A100}, {H100})"
    )


def test_can_place_every_matching_node_unhealthy() -> None:
    inv = inventory(node("h0", ready=False), node("h1", unschedulable=True), node("a0", product=A100))
    p = inv.can_place(PodShape(gpus=1, gpu_product=H100))
    assert not p.placeable
    assert p.reason == (
        f"no schedulable node matches nvidia.com/gpu.product={H100}: all 2 matching nodes are "
        "NotReady, cordoned or have unhealthy GPUs"
    )


def test_can_place_honours_taints_and_the_implicit_gpu_toleration() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    inv = inventory(node("h0", taints=[gpu_taint]))
    assert inv.can_place(PodShape(gpus=1)).placeable, "GPU pods get the nvidia.com/gpu toleration"
    cpu_only = inv.can_place(PodShape(cpu_millis=100))
    assert not cpu_only.placeable
    assert cpu_only.reason == (
        "every schedulable node has a taint the pod does not tolerate (nvidia.com/gpu=present:NoSchedule)"
    )
    dedicated = inventory(node("h0", taints=[{"key": "dedicated", "value": "ml", "effect": "NoExecute"}]))
    assert not dedicated.can_place(PodShape(gpus=1)).placeable
    ok = PodShape(gpus=1, tolerations=(Toleration("dedicated", "Equal", "ml", "NoExecute"),))
    assert dedicated.can_place(ok).placeable
    assert dedicated.can_place(PodShape(gpus=1, tolerations=(Toleration(operator="Exists"),))).placeable


def test_can_place_honours_node_selectors() -> None:
    inv = inventory(node("h0", labels={"zone": "a"}), node("h1", labels={"zone": "b"}), pods=[pod("x", "h1", gpus=8)])
    assert inv.can_place(PodShape(gpus=1, node_selector=(("zone", "a"),))).nodes == 1
    full = inv.can_place(PodShape(gpus=1, node_selector=(("zone", "b"),)))
    assert not full.placeable and "largest free on one node: 0" in full.reason
    none = inv.can_place(PodShape(gpus=1, gpu_product=H100, node_selector=(("zone", "c"),)))
    assert none.reason.startswith(f"no schedulable node matches nvidia.com/gpu.product={H100}, zone=c")


def test_can_place_names_cpu_memory_and_pod_slot_shortfalls() -> None:
    inv = inventory(node("h0", cpu="8", memory="32Gi"), pods=[pod("x", "h0", cpu="6", memory="30Gi")])
    p = inv.can_place(PodShape(gpus=2, cpu_millis=4000, memory_bytes=4 * GiB, gpu_product=H100))
    assert not p.placeable
    assert p.reason == (
        f"no node of {H100} with 2 free GPUs also has 4 CPU (at most 2 free on one node) "
        "and 4Gi memory (at most 2Gi free on one node)"
    )
    slots = inventory(node("h0", pods=1), pods=[pod("x", "h0")])
    s = slots.can_place(PodShape(gpus=1))
    assert not s.placeable and "a free pod slot" in s.reason


def test_empty_cluster() -> None:
    assert Inventory().can_place(PodShape()).reason == "the cluster has no nodes"
    assert Inventory().snapshot(0, 0) == Snapshot(0, (), 0)


def test_max_replicas_fills_each_node_to_its_scarcest_resource() -> None:
    inv = inventory(
        node("h0", cpu="10"),  # 8 GPUs, but CPU for 5 pods of 2 CPU
        node("h1", pods=3),  # pod slots for 3
        node("h2", gpus=4),  # GPUs for 4
        node("a0", product=A100),
    )
    n, reason = inv.max_replicas(PodShape(gpus=1, cpu_millis=2000, gpu_product=H100))
    assert n == 5 + 3 + 4
    assert reason == f"12 pods of 1 GPU, 2 CPU fit on 3 nodes of {H100}"
    one, text = inventory(node("h0", gpus=1)).max_replicas(PodShape(gpus=1))
    assert (one, text) == (1, "1 pod of 1 GPU fits on 1 GPU node")
    # Requests nothing: bounded by pod slots only.
    assert inventory(node("c", gpus=0, product=None, pods=7)).max_replicas(PodShape())[0] == 7


# ---- properties

_products = st.sampled_from([H100, A100, None])


@st.composite
def _cluster(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = []
    for i in range(draw(st.integers(0, 6))):
        nodes.append(
            node(
                f"n{i}",
                gpus=draw(st.integers(0, 8)),
                product=draw(_products),
                cpu=str(draw(st.integers(1, 16))),
                memory=f"{draw(st.integers(1, 64))}Gi",
                pods=draw(st.integers(1, 6)),
                ready=draw(st.booleans()),
                unschedulable=draw(st.integers(0, 5)) == 0,
                taints=draw(
                    st.sampled_from(
                        [[], [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}], [{"key": "x", "effect": "NoExecute"}]]
                    )
                ),
            )
        )
    pods = []
    for j in range(draw(st.integers(0, 12))):
        target = draw(st.sampled_from([*(n["metadata"]["name"] for n in nodes), None])) if nodes else None
        pods.append(
            pod(
                f"p{j}",
                target,
                gpus=draw(st.integers(0, 4)),
                cpu=f"{draw(st.integers(0, 4000))}m",
                memory=f"{draw(st.integers(0, 8))}Gi",
                phase=draw(st.sampled_from(["Running", "Pending", "Succeeded"])),
            )
        )
    return nodes, pods


_shapes = st.builds(
    PodShape,
    gpus=st.integers(0, 8),
    cpu_millis=st.integers(0, 8000),
    memory_bytes=st.integers(0, 16 * GiB),
    gpu_product=_products,
    tolerations=st.sampled_from([(), (Toleration("x", "Exists"),)]),
)


@settings(max_examples=80, deadline=None)
@given(_cluster(), _shapes)
def test_properties_of_snapshot_and_placement(cluster: tuple[list[dict[str, Any]], list[Any]], shape: PodShape) -> None:
    nodes, pods = cluster
    inv = inventory(*nodes, pods=pods)
    snap = inv.snapshot(3, 1.0)
    for p in snap.products:
        assert sum(b.nodes for b in p.histogram) == p.nodes
        assert sum(b.free_gpus * b.nodes for b in p.histogram) == p.free
        assert [b.free_gpus for b in p.histogram] == sorted({b.free_gpus for b in p.histogram}, reverse=True)
        assert p.free >= p.allocatable - p.in_use and 0 <= p.free <= p.allocatable <= p.total
        assert p.largest_shape <= max((b.free_gpus for b in p.histogram), default=0)
        if p.largest_shape and p.product:
            fit = inv.can_place(PodShape(gpus=p.largest_shape, gpu_product=p.product))
            assert fit.placeable, fit.reason
            assert not inv.can_place(PodShape(gpus=p.largest_shape + 1, gpu_product=p.product)).placeable
    assert sum(p.nodes + p.unhealthy_nodes for p in snap.products) == len(nodes)

    placement = inv.can_place(shape)
    replicas, reason = inv.max_replicas(shape)
    assert (replicas >= 1) == placement.placeable
    assert replicas >= placement.nodes
    assert reason and placement.reason
    if not placement.placeable:
        assert reason == placement.reason

    # Feeding the same objects in another order gives the same answers (incremental == batch).
    again = inventory(*reversed(nodes), pods=list(reversed(pods)))
    assert again.snapshot(3, 1.0) == snap
    assert again.can_place(shape) == placement


@settings(max_examples=40, deadline=None)
@given(_cluster(), st.data())
def test_removing_every_pod_restores_the_empty_figures(
    cluster: tuple[list[Any], list[Any]], data: st.DataObject
) -> None:
    nodes, pods = cluster
    inv = inventory(*nodes, pods=pods)
    for p in data.draw(st.permutations(pods)):
        inv.delete_pod(p["metadata"]["namespace"], p["metadata"]["name"])
    assert inv.snapshot(1, 0) == inventory(*nodes).snapshot(1, 0)
