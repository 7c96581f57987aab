"""What a pool virtual node offers through Dynamic Resource Allocation (pure).

Owns `offer`: the resource.k8s.io/v1 ResourceSlice a pool node publishes on the consumer, under
gpufed's driver `gpu.gpufed.io` (pool = node = the virtual node), from the provider's device groups
(`gpupool.capacity.DeviceGroup`, served by its estimator), so that the consumer's kube-scheduler
allocates claims to the virtual node like to any node:

- only groups of this pool's GPU product whose provider class maps them to `nvidia.com/gpu` are
  offered: those are what the grant counts and what the provider's quota on `requests.nvidia.com/gpu`
  bounds (Kubernetes counts a claim of such a class against it);
- bounded: the devices consumer claims already hold on this node stay listed (under the names they
  were allocated with), and at most `budget` more (the GPUs the node can still take, which the
  caller derives from the grant and the provider's free capacity), never more than a group has free
  at the provider, never more than a slice's 128 devices;
- names are stable: `g<hash of the group>-<i>`, so a republished slice keeps the held devices;
- attributes and capacity are copied under their qualified names (`gpu.nvidia.com/productName`), so a
  claim's CEL selector reads `device.attributes["gpu.nvidia.com"].productName` on both clusters.
  gpufed adds, in its own domain: `provider` (the provider's cluster ID), `driver` and `deviceClass`
  (the provider's driver and the class the twin claim asks), `product`.

Everything in a group comes from the provider, untrusted: a group, attribute or capacity entry that
is no valid DRA name or value is dropped (never partly copied), as is anything in a domain a
provider may not speak for (`kubernetes.io`, `k8s.io`, `gpufed.io` and their subdomains, and
gpufed's driver domain).

`device_class` is the consumer's DeviceClass `gpu.gpufed.io` (selecting gpufed's driver) that claims
name to get these devices. `device_class_of` answers the reverse question at offload time: which provider DeviceClass a
published device stands for (from the offered slice).

Does not: talk to anyone, or decide the budget.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.quantity import QuantityError, parse
from gpufed.apis.wire import DRA_DEVICE_CLASS, DRA_DRIVER, MANAGED_BY, MANAGED_BY_LABEL
from gpupool.capacity import DeviceGroup
from vkprovider.forge.pools import reserved_label

#: resource.k8s.io/v1 limits: devices per slice, attributes + capacity entries per device.
MAX_DEVICES = 128
MAX_ENTRIES = 32
#: Longest string attribute value the API accepts.
MAX_STRING = 64
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: gpufed's own attributes (in the driver's domain, so unqualified on its devices).
PROVIDER_ATTRIBUTE = "provider"
DRIVER_ATTRIBUTE = "driver"
CLASS_ATTRIBUTE = "deviceClass"
PRODUCT_ATTRIBUTE = "product"


def _name_ok(qualified: str) -> bool:
    domain, _, ident = qualified.rpartition("/")
    if not domain or len(domain) > 63 or not _DOMAIN.match(domain) or not _ID.match(ident):
        return False
    return not reserved_label(f"{domain}/x") and domain != DRA_DRIVER


def _dns(name: str, limit: int = 253) -> bool:
    return 0 < len(name) <= limit and bool(_DNS_NAME.match(name))


def _value(kind: str, text: str) -> dict[str, Any] | None:
    if kind == "string":
        return {"string": text} if len(text) <= MAX_STRING else None
    if kind == "int":
        try:
            return {"int": int(text)}
        except ValueError:
            return None
    if kind == "bool":
        return {"bool": text == "true"} if text in ("true", "false") else None
    if kind == "version":
        return {"version": text} if len(text) <= MAX_STRING and _VERSION.match(text) else None
    return None


@dataclass(frozen=True)
class Kind:
    """One group as the consumer sees it: the devices' attributes and capacity, ready to publish."""

    id: str
    group: DeviceGroup
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any]


