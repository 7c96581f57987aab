"""A cluster's Dynamic Resource Allocation devices, incrementally: `DeviceInventory` (pure).

Owns, fed with watch events of resource.k8s.io/v1 objects:
- ResourceSlices bound to one node (`spec.nodeName`): the devices each driver publishes, per pool
  at the pool's newest generation;
- DeviceClasses: which driver a class selects and which extended resource it maps
  (`spec.extendedResourceName`, Kubernetes' DRA extended-resource mapping);
- ResourceClaims: which devices their allocations hold, and whether a claim is one the scheduler
  made for a pod's extended-resource request (`resource.kubernetes.io/extended-resource-claim`),
  whose devices the pod's own requests already count.

From these it answers, per node, how many devices count as GPUs of an extended resource and how
many of them claims hold outside the pods' requests — per namespace too, so a consumer's claims count
as its usage — (so the grant decision and `gpupool.inventory` count a GPU managed by DRA once,
whether a pod asks `nvidia.com/gpu: 1` or a claim asks the class), and the devices themselves with
their attributes (`gpupool.devices` aggregates them into the groups the estimator serves).

A class counts as selecting a driver only when each of its selectors is the plain
`device.driver == "<driver>"` expression drivers ship; a class with other CEL is not offered (its
devices stay unaccounted for, never wrongly offered). Per-device identities (UUID, index, PCI bus,
serial, minor number) are left out of the groups: they would split every device into its own group
and tell consumers which physical device is which.

Does not: evaluate CEL, allocate, aggregate, or talk to anyone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Annotation the scheduler puts on the claims it creates for extended-resource requests.
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
#: Attribute ids that name one physical device rather than a kind of device.
IDENTITY_ATTRIBUTES = frozenset({"uuid", "index", "minor", "pciBusID", "pcieRoot", "serial", "serialNumber"})
_DRIVER_SELECTOR = re.compile(r"""^\s*device\.driver\s*==\s*(?:"([^"]+)"|'([^']+)')\s*$""")
_ATTRIBUTE_KINDS = ("string", "int", "bool", "version")

#: (driver, pool, device)
DeviceID = tuple[str, str, str]


#: (qualified name, kind: string|int|bool|version, value as text)
Attribute = tuple[str, str, str]


@dataclass(frozen=True)
class Device:
    """A device's attributes (sorted, identities left out) and capacity (qualified name, quantity)."""

    attributes: tuple[Attribute, ...]
    capacity: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Slice:
    node: str
    driver: str
    pool: str
    generation: int
    devices: tuple[tuple[str, Device], ...]


@dataclass(frozen=True)
class _Class:
    #: None: selectors other than one driver match (not offered).
    driver: str | None
    extended_resource: str


