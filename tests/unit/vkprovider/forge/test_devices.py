"""What a pool virtual node publishes through DRA (vkprovider.forge.devices): bounded by the budget and
the provider's free devices, held devices kept under their names, provider data checked."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpufed.apis.wire import DRA_DRIVER
from gpupool.capacity import Attribute, DeviceGroup
from vkprovider.forge.devices import (
    CLASS_ATTRIBUTE,
    MAX_DEVICES,
    device_class,
    device_class_of,
    kind_of,
    kinds_for,
    offer,
    slice_manifest,
)

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"


def group(product: str = H100, *, free: int = 8, memory: str = "81559Mi", **kw: Any) -> DeviceGroup:
    g = DeviceGroup(
        product=product,
        driver="gpu.nvidia.com",
        device_classes=("gpu.nvidia.com",),
        attributes=(Attribute("gpu.nvidia.com/productName", "string", product),),
        capacity=(("gpu.nvidia.com/memory", memory),),
        extended_resource="nvidia.com/gpu",
        total=8,
        free=free,
        largest=free,
    )
    return replace(g, **kw)


def test_a_pool_offers_its_products_groups_bounded_by_budget_and_free() -> None:
    kinds = kinds_for([group(), group(L4, free=4, memory="23034Mi")], H100, "gpu-a")
    assert len(kinds) == 1
    devices = offer("gpufed-gpu-a-h100", kinds, held=(), budget=3)
    assert [d["name"].rsplit("-", 1)[1] for d in devices] == ["0", "1", "2"]
    assert devices[0]["attributes"]["gpu.nvidia.com/productName"] == {"string": H100}
    assert devices[0]["attributes"][CLASS_ATTRIBUTE] == {"string": "gpu.nvidia.com"}
    assert devices[0]["capacity"] == {"gpu.nvidia.com/memory": {"value": "81559Mi"}}
    assert len(offer("n", kinds_for([group(free=2)], H100, "p"), held=(), budget=5)) == 2


def test_held_devices_stay_listed_and_new_ones_take_other_names() -> None:
    kinds = kinds_for([group(free=2)], None, "gpu-a")
    first = offer("n", kinds, held=(), budget=2)
    held = [first[0]["name"]]
    again = offer("n", kinds, held=held, budget=1)
    names = [d["name"] for d in again]
    assert names[0] == held[0] and len(names) == 2 and names[1] not in held
    assert [d["name"] for d in offer("n", kinds, held=held, budget=0)] == held


def test_unmapped_groups_are_not_offered() -> None:
    assert kinds_for([group(extended_resource="")], None, "p") == []


@pytest.mark.parametrize(
    "bad",
    [
        {"driver": "Bad_Driver"},
        {"device_classes": ()},
        {"attributes": (Attribute("gpu.gpufed.io/provider", "string", "spoofed"),)},
        {"attributes": (Attribute("kubernetes.io/hostname", "string", "x"),)},
        {"attributes": (Attribute("node.k8s.io/x", "string", "x"),)},
        {"attributes": (Attribute("gpu.nvidia.com/productName", "string", "x" * 65),)},
        {"attributes": (Attribute("gpu.nvidia.com/index", "int", "seven"),)},
        {"attributes": (Attribute("gpu.nvidia.com/driverVersion", "version", "not-semver"),)},
        {"attributes": (Attribute("noqualifier", "string", "x"),)},
        {"capacity": (("gpu.nvidia.com/memory", "lots"),)},
        {"attributes": tuple(Attribute(f"gpu.nvidia.com/a{i}", "int", "1") for i in range(40))},
    ],
)
def test_a_group_with_anything_invalid_from_the_provider_is_dropped_whole(bad: dict[str, Any]) -> None:
    assert kind_of(group(**bad), "gpu-a") is None


def test_a_slice_never_exceeds_the_api_limit() -> None:
    devices = offer("n", kinds_for([group(free=500)], None, "p"), held=(), budget=1000)
    assert len(devices) == MAX_DEVICES


def test_the_slice_the_class_and_the_reverse_lookup() -> None:
    devices = offer("gpufed-p", kinds_for([group()], None, "p"), held=(), budget=1)
    s = slice_manifest("gpufed-p", devices, 4)
    assert s["spec"]["driver"] == DRA_DRIVER
    assert s["spec"]["nodeName"] == s["spec"]["pool"]["name"] == "gpufed-p"
    assert s["spec"]["pool"]["generation"] == 4
    assert "ownerReferences" not in s["metadata"]
    owner = {"apiVersion": "gpufed.io/v1alpha1", "kind": "ForeignCluster", "name": "p", "uid": "u"}
    assert slice_manifest("gpufed-p", devices, 4, [owner])["metadata"]["ownerReferences"] == [owner]
    assert device_class_of(s, devices[0]["name"]) == "gpu.nvidia.com"
    assert device_class_of(s, "nope") is None
    assert device_class_of(None, devices[0]["name"]) is None
    assert device_class()["spec"]["selectors"] == [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]
