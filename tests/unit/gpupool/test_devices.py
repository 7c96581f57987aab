"""DRA devices in the capacity model (gpupool.devices, and how gpupool.inventory counts them):
a GPU that a class maps to nvidia.com/gpu counts once, whether a pod's request or a claim holds it;
the device groups the estimator serves; what the estimator's wire carries."""

from __future__ import annotations

from typing import Any

from gpupool.capacity import Attribute
from gpupool.devices import groups
from gpupool.estimator import wire
from peering.devices import EXTENDED_CLAIM_ANNOTATION, DeviceInventory
from tests.unit.gpupool.cluster import H100, inventory, node, pod

DRIVER = "gpu.nvidia.com"


def gpu_class(name: str = DRIVER, *, extended: str | None = "nvidia.com/gpu", cel: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": cel or f"device.driver == '{DRIVER}'"}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"metadata": {"name": name}, "spec": spec}


def devices_slice(node_name: str, n: int, *, memory: str = "81559Mi", generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node_name}-{DRIVER}-{generation}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "productName": {"string": H100},
                        "index": {"int": i},
                        "uuid": {"string": f"GPU-{node_name}-{i}"},
                        "migCapable": {"bool": True},
                    },
                    "capacity": {"memory": {"value": memory}},
                }
                for i in range(n)
            ],
        },
    }


def claim(name: str, node_name: str, *devices: int, extended: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "team", "name": name}
    if extended:
        meta["annotations"] = {EXTENDED_CLAIM_ANNOTATION: "true"}
    results = [{"request": "gpu", "driver": DRIVER, "pool": node_name, "device": f"gpu-{i}"} for i in devices]
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": results}}}}


def test_a_dra_node_counts_its_mapped_devices_as_gpus() -> None:
    inv = inventory(node("h0"), node("d0", gpus=0))
    inv.devices.set_class(gpu_class())
    inv.devices.set_slice(devices_slice("d0", 8))
    snap = inv.snapshot(1, 0.0)
    h100 = snap.product(H100)
    assert h100 is not None
    assert (h100.total, h100.allocatable, h100.free, h100.largest_shape) == (16, 16, 16, 8)


def test_a_gpu_is_counted_once_whether_a_pod_request_or_a_claim_holds_it() -> None:
    inv = inventory(node("d0", gpus=0), pods=[pod("ext", "d0", gpus=2)])
    inv.devices.set_class(gpu_class())
    inv.devices.set_slice(devices_slice("d0", 8))
    # the scheduler's claim for the pod's nvidia.com/gpu: 2 holds devices the pod's request already counts
    inv.devices.set_claim(claim("ext-gpus", "d0", 0, 1, extended=True))
    # a claim of the class holds one more, which no pod request shows
    inv.devices.set_claim(claim("mine", "d0", 2))
    h100 = inv.snapshot(1, 0.0).product(H100)
    assert h100 is not None
    assert (h100.in_use, h100.free) == (3, 5)
    group = inv.snapshot(2, 0.0).devices[0]
    assert (group.total, group.free, group.largest) == (8, 5, 5)
    inv.devices.delete_claim("team", "mine")
    h100 = inv.snapshot(3, 0.0).product(H100)
    assert h100 is not None and h100.free == 6


def test_devices_of_an_unmapped_class_are_offered_but_not_counted_as_gpus() -> None:
    inv = inventory(node("d0", gpus=0))
    inv.devices.set_class(gpu_class(extended=None))
    inv.devices.set_slice(devices_slice("d0", 4))
    snap = inv.snapshot(1, 0.0)
    h100 = snap.product(H100)
    assert h100 is not None and h100.total == 0
    (group,) = snap.devices
    assert (group.extended_resource, group.total, group.device_classes) == ("", 4, (DRIVER,))


def test_groups_leave_out_device_identities_and_qualify_names() -> None:
    inv = DeviceInventory()
    inv.set_class(gpu_class())
    inv.set_slice(devices_slice("d0", 3))
    inv.set_slice(devices_slice("d1", 2, memory="40Gi"))
    found = groups(inv, lambda n: H100)
    assert [(g.total, dict(g.capacity)) for g in found] == [
        (2, {f"{DRIVER}/memory": "40Gi"}),
        (3, {f"{DRIVER}/memory": "81559Mi"}),
    ]
    assert found[1].attributes == (
        Attribute(f"{DRIVER}/migCapable", "bool", "true"),
        Attribute(f"{DRIVER}/productName", "string", H100),
    )


def test_unhealthy_nodes_and_classes_with_other_cel_offer_nothing() -> None:
    inv = inventory(node("d0", gpus=0, ready=False), node("d1", gpus=0))
    inv.devices.set_class(gpu_class(cel=f"device.driver == '{DRIVER}' && device.attributes['x'].y"))
    inv.devices.set_slice(devices_slice("d0", 8))
    inv.devices.set_slice(devices_slice("d1", 8))
    assert inv.snapshot(1, 0.0).devices == ()
    inv.devices.set_class(gpu_class())
    (group,) = inv.snapshot(2, 0.0).devices
    assert group.total == 8  # d0 is NotReady


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    inv = DeviceInventory()
    inv.set_class(gpu_class())
    inv.set_slice(devices_slice("d0", 8, generation=1))
    inv.set_slice(devices_slice("d0", 2, generation=2))
    (group,) = groups(inv, lambda n: H100)
    assert group.total == 2
    assert inv.extended("nvidia.com/gpu") == {"d0": (2, 0)}


def test_device_groups_survive_the_estimator_wire() -> None:
    inv = inventory(node("d0", gpus=0))
    inv.devices.set_class(gpu_class())
    inv.devices.set_slice(devices_slice("d0", 8))
    inv.devices.set_claim(claim("c", "d0", 3))
    snap = inv.snapshot(5, 1.0)
    assert snap.devices
    assert wire.snapshot_from_pb(wire.snapshot_to_pb(snap)) == snap