def _qualified(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _attribute(name: str, raw: Any, driver: str) -> Attribute | None:
    if not isinstance(raw, Mapping):
        return None
    for kind in _ATTRIBUTE_KINDS:
        if kind in raw and raw[kind] is not None:
            value = raw[kind]
            text = ("true" if value else "false") if kind == "bool" else str(value)
            return (_qualified(name, driver), kind, text)
    return None


def _device(raw: Mapping[str, Any], driver: str) -> Device:
    attrs: list[Attribute] = []
    for name, value in (raw.get("attributes") or {}).items():
        if str(name).rsplit("/", 1)[-1] in IDENTITY_ATTRIBUTES:
            continue
        a = _attribute(str(name), value, driver)
        if a is not None:
            attrs.append(a)
    capacity: list[tuple[str, str]] = []
    for name, value in (raw.get("capacity") or {}).items():
        q = value.get("value") if isinstance(value, Mapping) else None
        if q is not None:
            capacity.append((_qualified(str(name), driver), str(q)))
    return Device(tuple(sorted(attrs)), tuple(sorted(capacity)))


def _class_of(obj: Mapping[str, Any]) -> _Class:
    spec = obj.get("spec") or {}
    drivers: set[str] = set()
    ok = True
    for selector in spec.get("selectors") or []:
        expression = str(((selector or {}).get("cel") or {}).get("expression") or "")
        m = _DRIVER_SELECTOR.match(expression)
        if m is None:
            ok = False
            break
        drivers.add(m.group(1) or m.group(2))
    driver = next(iter(drivers)) if ok and len(drivers) == 1 else None
    return _Class(driver, str(spec.get("extendedResourceName") or ""))


class DeviceInventory:
    """Slices, classes and claims of one cluster; `changes` counts updates that changed anything."""

    def __init__(self) -> None:
        self._slices: dict[str, _Slice] = {}
        self._classes: dict[str, _Class] = {}
        #: (namespace, name) -> (devices held, made for an extended-resource request)
        self._claims: dict[tuple[str, str], tuple[frozenset[DeviceID], bool]] = {}
        self.changes = 0
        #: resource -> (changes when computed, `extended(resource)`)
        self._extended: dict[str, tuple[int, dict[str, tuple[int, int]]]] = {}

    # ---- feeding

    def set_slice(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        name = str(meta.get("name") or "")
        node = str(spec.get("nodeName") or "")
        driver = str(spec.get("driver") or "")
        pool = spec.get("pool") or {}
        if not name or not node or not driver:
            self.delete_slice(name)  # slices for node selectors or all nodes are not node capacity
            return
        devices = tuple(
            (str(d.get("name") or ""), _device(d, driver)) for d in spec.get("devices") or [] if d.get("name")
        )
        new = _Slice(node, driver, str(pool.get("name") or ""), int(pool.get("generation") or 0), devices)
        if self._slices.get(name) != new:
            self._slices[name] = new
            self.changes += 1

    def delete_slice(self, name: str) -> None:
        if self._slices.pop(name, None) is not None:
            self.changes += 1

    def set_class(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        new = _class_of(obj)
        if name and self._classes.get(name) != new:
            self._classes[name] = new
            self.changes += 1

    def delete_class(self, name: str) -> None:
        if self._classes.pop(name, None) is not None:
            self.changes += 1

    def set_claim(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        allocation = (obj.get("status") or {}).get("allocation") or {}
        held = frozenset(
            (str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
            for r in (allocation.get("devices") or {}).get("results") or []
            if not r.get("adminAccess")  # admin access shares a device, it does not take it
        )
        extended = (meta.get("annotations") or {}).get(EXTENDED_CLAIM_ANNOTATION) == "true"
        if not held:
            self.delete_claim(*key)
            return
        if self._claims.get(key) != (held, extended):
            self._claims[key] = (held, extended)
            self.changes += 1

    def delete_claim(self, namespace: str, name: str) -> None:
        if self._claims.pop((namespace, name), None) is not None:
            self.changes += 1

    # ---- answers

    def _current(self) -> dict[str, list[tuple[DeviceID, Device]]]:
        """node -> its devices, each pool at its newest generation."""
        newest: dict[tuple[str, str], int] = {}
        for s in self._slices.values():
            key = (s.driver, s.pool)
            newest[key] = max(newest.get(key, s.generation), s.generation)
        out: dict[str, list[tuple[DeviceID, Device]]] = {}
        for s in self._slices.values():
            if s.generation == newest[(s.driver, s.pool)]:
                out.setdefault(s.node, []).extend(((s.driver, s.pool, n), d) for n, d in s.devices)
        return out

    def _held(self) -> tuple[set[DeviceID], set[DeviceID]]:
        """Devices any claim holds, and those held by claims not made for extended resources."""
        every: set[DeviceID] = set()
        explicit: set[DeviceID] = set()
        for held, extended in self._claims.values():
            every |= held
            if not extended:
                explicit |= held
        return every, explicit

    def _mapped(self) -> dict[str, str]:
        """driver -> the extended resource one of its classes maps (drivers without one left out)."""
        return {c.driver: c.extended_resource for c in self._classes.values() if c.driver and c.extended_resource}

    def extended(self, resource: str) -> dict[str, tuple[int, int]]:
        """node -> (devices that count as `resource`, of those held by claims not made for a pod's
        extended-resource request). Kept until the next change: placement asks it for every pod."""
        memo = self._extended.get(resource)
        if memo is not None and memo[0] == self.changes:
            return memo[1]
        out = self._count_extended(resource)
        self._extended[resource] = (self.changes, out)
        return out

    def _count_extended(self, resource: str) -> dict[str, tuple[int, int]]:
        drivers = {d for d, r in self._mapped().items() if r == resource}
        _every, explicit = self._held()
        out: dict[str, tuple[int, int]] = {}
        for node, devices in self._current().items():
            ids = [i for i, _d in devices if i[0] in drivers]
            if ids:
                out[node] = (len(ids), sum(1 for i in ids if i in explicit))
        return out

    def held_by_namespace(self, resource: str) -> dict[str, int]:
        """namespace -> devices counted as `resource` that its claims (not made for extended-resource
        requests) hold."""
        drivers = {d for d, r in self._mapped().items() if r == resource}
        out: dict[str, int] = {}
        for (namespace, _name), (held, extended) in self._claims.items():
            if not extended:
                n = sum(1 for i in held if i[0] in drivers)
                if n:
                    out[namespace] = out.get(namespace, 0) + n
        return out

    def offered(self) -> Iterator[tuple[str, DeviceID, Device, bool]]:
        """(node, id, device, free) of every device of a driver some plain class selects."""
        selected = {c.driver for c in self._classes.values() if c.driver}
        every, _explicit = self._held()
        for node, devices in self._current().items():
            for ident, device in devices:
                if ident[0] in selected:
                    yield node, ident, device, ident not in every

    def classes_of(self, driver: str) -> tuple[str, ...]:
        """The plain classes selecting `driver`, sorted."""
        return tuple(sorted(n for n, c in self._classes.items() if c.driver == driver))

    def extended_resource_of(self, driver: str) -> str:
        """The extended resource a class maps `driver`'s devices to ("" for none)."""
        return self._mapped().get(driver, "")


__all__ = ["EXTENDED_CLAIM_ANNOTATION", "IDENTITY_ATTRIBUTES", "Attribute", "Device", "DeviceID", "DeviceInventory"]
