"""DRA devices in the grant decision (peering.devices through the provider role's CapacityCache): a
GPU a DeviceClass maps to nvidia.com/gpu is node capacity; what claims hold of it is load, and a
consumer's claims are its usage."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from peering import grants
from peering.controllers.tenant_grants import CapacityCache
from peering.devices import EXTENDED_CLAIM_ANNOTATION

DRIVER = "gpu.nvidia.com"
GPU = "nvidia.com/gpu"


def dra_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def cache_with_devices() -> CapacityCache:
    cache = CapacityCache()
    cache.nodes["d0"] = grants.node_info(dra_node("d0"))
    cache.devices.set_class(
        {
            "metadata": {"name": DRIVER},
            "spec": {
                "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}],
                "extendedResourceName": GPU,
            },
        }
    )
    cache.devices.set_slice(
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "d0",
                "pool": {"name": "d0", "generation": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(8)],
            },
        }
    )
    return cache


def held(namespace: str, name: str, *devices: int, extended: bool = False) -> dict[str, Any]:
    annotations = {EXTENDED_CLAIM_ANNOTATION: "true"} if extended else {}
    results = [{"driver": DRIVER, "pool": "d0", "device": f"gpu-{i}"} for i in devices]
    return {
        "metadata": {"namespace": namespace, "name": name, "annotations": annotations},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_dra_gpus_are_capacity_and_held_devices_are_load() -> None:
    cache = cache_with_devices()
    (node,) = cache.capacity_nodes()
    assert node.allocatable[GPU] == 8
    assert grants.free_capacity(cache.capacity_nodes(), cache.loads(), None)[GPU] == 8
    cache.devices.set_claim(held("team-c1", "big", 0, 1))
    cache.devices.set_claim(held("other", "ext", 2, extended=True))  # its pod's request counts it
    assert grants.free_capacity(cache.capacity_nodes(), cache.loads(), None)[GPU] == 6


def test_a_consumers_claims_are_its_usage() -> None:
    cache = cache_with_devices()
    cache.ns_owner["team-c1"] = "c1"
    cache.devices.set_claim(held("team-c1", "big", 0, 1, 2))
    cache.devices.set_claim(held("else", "x", 3))
    assert cache.usage("c1") == {"team-c1": {GPU: Decimal(3)}}
