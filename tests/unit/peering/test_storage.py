"""What a provider offers a consumer's claims (peering.storage): its StorageClasses as the policy
allows them, one marked default, their access modes, what their volumes still hold, and what the
twin namespaces carry of the offer."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gpufed.apis.quantity import parse
from gpufed.apis.wire import DEFAULT_STORAGE_CLASS_ANNOTATION, STATIC_PROVISIONER, STORAGE_CLASS_ACCESS_MODES_ANNOTATION
from peering import storage
from peering.storage import VolumeInfo

GI = parse("1Gi")


def sc(name: str, *, default: bool = False, provisioner: str = "csi.example.com", modes: str | None = None) -> Any:
    annotations = {DEFAULT_STORAGE_CLASS_ANNOTATION: "true"} if default else {}
    if modes is not None:
        annotations[STORAGE_CLASS_ACCESS_MODES_ANNOTATION] = modes
    return {"metadata": {"name": name, "annotations": annotations}, "provisioner": provisioner}


CLASSES = [
    storage.storage_class_info(sc("fast", modes="ReadWriteOnce, ReadWriteMany,Bogus")),
    storage.storage_class_info(sc("local-disk", default=True, provisioner=STATIC_PROVISIONER)),
    storage.storage_class_info(sc("slow")),
]


def test_a_storage_class_says_its_modes_with_read_write_once_as_the_default() -> None:
    fast, local, _slow = CLASSES
    assert fast.access_modes == ("ReadWriteOnce", "ReadWriteMany") and not fast.default and not fast.static
    assert local.access_modes == ("ReadWriteOnce",) and local.default and local.static
    assert storage.storage_class_info(sc("x", modes="Bogus")).access_modes == ("ReadWriteOnce",)


def test_unset_policy_offers_the_cluster_default_only() -> None:
    offers = storage.offers(CLASSES, None)
    assert [(o.name, o.default, o.access_modes) for o in offers] == [("local-disk", True, ["ReadWriteOnce"])]
    assert storage.offers([c for c in CLASSES if not c.default], None) == [], "no default class: nothing"


def test_named_classes_are_offered_in_policy_order_the_cluster_default_marked() -> None:
    offers = storage.offers(CLASSES, ["slow", "missing", "local-disk", "slow"])
    assert [(o.name, o.default) for o in offers] == [("slow", False), ("local-disk", True)]
    offers = storage.offers(CLASSES, ["fast", "slow"])
    assert [(o.name, o.default) for o in offers] == [("fast", True), ("slow", False)], "else the first"
    assert storage.offers(CLASSES, []) == [], "an empty list offers nothing"


def pv(name: str, size: str, *, cls: str = "local-disk", phase: str = "Available", claimed: bool = False) -> VolumeInfo:
    spec: dict[str, Any] = {"capacity": {"storage": size}, "storageClassName": cls}
    if claimed:
        spec["claimRef"] = {"name": "c", "namespace": "n"}
    return storage.volume_info({"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}})


def test_static_classes_supply_what_their_unbound_volumes_hold() -> None:
    by_name = {c.name: c for c in CLASSES}
    volumes = [
        pv("a", "50Gi"),
        pv("b", "50Gi", phase="Bound", claimed=True),
        pv("c", "50Gi", claimed=True),  # reserved by the scheduler, not bound yet
        pv("d", "50Gi", phase="Released", claimed=True),
        pv("e", "50Gi", cls="other"),
        pv("f", "oops"),
    ]
    supply = storage.supply(storage.offers(CLASSES, None), by_name, volumes)
    assert supply.classes == ("local-disk",) and supply.free == 50 * GI
    on_demand = storage.supply(storage.offers(CLASSES, ["local-disk", "slow"]), by_name, volumes)
    assert on_demand.free is None, "a class that provisions on demand has no known limit"
    assert storage.supply([], by_name, volumes).classes == ()


def test_twin_namespaces_offer_the_classes_only_while_storage_is_granted() -> None:
    offers = storage.offers(CLASSES, None)
    assert storage.projected(offers, 10 * GI) == tuple(offers)
    assert storage.projected(offers, Decimal(0)) == ()
