"""forge.pools: which pool nodes a provider gets, the in-flight bin packing, and what each pool
node advertises (capacity capping at the largest placeable shape, grant headroom, static mode)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gpufed.apis.quantity import parse
from gpufed.apis.wire import POD_GPUS_LABEL, POOL_ANNOTATION, POOL_PRODUCT_LABEL
from gpufed.ops.pool import report
from gpupool.capacity import Bucket, ProductCapacity, Snapshot, best_fit, free_after
from gpupool.gang import Offer
from vkprovider.forge.pools import (
    InFlight,
    Pool,
    advertise,
    figures_of,
    filter_node_labels,
    label_allowed,
    offer_of,
    parse_figures,
    plan_pools,
    slug,
)

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
L4 = "NVIDIA-L4"
GPU = "nvidia.com/gpu"


def dec(v: int | str) -> Decimal:
    return Decimal(v)


def cap(
    product: str, free_per_node: list[int], *, per_node: int = 8, memory_mib: int | None = 81559
) -> ProductCapacity:
    buckets: dict[int, int] = {}
    for f in free_per_node:
        buckets[f] = buckets.get(f, 0) + 1
    n = len(free_per_node)
    return ProductCapacity(
        product=product,
        nodes=n,
        unhealthy_nodes=0,
        total=per_node * n,
        allocatable=per_node * n,
        in_use=per_node * n - sum(free_per_node),
        free=sum(free_per_node),
        largest_shape=max(free_per_node, default=0),
        histogram=tuple(Bucket(f, c) for f, c in sorted(buckets.items(), reverse=True)),
        free_cpu_millis=96_000 * n,
        free_memory_bytes=(1024 << 30) * n,
        free_pods=110 * n,
        labels={"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(per_node)},
        gpu_memory_mib=memory_mib,
        source="labels",
        largest_node=per_node if n else 0,
    )


def snap(*products: ProductCapacity) -> Snapshot:
    return Snapshot(revision=1, products=tuple(products), observed_at=0.0)


GRANT = {"cpu": dec(64), "memory": dec(256 << 30), "pods": dec(110), GPU: dec(32)}


# ---- plan


def test_one_pool_per_product_when_several() -> None:
    pools = plan_pools("gpufed-b", [L4, A100], None, per_product=True)
    assert pools == [
        Pool("gpufed-b-nvidia-a100-sxm4-40gb", A100),
        Pool("gpufed-b-nvidia-l4", L4),
    ]


def test_single_product_keeps_the_provider_node_and_labels_it() -> None:
    assert plan_pools("gpufed-a", [H100], None, per_product=True) == [Pool("gpufed-a", H100)]


def test_product_grant_is_one_pool_of_that_product() -> None:
    assert plan_pools("gpufed-b", [L4, A100], A100, per_product=True) == [Pool("gpufed-b", A100)]


def test_pools_off_or_unknown_products_give_one_provider_node() -> None:
    assert plan_pools("gpufed-b", [L4, A100], None, per_product=False) == [Pool("gpufed-b", None)]
    assert plan_pools("gpufed-b", [], None, per_product=True) == [Pool("gpufed-b", None)]


def test_slug_is_a_short_stable_dns_label() -> None:
    long = "NVIDIA Some Very Long Product Name With Many Words And Numbers 123456789"
    s = slug(long)
    assert len(s) <= 40 and s == slug(long) and s != slug(long + "x")
    assert all(c.isalnum() or c == "-" for c in s) and not s.startswith("-") and not s.endswith("-")


# ---- in flight


def test_best_fit_uses_the_fullest_node_that_takes_each_pod() -> None:
    free, unplaced = best_fit([Bucket(8, 1), Bucket(4, 1), Bucket(2, 2)], [2, 4])
    assert sorted(free, reverse=True) == [8, 2, 0, 0]  # the 4 fills the 4-node, the 2 one 2-node
    assert unplaced == []
    assert free_after([Bucket(8, 1), Bucket(4, 1)], [4, 8]) == ()
    assert free_after([Bucket(8, 1), Bucket(4, 2)], [2]) == (Bucket(8, 1), Bucket(4, 1), Bucket(2, 1))
    assert best_fit([Bucket(2, 2)], [4])[1] == [4]


@given(st.lists(st.integers(0, 8), max_size=8), st.lists(st.integers(1, 8), max_size=8))
def test_best_fit_conserves_gpus(nodes: list[int], pods: list[int]) -> None:
    hist = [Bucket(f, 1) for f in nodes]
    free, unplaced = best_fit(hist, pods)
    assert all(f >= 0 for f in free)
    assert sum(free) == sum(nodes) - (sum(pods) - sum(unplaced))
    after = free_after(hist, pods)
    nodes_left = sorted((b.free_gpus for b in after for _ in range(b.nodes)), reverse=True)
    assert nodes_left == [f for f in sorted(free, reverse=True) if f]
    assert all(a.free_gpus > b.free_gpus for a, b in itertools.pairwise(after))


# ---- advertise


def test_allocatable_is_held_plus_the_largest_placeable_shape() -> None:
    s = snap(cap(H100, [2, 2, 2, 2]))  # fragmented: 8 free, at most 2 per node
    ad = advertise("a", Pool("gpufed-a", H100), s, granted=GRANT, used_all={GPU: dec(0)}, used_here={GPU: dec(0)})
    assert ad.allocatable[GPU] == "2"
    assert ad.figures.free == 8 and ad.figures.largest_placeable == 2 and ad.figures.total == 32
    assert ad.labels["nvidia.com/gpu.product"] == H100
    assert ad.labels["nvidia.com/gpu.memory"] == "81559"
    assert ad.labels[POOL_PRODUCT_LABEL] == "nvidia-h100-80gb-hbm3"
    assert json.loads(ad.annotations[POOL_ANNOTATION])["largest_placeable"] == 2


def test_pods_already_bound_stay_counted_and_in_flight_ones_use_the_histogram() -> None:
    s = snap(cap(H100, [8, 8, 8, 8]))
    held = {GPU: dec(12), "cpu": dec(4)}
    ad = advertise(
        "a",
        Pool("gpufed-a", H100),
        s,
        granted=GRANT,
        used_all=held,
        used_here=held,
        in_flight=InFlight.of(({GPU: dec(8)}, {GPU: dec(4)})),  # accepted, not placed yet: not in the snapshot's in_use
    )
    # the histogram after them: 8, 8, 4 (or 0) -> one more pod of 8 fits; the grant leaves 20
    assert ad.allocatable[GPU] == str(12 + 8)
    assert ad.figures.in_flight == 2


def test_gpus_reserved_for_a_waiting_group_are_offered_to_no_other_pod_but_stay_in_the_figures() -> None:
    s = snap(cap(H100, [8, 0, 0, 0]))
    free = advertise("a", Pool("gpufed-a", H100), s, granted=GRANT, used_all={}, used_here={})
    assert free.allocatable[GPU] == "8"
    # a 2 x 8 group waits for a second node: the free node is held back for it
    held = advertise("a", Pool("gpufed-a", H100), s, granted=GRANT, used_all={}, used_here={}, reserved=(8, 8))
    assert held.allocatable[GPU] == "0"
    assert held.figures.free_nodes == [[8, 1]] and held.figures.reserved == 16  # the gang controller's view
    # what the group does not need is still offered: 2 x 2 leaves 4 of 8
    part = advertise("a", Pool("gpufed-a", H100), s, granted=GRANT, used_all={}, used_here={}, reserved=(2, 2))
    assert part.allocatable[GPU] == "4"
    # static figures: the reservation comes off the grant's headroom
    static = advertise("a", Pool("gpufed-a", None), None, granted=GRANT, used_all={}, used_here={}, reserved=(8, 8))
    assert static.allocatable[GPU] == "16"


def test_grant_headroom_caps_every_pool_of_the_provider() -> None:
    s = snap(cap(A100, [4, 4], per_node=4), cap(L4, [1, 1, 1, 1], per_node=1))
    grant = {**GRANT, GPU: dec(6)}
    used_all = {GPU: dec(5)}  # mostly on the other pool
    ad = advertise("b", Pool("gpufed-b-a100", A100), s, granted=grant, used_all=used_all, used_here={GPU: dec(1)})
    assert ad.allocatable[GPU] == "2"  # 1 held + 1 left of the grant, though 4 would fit
    assert ad.figures.granted == 6


def test_a_grant_lowered_below_usage_leaves_the_pool_less_than_nothing_free() -> None:
    grant = {**GRANT, "cpu": dec("0.1")}
    ad = advertise(
        "a", Pool("gpufed-a", None), None, granted=grant, used_all={"cpu": dec("1.35")}, used_here={"cpu": dec("1.35")}
    )
    # what runs stays, but the scheduler sees 1.25 CPU too many: a 10m pod ending there frees nothing
    assert ad.allocatable["cpu"] == "100m"


@given(
    granted=st.integers(0, 4000),
    elsewhere=st.integers(0, 4000),
    here=st.lists(st.integers(1, 500), min_size=1, max_size=8),
    ending=st.integers(0, 7),
)
def test_a_pod_ending_never_shows_more_room_than_the_next_advertisement(
    granted: int, elsewhere: int, here: list[int], ending: int
) -> None:
    """Between a pod ending and the next node status, the scheduler counts the old allocatable against
    the pods left: that room is never more than the room the next advertisement gives."""

    def allocatable(used_here: int) -> Decimal:
        ad = advertise(
            "a",
            Pool("gpufed-a-h100", H100),
            None,
            granted={"cpu": Decimal(granted) / 1000},
            used_all={"cpu": Decimal(used_here + elsewhere) / 1000},
            used_here={"cpu": Decimal(used_here) / 1000},
        )
        return parse(ad.allocatable["cpu"])

    held = sum(here)
    left = held - here[ending % len(here)]
    stale_room = allocatable(held) - Decimal(left) / 1000
    fresh_room = allocatable(left) - Decimal(left) / 1000
    assert stale_room <= max(Decimal(0), fresh_room)


def test_product_gone_from_the_provider_takes_nothing_new() -> None:
    ad = advertise("b", Pool("gpufed-b-l4", L4), snap(cap(A100, [4])), granted=GRANT, used_all={}, used_here={})
    assert ad.allocatable[GPU] == "0" and ad.allocatable["cpu"] == "0"


def test_without_a_snapshot_the_grant_is_advertised_and_the_reason_given() -> None:
    ad = advertise(
        "a",
        Pool("gpufed-a", None),
        None,
        granted=GRANT,
        used_all={GPU: dec(4)},
        used_here={GPU: dec(4)},
        static_reason="the provider runs no capacity estimator",
    )
    assert ad.allocatable[GPU] == "32"
    assert ad.figures.capacity_source == "Static: the provider runs no capacity estimator"
    assert ad.figures.total is None and ad.figures.free is None


def test_whole_provider_pool_merges_products() -> None:
    s = snap(cap(A100, [4, 3], per_node=4), cap(L4, [1, 0, 1, 1], per_node=1))
    ad = advertise("b", Pool("gpufed-b", None), s, granted=GRANT, used_all={}, used_here={})
    assert ad.allocatable[GPU] == "4"
    assert ad.figures.free == 10 and ad.figures.total == 12
    assert "nvidia.com/gpu.product" not in ad.labels  # products differ: no product label


def test_cpu_only_grant_advertises_no_gpu_resource() -> None:
    grant = {"cpu": dec(8), "memory": dec(32 << 30), "pods": dec(50)}
    ad = advertise("c", Pool("gpufed-c", None), None, granted=grant, used_all={}, used_here={})
    assert GPU not in ad.allocatable and ad.allocatable["cpu"] == "8"


def test_figures_round_trip_and_bad_annotations_are_ignored() -> None:
    ad = advertise("a", Pool("gpufed-a", H100), snap(cap(H100, [8])), granted=GRANT, used_all={}, used_here={})
    assert parse_figures(ad.annotations[POOL_ANNOTATION]) == ad.figures
    assert parse_figures("{not json") is None
    assert parse_figures('{"unexpected": 1}') is None


# ---- gpufed pool


def test_pool_report_rows_and_pending_demand() -> None:
    s = snap(cap(H100, [2, 2, 8]))
    ad = advertise("a", Pool("gpufed-a", H100), s, granted=GRANT, used_all={}, used_here={}, reserved=(4,))
    node = {
        "metadata": {
            "name": "gpufed-a",
            "labels": {"gpufed.io/remote-cluster-id": "a", **ad.labels},
            "annotations": ad.annotations,
        },
        "status": {"allocatable": ad.allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }

    def waiting(name: str, gpus: int, node_name: str = "") -> dict[str, object]:
        return {
            "metadata": {"namespace": "team", "name": name},
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus)}}}],
            },
            "status": {"phase": "Pending"},
        }

    data = report([node], [waiting("big", 16), waiting("small", 2), waiting("cpu", 0), waiting("bound", 4, "n")])
    (row,) = data["pools"]
    assert (row["provider"], row["product"], row["ready"]) == ("a", H100, True)
    # a 4-GPU pod of a waiting group holds 4 of the 8-GPU node back: 4 left there for others
    assert (row["total"], row["free"], row["reserved"], row["largestPlaceable"], row["capacity"]) == (
        24,
        12,
        4,
        4,
        "Live",
    )
    assert data["pending"] == {"pods": 2, "gpus": 18, "largest": 16, "podNames": ["team/big", "team/small"]}
    assert data["claims"] == {}


def test_pool_report_lists_the_claims_bound_on_each_provider() -> None:
    def volume(name: str, provider: str, size: str, claim: str, remote: str = "") -> dict[str, object]:
        annotations = {"gpufed.io/remote-phase": remote} if remote else {}
        return {
            "metadata": {"name": name, "labels": {"gpufed.io/remote-cluster-id": provider}, "annotations": annotations},
            "spec": {"capacity": {"storage": size}, "claimRef": {"namespace": "team", "name": claim}},
            "status": {"phase": "Bound"},
        }

    vols = [
        volume("gpufed-1", "a", "10Gi", "data", "Bound"),
        volume("gpufed-2", "a", "512Mi", "ckpt"),
        volume("gpufed-3", "b", "1Ti", "set", "Pending"),
        {"metadata": {"name": "local-pv"}, "spec": {"capacity": {"storage": "5Gi"}}},
    ]
    claims = report([], [], vols)["claims"]
    assert sorted(claims) == ["a", "b"]
    assert (claims["a"]["claims"], claims["a"]["storage"]) == (2, "10752Mi")
    # sorted by claim: team/ckpt, then team/data
    assert claims["a"]["items"][1] == {"claim": "team/data", "size": "10Gi", "phase": "Bound", "remotePhase": "Bound"}
    assert claims["a"]["items"][0]["remotePhase"] == ""
    assert (claims["b"]["claims"], claims["b"]["storage"]) == (1, "1Ti")


# ---- provider-supplied labels


def test_only_gpu_labels_and_the_allow_list_reach_a_virtual_node() -> None:
    supplied = {
        "nvidia.com/gpu.product": H100,
        "nvidia.com/mig.capable": "true",
        "topology.kubernetes.io/region": "eu",
        "topology.kubernetes.io/zone": "eu-1a",
        "kubernetes.io/hostname": "gpu-node-1",
        "node-role.kubernetes.io/control-plane": "",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "gpufed.io/remote-cluster-id": "gpu-b",
        "type": "virtual-kubelet",
        "example.com/rack": "r1",
        "nvidia.com/gpu.family": "bad value!",
    }
    got = filter_node_labels(supplied)
    assert got.kept == {"nvidia.com/gpu.product": H100, "nvidia.com/mig.capable": "true"}
    assert set(got.dropped) == set(supplied) - set(got.kept)
    allowed = filter_node_labels(supplied, ["example.com/rack", "topology.kubernetes.io/*", "kubernetes.io/"])
    assert allowed.kept == {**got.kept, "example.com/rack": "r1"}, "reserved domains never pass"


def test_label_allow_list_entries() -> None:
    assert label_allowed("example.com/rack", ["example.com/"]) and label_allowed("example.com/rack", ["example.com/*"])
    assert not label_allowed("example.com/rack", ["example.com/r"]) and not label_allowed("example.com/rack", ["*"])
    assert not label_allowed("sub.k8s.io/x", ["sub.k8s.io/"])


def test_advertise_keeps_only_valid_gpu_labels_of_the_snapshot() -> None:
    forged = dataclasses.replace(
        cap(H100, [8]), labels={"nvidia.com/gpu.count": "8", "topology.kubernetes.io/region": "eu"}
    )
    ad = advertise("gpu-a", Pool("n", H100), snap(forged), granted={}, used_all={}, used_here={})
    assert "topology.kubernetes.io/region" not in ad.labels and ad.labels["nvidia.com/gpu.count"] == "8"
    bad = advertise("gpu-a", Pool("n", "evil product/../x"), None, granted={}, used_all={}, used_here={})
    assert "nvidia.com/gpu.product" not in bad.labels


def test_a_pool_node_offers_what_its_figures_say() -> None:
    asked = {r: v * 2 for r, v in GRANT.items()}  # the provider's own load halved the grant
    pool, snapshot = Pool("gpufed-a", H100), snap(cap(H100, [8, 4, 4]))
    ad = advertise("a", pool, snapshot, granted=GRANT, requested=asked, used_all={}, used_here={})
    node = {"metadata": {"name": "gpufed-a", "annotations": ad.annotations}}
    figures = figures_of(node)
    assert figures == ad.figures
    offer = offer_of(figures)
    assert offer == Offer(
        "gpufed-a",
        "a",
        H100,
        ad.figures.headroom,
        (Bucket(8, 1), Bucket(4, 2)),
        total=24,
        granted=ad.figures.granted,
        requested=2 * ad.figures.granted,
    )
    assert figures_of({"metadata": {"name": "cpu-node"}}) is None
    # figures of the wrong shape (read back from an annotation, unchecked) offer nothing
    bad = json.loads(ad.annotations[POOL_ANNOTATION]) | {"free_nodes": [["x", 1]]}
    odd = figures_of({"metadata": {"name": "gpufed-a", "annotations": {POOL_ANNOTATION: json.dumps(bad)}}})
    assert odd is not None and offer_of(odd) is None


def test_a_pool_node_says_the_most_gpus_one_pod_can_get_there_at_most_the_grant() -> None:
    s = snap(cap(H100, [0, 0, 8]), cap(A100, [4, 4], per_node=4))
    h100 = advertise("a", Pool("gpufed-a-h100", H100), s, granted=GRANT, used_all={}, used_here={})
    a100 = advertise("a", Pool("gpufed-a-a100", A100), s, granted=GRANT, used_all={}, used_here={})
    assert h100.labels[POD_GPUS_LABEL] == "8" and a100.labels[POD_GPUS_LABEL] == "4"
    small = advertise("a", Pool("gpufed-a-h100", H100), s, granted={**GRANT, GPU: dec(2)}, used_all={}, used_here={})
    assert small.labels[POD_GPUS_LABEL] == "2"
    merged = advertise("a", Pool("gpufed-a", None), s, granted=GRANT, used_all={}, used_here={})
    assert merged.labels[POD_GPUS_LABEL] == "8"
    # unknown without a snapshot, and none without a GPU grant
    assert (
        POD_GPUS_LABEL
        not in advertise("a", Pool("gpufed-a", H100), None, granted=GRANT, used_all={}, used_here={}).labels
    )
    cpu_only = {**GRANT, GPU: dec(0)}
    assert (
        POD_GPUS_LABEL
        not in advertise("a", Pool("gpufed-a", H100), s, granted=cpu_only, used_all={}, used_here={}).labels
    )


def test_attack_a_provider_reporting_absurd_node_sizes_gets_at_most_its_grant() -> None:
    for largest_node, want in ((10**12, "32"), (-5, None), (0, None)):
        s = snap(dataclasses.replace(cap(H100, [8]), largest_node=largest_node))
        ad = advertise("a", Pool("gpufed-a", H100), s, granted=GRANT, used_all={}, used_here={})
        assert ad.labels.get(POD_GPUS_LABEL) == want, largest_node


def test_in_flight_of_sums_the_pods_and_lists_their_gpus_largest_first() -> None:
    flight = InFlight.of(({GPU: dec(2), "cpu": dec(1)}, {"cpu": dec("0.5")}, {GPU: dec(8)}))
    assert flight.pods == 3
    assert flight.requests == {GPU: dec(10), "cpu": dec("1.5")}
    assert flight.gpus == (8, 2)
    assert InFlight.of(()) == InFlight()
