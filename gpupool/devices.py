"""DRA device groups: the aggregates of a cluster's devices the estimator serves (pure).

Owns `groups`: the devices of `peering.devices.DeviceInventory` on the nodes the caller counts,
grouped by node GPU product, driver, attributes and capacity (identities are already left out), with
the classes that select the driver, the extended resource one maps them to, how many there are,
how many are free, and the most free on one node. Only aggregates: no node, pool or device names.

Does not: track the devices (`peering.devices`), or talk to anyone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from gpupool.capacity import Attribute, DeviceGroup
from peering.devices import Device, DeviceInventory


def groups(inventory: DeviceInventory, product_of: Callable[[str], str | None]) -> tuple[DeviceGroup, ...]:
    """The device groups on the nodes `product_of` counts (None for a node left out: unknown,
    unhealthy or unschedulable)."""
    total: Counter[tuple[str, str, Device]] = Counter()
    free: Counter[tuple[str, str, Device]] = Counter()
    per_node: Counter[tuple[str, str, Device, str]] = Counter()
    for node, ident, device, is_free in inventory.offered():
        product = product_of(node)
        if product is None:
            continue
        key = (product, ident[0], device)
        total[key] += 1
        if is_free:
            free[key] += 1
            per_node[(*key, node)] += 1
    largest: dict[tuple[str, str, Device], int] = {}
    for (product, driver, device, _node), n in per_node.items():
        largest[(product, driver, device)] = max(largest.get((product, driver, device), 0), n)
    out = [
        DeviceGroup(
            product=product,
            driver=driver,
            device_classes=inventory.classes_of(driver),
            attributes=tuple(Attribute(*a) for a in device.attributes),
            capacity=device.capacity,
            extended_resource=inventory.extended_resource_of(driver),
            total=n,
            free=free[(product, driver, device)],
            largest=largest.get((product, driver, device), 0),
        )
        for (product, driver, device), n in total.items()
    ]
    return tuple(sorted(out, key=lambda g: (g.product, g.driver, g.attributes, g.capacity)))


__all__ = ["groups"]
