"""The local topology model: defaults, validation, node CIDRs and port layout."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.errors import GpufedError
from gpufed.localenv.topology import (
    DEFAULT_POD_CIDR,
    DEFAULT_SERVICE_CIDR,
    GPU_MEMORY_LABEL,
    PORTS_PER_CLUSTER,
    Topology,
    TopologyError,
    default_topology,
    load_topology,
)


def test_default_topology_matches_the_issue() -> None:
    topo = default_topology()
    assert [c.name for c in topo.clusters] == ["consumer", "gpu-a", "gpu-b"]
    consumer, gpu_a, gpu_b = topo.clusters
    assert consumer.node_count() == 2 and consumer.gpu_total() == 0
    assert [(p.count, p.gpus, p.gpu_product) for p in gpu_a.node_pools] == [(4, 8, "NVIDIA-H100-80GB-HBM3")]
    assert gpu_a.node_pools[0].node_labels()[GPU_MEMORY_LABEL] == "81559"
    assert [(p.count, p.gpus) for p in gpu_b.node_pools] == [(2, 4), (4, 1)]
    assert "A100-SXM4-40GB" in (gpu_b.node_pools[0].gpu_product or "")
    assert "L4" in (gpu_b.node_pools[1].gpu_product or "")
    # Overlapping CIDRs on purpose: the fabric's hard case.
    assert {c.pod_cidr for c in topo.clusters} == {DEFAULT_POD_CIDR}
    assert {c.service_cidr for c in topo.clusters} == {DEFAULT_SERVICE_CIDR}


def test_gpu_capacity_and_labels() -> None:
    pool = default_topology().cluster("gpu-a").node_pools[0]
    assert pool.capacity()[GPU_RESOURCE] == "8"
    assert pool.node_labels()[GPU_PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
    cpu_pool = default_topology().cluster("consumer").node_pools[0]
    assert GPU_RESOURCE not in cpu_pool.capacity()
    assert GPU_PRODUCT_LABEL not in cpu_pool.node_labels()


def test_nodes_get_distinct_pod_cidrs_inside_the_cluster_cidr() -> None:
    spec = default_topology().cluster("gpu-b")
    nodes = spec.nodes()
    assert [n.name for n in nodes][:3] == ["gpu-b-a100-0", "gpu-b-a100-1", "gpu-b-l4-0"]
    nets = [ipaddress.IPv4Network(n.pod_cidr) for n in nodes]
    assert len(set(nets)) == len(nets) == 6
    assert all(n.subnet_of(ipaddress.IPv4Network(spec.pod_cidr)) for n in nets)


def test_ports_do_not_collide_across_clusters() -> None:
    topo = default_topology(base_port=20000)
    seen: set[int] = set()
    for c in topo.clusters:
        ports = list(topo.ports(c.name).all().values())
        assert not seen & set(ports)
        seen |= set(ports)
    assert topo.ports("consumer").apiserver == 20000
    assert topo.ports("gpu-a").apiserver == 20025


def test_each_cluster_keeps_its_ports_inside_its_block() -> None:
    topo = default_topology(base_port=20000)
    for c in topo.clusters:
        ports = topo.ports(c.name)
        first_kubelet, last_kubelet = ports.kubelet_ports
        fixed = list(ports.all().values())
        assert len(set(fixed)) == len(fixed), "no two components share a port"
        assert all(ports.base <= p < first_kubelet for p in fixed), "below the virtual kubelets' range"
        assert last_kubelet == ports.base + PORTS_PER_CLUSTER - 1
    assert topo.ports("gpu-a").metrics_server == 20032
    assert topo.ports("gpu-a").all()["metrics-server"] == 20032
    assert topo.ports("gpu-a").estimator == 20033
    assert topo.ports("gpu-a").all()["gpufed estimator"] == 20033


def test_kueue_takes_three_ports_after_gpufeds_and_the_virtual_kubelets_keep_the_rest() -> None:
    ports = default_topology(base_port=20000).ports("consumer")
    assert (ports.kueue_webhook, ports.kueue_metrics, ports.kueue_health) == (20009, 20010, 20011)
    assert {"Kueue webhook", "Kueue metrics", "Kueue health"} <= set(ports.all())
    # JobSet's webhook and probes next, then 11 kubelet ports: three virtual kubelets (providers) at
    # three each (one per pool node it may serve)
    assert (ports.jobset_webhook, ports.jobset_health) == (20012, 20013)
    assert {"JobSet webhook", "JobSet health"} <= set(ports.all())
    assert ports.kubelet_ports == (20014, 20024)
    assert PORTS_PER_CLUSTER == 25


def test_kueue_runs_on_the_consumer_of_the_default_topology_only() -> None:
    topo = default_topology()
    assert {c.name: c.kueue for c in topo.clusters} == {"consumer": True, "gpu-a": False, "gpu-b": False}
    assert {c.name: c.jobset for c in topo.clusters} == {"consumer": True, "gpu-a": False, "gpu-b": False}
    # off unless asked for; a topology file turns it on per cluster
    solo = Topology.model_validate({"clusters": [{"name": "c", "nodePools": [{"name": "p", "count": 1}]}]})
    assert solo.cluster("c").kueue is False
    on = Topology.model_validate({"clusters": [{"name": "c", "kueue": True, "nodePools": [{"name": "p", "count": 1}]}]})
    assert on.cluster("c").kueue is True
    # it is part of the recorded topology, so turning it on or off is a topology change
    assert topo.model_dump(mode="json", by_alias=True)["clusters"][0]["kueue"] is True


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"name": "Bad_Name"}, "DNS label"),
        ({"podCIDR": "10.96.0.0/12"}, "overlaps"),
        ({"podCIDR": "not-a-cidr"}, "not a CIDR"),
        ({"podCIDR": "10.244.0.1/16"}, "not a CIDR"),
        ({"podCIDR": "10.244.0.0/24"}, "too small"),
        ({"nodePools": [{"name": "x", "count": 1, "gpus": 2}]}, "needs gpuProduct"),
        ({"nodePools": [{"name": "x", "count": 1, "gpuProduct": "NVIDIA-L4"}]}, "gpus is 0"),
        ({"nodePools": [{"name": "x", "count": 0}]}, "greater than or equal to 1"),
        ({"nodePools": [{"name": "x", "count": 1}, {"name": "x", "count": 1}]}, "unique"),
        ({"nodePools": [{"name": "x", "count": 1, "colour": "red"}]}, "Extra inputs"),
        ({"nodePools": [{"name": "x", "count": 1, "draNodes": 1}]}, "draNodes > 0 needs gpus > 0"),
        (
            {"nodePools": [{"name": "x", "count": 2, "gpus": 1, "gpuProduct": "NVIDIA-L4", "draNodes": 3}]},
            "draNodes 3 exceeds count 2",
        ),
        (
            {"nodePools": [{"name": "x", "count": 2, "gpus": 1, "gpuProduct": "NVIDIA-L4", "draNodes": -1}]},
            "greater than or equal to 0",
        ),
    ],
)
def test_invalid_clusters_are_refused_with_a_reason(patch: dict[str, object], message: str) -> None:
    cluster: dict[str, object] = {"name": "c", "nodePools": [{"name": "p", "count": 2}]}
    cluster.update(patch)
    with pytest.raises(ValueError, match=message):
        Topology.model_validate({"clusters": [cluster]})


def test_duplicate_cluster_names_are_refused() -> None:
    c = {"name": "c", "nodePools": [{"name": "p", "count": 1}]}
    with pytest.raises(ValueError, match="unique"):
        Topology.model_validate({"clusters": [c, c]})


def test_unknown_cluster_lookup_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="gpu-a"):
        default_topology().cluster("nope")


def test_load_topology_from_yaml(tmp_path: Path) -> None:
    f = tmp_path / "topo.yaml"
    f.write_text(
        "basePort: 21000\njobSeconds: 1\nclusters:\n- name: one\n  podCIDR: 10.10.0.0/16\n"
        "  nodePools:\n  - {name: big, count: 1, gpus: 2, gpuProduct: NVIDIA-L4}\n"
    )
    topo = load_topology(f)
    assert topo.base_port == 21000 and topo.cluster("one").gpu_total() == 2


def test_load_topology_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: []\n")
    with pytest.raises(TopologyError, match=r"invalid topology .*bad\.yaml") as err:
        load_topology(bad)
    assert isinstance(err.value, GpufedError) and err.value.exit_code == 1
    with pytest.raises(TopologyError, match="cannot read topology"):
        load_topology(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("clusters: [\n")
    with pytest.raises(TopologyError, match=r"cannot read topology .*broken\.yaml"):
        load_topology(tmp_path / "broken.yaml")


def test_an_out_of_range_default_topology_is_a_topology_error() -> None:
    with pytest.raises(TopologyError, match="basePort"):
        default_topology(base_port=65000)


def test_the_default_topology_has_one_dra_node_on_each_provider() -> None:
    topo = default_topology()
    dra = {c.name: [n.name for n in c.nodes() if n.dra] for c in topo.clusters}
    assert dra == {"consumer": [], "gpu-a": ["gpu-a-h100-3"], "gpu-b": ["gpu-b-l4-3"]}
    # names and counts are unchanged; every GPU is still counted, the DRA ones apart
    assert [n.name for n in topo.cluster("gpu-a").nodes()] == [f"gpu-a-h100-{i}" for i in range(4)]
    assert topo.cluster("gpu-a").gpu_total() == 32 and topo.cluster("gpu-a").dra_gpu_total() == 8
    assert topo.cluster("gpu-b").gpu_total() == 12 and topo.cluster("gpu-b").dra_gpu_total() == 1


def test_dra_nodes_are_the_last_of_their_pool_and_do_not_advertise_gpus() -> None:
    topo = Topology.model_validate(
        {
            "clusters": [
                {
                    "name": "c",
                    "nodePools": [
                        {"name": "p", "count": 3, "gpus": 4, "gpuProduct": "NVIDIA-L4", "draNodes": 2},
                        {"name": "q", "count": 1, "gpus": 2, "gpuProduct": "NVIDIA-L4"},
                    ],
                }
            ]
        }
    )
    nodes = topo.cluster("c").nodes()
    assert [(n.name, n.dra) for n in nodes] == [("c-p-0", False), ("c-p-1", True), ("c-p-2", True), ("c-q-0", False)]
    plain, dra_node = nodes[0], nodes[1]
    # a DRA node keeps every label and CPU/memory, but not nvidia.com/gpu (that would count its GPUs twice)
    assert dra_node.pool.node_labels() == plain.pool.node_labels()
    assert dra_node.pool.node_labels()[GPU_PRODUCT_LABEL] == "NVIDIA-L4"
    assert GPU_RESOURCE not in dra_node.pool.capacity()
    assert {k: v for k, v in plain.pool.capacity().items() if k != GPU_RESOURCE} == dra_node.pool.capacity()
    assert plain.pool.capacity()[GPU_RESOURCE] == "4" and nodes[3].pool.capacity()[GPU_RESOURCE] == "2"
    # the pool itself is untouched: the recorded topology says draNodes, not a changed capacity
    assert topo.cluster("c").node_pools[0].capacity()[GPU_RESOURCE] == "4"
    assert topo.model_dump(mode="json", by_alias=True)["clusters"][0]["nodePools"][0]["draNodes"] == 2
