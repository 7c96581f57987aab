"""What a provider offers a consumer's claims: its StorageClasses, what their volumes hold, and how
the offer is written where the claims admission policy reads it.

Owns:
- `StorageClassInfo` / `storage_class_info`: what the provider role keeps of each StorageClass (its
  name, whether it is the cluster's default, its provisioner, the access modes its operator declares
  with `gpufed.io/access-modes`, ReadWriteOnce when none);
- `offers`: the classes a Tenant's policy lets the consumer use (`storageClasses`: unset, the
  cluster's default class only; empty, none; else those named that exist, in the policy's order),
  exactly one marked `default` (the cluster's default when offered, else the first) — what a
  ResourceSlice's `status.storageClasses` carries with a storage grant;
- `VolumeInfo` / `volume_info` and `supply`: how much storage those classes can still give
  (`peering.grants.StorageSupply`): the capacity of their unbound static volumes, or no known limit
  when a class provisions volumes on demand;
- `projected`: what a consumer's twin namespaces carry of the offer (the offer with a storage grant,
  nothing without), which `peering.podsecurity.namespace_metadata` writes as annotations and the claims
  admission policy reads.

Does not: decide the grant (`peering.grants`), watch anything (the provider role fills its cache
from StorageClasses and PersistentVolumes), write the namespace annotations (`peering.podsecurity`),
or render the admission policy (`peering.admission.claims`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpufed.apis.peering import ACCESS_MODES, AccessMode, StorageClassOffer
from gpufed.apis.quantity import parse
from gpufed.apis.wire import (
    DEFAULT_STORAGE_CLASS_ANNOTATION,
    STATIC_PROVISIONER,
    STORAGE_CLASS_ACCESS_MODES_ANNOTATION,
    STORAGE_RESOURCE,
)
from peering.grants import StorageSupply

#: Access modes of a class whose operator declares none.
DEFAULT_ACCESS_MODES: tuple[AccessMode, ...] = ("ReadWriteOnce",)


@dataclass(frozen=True)
class StorageClassInfo:
    name: str
    #: Annotated as the cluster's default class.
    default: bool = False
    provisioner: str = ""
    access_modes: tuple[AccessMode, ...] = DEFAULT_ACCESS_MODES

    @property
    def static(self) -> bool:
        """Volumes of this class exist beforehand; none is provisioned for a claim."""
        return self.provisioner == STATIC_PROVISIONER


def _access_modes(value: str) -> tuple[AccessMode, ...]:
    """The known access modes in a comma-separated list, in API order (unknown ones are left out)."""
    given = {m.strip() for m in value.split(",")}
    known = tuple(m for m in ACCESS_MODES if m in given)
    return known or DEFAULT_ACCESS_MODES


def storage_class_info(obj: Mapping[str, Any]) -> StorageClassInfo:
    """What the grants need of a StorageClass object."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return StorageClassInfo(
        name=str(meta.get("name", "")),
        default=str(annotations.get(DEFAULT_STORAGE_CLASS_ANNOTATION, "")).lower() == "true",
        provisioner=str(obj.get("provisioner") or ""),
        access_modes=_access_modes(str(annotations.get(STORAGE_CLASS_ACCESS_MODES_ANNOTATION) or "")),
    )


def offers(classes: Iterable[StorageClassInfo], allowed: Sequence[str] | None) -> list[StorageClassOffer]:
    """The StorageClasses offered to a consumer whose policy allows `allowed` (None: the cluster's
    default class only; classes that do not exist are left out), one of them marked default."""
    by_name = {c.name: c for c in classes}
    if allowed is None:
        chosen = sorted((c for c in by_name.values() if c.default), key=lambda c: c.name)
    else:
        chosen = [by_name[n] for n in dict.fromkeys(allowed) if n in by_name]
    if not chosen:
        return []
    default = next((c.name for c in chosen if c.default), chosen[0].name)
    return [
        StorageClassOffer(name=c.name, default=c.name == default, access_modes=list(c.access_modes)) for c in chosen
    ]


@dataclass(frozen=True)
class VolumeInfo:
    """A PersistentVolume as the grants count it."""

    name: str
    storage_class: str
    capacity: Decimal
    #: Available for a claim: phase Available and no claim reserved it.
    free: bool


def volume_info(obj: Mapping[str, Any]) -> VolumeInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    try:
        capacity = parse(str((spec.get("capacity") or {}).get(STORAGE_RESOURCE) or "0"))
    except ValueError:
        capacity = Decimal(0)
    return VolumeInfo(
        name=str(meta.get("name", "")),
        storage_class=str(spec.get("storageClassName") or ""),
        capacity=capacity,
        free=status.get("phase") == "Available" and not spec.get("claimRef"),
    )


def supply(
    offered: Sequence[StorageClassOffer], classes: Mapping[str, StorageClassInfo], volumes: Iterable[VolumeInfo]
) -> StorageSupply:
    """What the offered classes can still give: the unbound static volumes' capacity when every
    offered class is static, no known limit when one provisions on demand."""
    names = tuple(o.name for o in offered)
    if not names:
        return StorageSupply()
    if any(not (c := classes.get(n)) or not c.static for n in names):
        return StorageSupply(names, None)
    free = sum((v.capacity for v in volumes if v.free and v.storage_class in names), Decimal(0))
    return StorageSupply(names, free)


def projected(offered: Sequence[StorageClassOffer], granted: Decimal) -> tuple[StorageClassOffer, ...]:
    """What the twin namespaces offer the consumer's claims: the offer while storage is granted."""
    return tuple(offered) if granted > 0 else ()