def kind_of(group: DeviceGroup, provider: str) -> Kind | None:
    """The publishable form of `group`; None when the provider sent something invalid."""
    if not _dns(group.driver, 63) or not group.device_classes or not all(_dns(c) for c in group.device_classes):
        return None
    if group.product and len(group.product) > MAX_STRING:
        return None
    attributes: dict[str, Any] = {}
    for a in group.attributes:
        v = _value(a.kind, a.value)
        if v is None or not _name_ok(a.name):
            return None
        attributes[a.name] = v
    capacity: dict[str, Any] = {}
    for name, q in group.capacity:
        try:
            parse(q)
        except QuantityError:
            return None
        if not _name_ok(name) or len(q) > MAX_STRING:
            return None
        capacity[name] = {"value": q}
    own = {
        PROVIDER_ATTRIBUTE: {"string": provider},
        DRIVER_ATTRIBUTE: {"string": group.driver},
        CLASS_ATTRIBUTE: {"string": group.device_classes[0]},
        PRODUCT_ATTRIBUTE: {"string": group.product},
    }
    if len(attributes) + len(capacity) + len(own) > MAX_ENTRIES:
        return None
    identity = (
        group.product,
        group.driver,
        group.device_classes[0],
        sorted(attributes.items()),
        sorted(capacity.items()),
    )
    digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:10]
    return Kind(f"g{digest}", group, {**attributes, **own}, capacity)


def kinds_for(groups: Iterable[DeviceGroup], product: str | None, provider: str) -> list[Kind]:
    """The groups a pool of `product` (None: the whole provider) offers, valid ones only."""
    out: list[Kind] = []
    for g in groups:
        if g.extended_resource != GPU_RESOURCE or (product is not None and g.product != product):
            continue
        k = kind_of(g, provider)
        if k is not None:
            out.append(k)
    return out


def offer(node: str, kinds: Sequence[Kind], *, held: Iterable[str], budget: int) -> list[dict[str, Any]]:
    """The devices of `node`'s slice: every held device of a kind still offered, then up to
    `budget` free ones (each kind at most what it has free at the provider)."""
    held_set = set(held)
    devices: list[dict[str, Any]] = []
    left = max(0, budget)
    for k in kinds:
        mine = sorted((h for h in held_set if h.startswith(f"{k.id}-")), key=_index)
        fresh: list[str] = []
        i = 0
        while len(fresh) < min(k.group.free, left) and len(mine) + len(fresh) < MAX_DEVICES:
            name = f"{k.id}-{i}"
            if name not in held_set:
                fresh.append(name)
            i += 1
        left -= len(fresh)
        for name in sorted((*mine, *fresh), key=_index):
            devices.append({"name": name, "attributes": dict(k.attributes), "capacity": dict(k.capacity)})
    return devices[:MAX_DEVICES]


def _index(name: str) -> int:
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def slice_manifest(
    node: str,
    devices: Sequence[Mapping[str, Any]],
    generation: int,
    owners: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The ResourceSlice (resource.k8s.io/v1) of `node`: one slice, one pool named after the node;
    `owners`: its ownerReferences (the peering's ForeignCluster, which owns the node too)."""
    meta: dict[str, Any] = {"name": node, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
    if owners:
        meta["ownerReferences"] = [dict(o) for o in owners]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


def device_class() -> dict[str, Any]:
    """The consumer's DeviceClass for the devices virtual nodes publish: claims name it to get them."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DEVICE_CLASS, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]},
    }


def device_class_of(slice_obj: Mapping[str, Any] | None, device: str) -> str | None:
    """The provider DeviceClass that `device` of a published slice stands for (None: not found)."""
    for d in ((slice_obj or {}).get("spec") or {}).get("devices") or []:
        if d.get("name") == device:
            value = ((d.get("attributes") or {}).get(CLASS_ATTRIBUTE) or {}).get("string")
            return str(value) if value else None
    return None


__all__ = [
    "CLASS_ATTRIBUTE",
    "MAX_DEVICES",
    "Kind",
    "device_class",
    "device_class_of",
    "kind_of",
    "kinds_for",
    "offer",
    "slice_manifest",
]
