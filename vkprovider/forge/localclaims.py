"""Pure translators for claims of the virtual StorageClass whose first pod the consumer's
kube-scheduler placed on a local node: they are bound to the consumer's own storage.

Owns:
- `node_selects`: whether a volume's (or any) required node selection admits a node
  (`gpufed.kube.selectors`);
- `pick_volume`: for a static local class, the smallest Available volume of that class, unclaimed,
  not being deleted, large enough, with every access mode and the volume mode the claim asks for,
  whose node affinity admits the claim's node (what kube-scheduler's volume binder would choose);
- `shadow_claim`: for a dynamic local class, the claim gpufed asks that class's provisioner for on the
  claim's behalf (`gpufed-local-<uid>`, same size, access modes and volume mode, the selected node
  written as kube-scheduler writes it, owned by the user's claim so that it goes with it);
- `claim_ref`: the `spec.claimRef` that hands a volume to the user's claim (the consumer's
  kube-controller-manager then binds the claim to it, as for a volume an administrator pre-bound).

Does not: read or write anything (`vkprovider.localstorage` does), or handle claims placed on virtual
nodes (`vkprovider.remote.volumes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from gpufed.apis import quantity
from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, ORIGIN_UID_LABEL
from gpufed.kube.selectors import terms_select
from vkprovider.forge.claims import SELECTED_NODE_ANNOTATION, access_modes, requested

#: Prefix of the shadow claims gpufed makes in the user's namespace (the controller may create and
#: delete claims of this prefix only: its admission policy says so).
SHADOW_PREFIX = "gpufed-local-"


def shadow_name(claim: Mapping[str, Any]) -> str:
    return f"{SHADOW_PREFIX}{(claim.get('metadata') or {}).get('uid', '')}"


def node_selects(terms: Iterable[Mapping[str, Any]] | None, node: Mapping[str, Any]) -> bool:
    """Whether `terms` (nodeSelectorTerms; None: no requirement) admit `node` (`gpufed.kube.selectors`)."""
    if terms is None:
        return True
    meta = node.get("metadata") or {}
    return terms_select(terms, meta.get("labels") or {}, str(meta.get("name") or ""))


def _volume_terms(volume: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    required = (((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required")) or None
    return None if required is None else list(required.get("nodeSelectorTerms") or [])


def _size(text: Any) -> Decimal | None:
    try:
        return quantity.parse(str(text))
    except quantity.QuantityError:
        return None


def pick_volume(
    claim: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]], node: Mapping[str, Any], class_name: str
) -> Mapping[str, Any] | None:
    """The volume of `class_name` that `claim`, scheduled to `node`, gets (see module doc); None when none fits."""
    want = _size(requested(claim)) or Decimal(0)
    modes = set(access_modes(claim))
    mode = (claim.get("spec") or {}).get("volumeMode") or "Filesystem"
    best: tuple[Decimal, str, Mapping[str, Any]] | None = None
    for volume in volumes:
        spec = volume.get("spec") or {}
        meta = volume.get("metadata") or {}
        if spec.get("storageClassName") != class_name or spec.get("claimRef") or meta.get("deletionTimestamp"):
            continue
        if (volume.get("status") or {}).get("phase") != "Available":
            continue
        size = _size((spec.get("capacity") or {}).get("storage"))
        if size is None or size < want or not modes <= set(spec.get("accessModes") or []):
            continue
        if (spec.get("volumeMode") or "Filesystem") != mode or not node_selects(_volume_terms(volume), node):
            continue
        key = (size, str(meta.get("name") or ""))
        if best is None or key < best[:2]:
            best = (*key, volume)
    return None if best is None else best[2]


def shadow_claim(claim: Mapping[str, Any], class_name: str, node: str) -> dict[str, Any]:
    """The claim of the local dynamic class `class_name` made for `claim`, placed on `node`."""
    meta = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    shadow_spec: dict[str, Any] = {
        "storageClassName": class_name,
        "accessModes": access_modes(claim),
        "resources": {"requests": {"storage": requested(claim)}},
    }
    if spec.get("volumeMode"):
        shadow_spec["volumeMode"] = spec["volumeMode"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": shadow_name(claim),
            "namespace": meta.get("namespace"),
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, ORIGIN_UID_LABEL: str(meta.get("uid") or "")},
            "annotations": {SELECTED_NODE_ANNOTATION: node},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                }
            ],
        },
        "spec": shadow_spec,
    }


def claim_ref(claim: Mapping[str, Any]) -> dict[str, Any]:
    meta = claim.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }


__all__ = [
    "SHADOW_PREFIX",
    "claim_ref",
    "node_selects",
    "pick_volume",
    "shadow_claim",
    "shadow_name",
]
