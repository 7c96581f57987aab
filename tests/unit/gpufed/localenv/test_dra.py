"""DRA device publishing for the local kwok GPU nodes: devices, the publisher's config, the DeviceClass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufed.localenv import components, dra
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import NodePool, default_topology


def _pool(**kw: Any) -> NodePool:
    return NodePool.model_validate({"name": "p", "count": 2, **kw})


def test_devices_of_an_h100_node() -> None:
    pool = default_topology().cluster("gpu-a").node_pools[0]
    devs = dra.devices("gpu-a-h100-3", pool)
    assert [d["name"] for d in devs] == [f"gpu-{i}" for i in range(8)]
    first = devs[0]
    assert first["attributes"] == {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA-H100-80GB-HBM3"},
        "uuid": {"string": dra.gpu_uuid("gpu-a-h100-3", 0)},
        "index": {"int": 0},
        "migCapable": {"bool": True},
        "architecture": {"string": "Hopper"},
    }
    assert first["capacity"] == {"memory": "81559Mi"}
    assert [d["attributes"]["index"]["int"] for d in devs] == list(range(8))


def test_uuids_are_deterministic_and_unique_per_node_and_index() -> None:
    u = dra.gpu_uuid("gpu-a-h100-3", 0)
    assert u == dra.gpu_uuid("gpu-a-h100-3", 0) and u.startswith("GPU-") and len(u) == 40
    others = {dra.gpu_uuid("gpu-a-h100-3", 1), dra.gpu_uuid("gpu-a-h100-2", 0), dra.gpu_uuid("gpu-b-l4-3", 0)}
    assert u not in others and len(others) == 3


@pytest.mark.parametrize(
    ("product", "arch", "mig"),
    [
        ("NVIDIA-H100-80GB-HBM3", "Hopper", True),
        ("NVIDIA-A100-SXM4-40GB", "Ampere", True),
        ("NVIDIA-L4", "Ada Lovelace", False),
        ("NVIDIA L4", "Ada Lovelace", False),
        ("NVIDIA-L40S", "unknown", False),
        ("Tesla-T4", "unknown", False),
    ],
)
def test_architecture_and_mig_from_the_product_name(product: str, arch: str, mig: bool) -> None:
    assert dra.architecture(product) == (arch, mig)
    dev = dra.devices("n", _pool(gpus=1, gpuProduct=product))[0]
    assert dev["attributes"]["architecture"] == {"string": arch}
    assert dev["attributes"]["migCapable"] == {"bool": mig}


def test_a_pool_without_memory_or_gpus() -> None:
    assert dra.devices("n", _pool(gpus=2, gpuProduct="NVIDIA-L4"))[1]["capacity"] == {}
    assert dra.devices("n", _pool()) == []


def test_publisher_config_names_the_driver_and_only_dra_nodes() -> None:
    topo = default_topology()
    cfg = dra.publisher_config(topo.cluster("gpu-b"))
    assert cfg["driver"] == dra.DRIVER == "gpu.nvidia.com"
    assert [n["name"] for n in cfg["nodes"]] == ["gpu-b-l4-3"]
    (dev,) = cfg["nodes"][0]["devices"]
    assert dev["attributes"]["productName"] == {"string": "NVIDIA-L4"}
    assert dev["capacity"] == {"memory": "23034Mi"}
    assert json.loads(json.dumps(cfg)) == cfg  # what the launcher writes for the applet
    assert dra.publisher_config(topo.cluster("consumer")) == {"driver": dra.DRIVER, "nodes": []}
    assert dra.dra_nodes(topo.cluster("gpu-a")) == ["gpu-a-h100-3"]


def test_device_class_selects_the_driver_and_maps_the_extended_resource() -> None:
    cls = dra.device_class()
    assert cls["apiVersion"] == "resource.k8s.io/v1" and cls["kind"] == "DeviceClass"
    assert cls["metadata"]["name"] == dra.DEVICE_CLASS == "gpu.nvidia.com"
    assert cls["spec"]["selectors"] == [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]
    assert cls["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def _slice(node: str, count: int, driver: str = dra.DRIVER) -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": node, "devices": [{"name": f"gpu-{i}"} for i in range(count)]}}


def test_slices_published_needs_every_device_of_every_dra_node() -> None:
    spec = default_topology().cluster("gpu-a")
    assert not dra.slices_published([], spec)
    assert not dra.slices_published([_slice("gpu-a-h100-3", 7)], spec)
    assert not dra.slices_published([_slice("gpu-a-h100-3", 8, driver="other.example.com")], spec)
    assert not dra.slices_published([_slice("gpu-a-h100-2", 8)], spec)
    assert dra.slices_published([_slice("gpu-a-h100-3", 5), _slice("gpu-a-h100-3", 3)], spec)
    assert dra.slices_published([], default_topology().cluster("consumer"))


def test_the_publisher_runs_where_there_are_dra_nodes_as_kwok(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology())
    assert [c.name for c in env.topology.clusters if components.has_dra(c)] == ["gpu-a", "gpu-b"]
    assert components.DRA_PUBLISHER in components.BINARIES
    spec = env.topology.cluster("gpu-a")
    cmd = components.command(env, spec, env.topology.ports("gpu-a"), components.DRA_PUBLISHER, audit=False)
    d = env.cluster_dir("gpu-a")
    assert cmd == [
        str(tmp_path / "bin" / "dra-publisher"),
        f"--kubeconfig={env.kubeconfig_path('gpu-a', 'kwok')}",
        f"--config={d / components.DRA_CONFIG_FILE}",
    ]
