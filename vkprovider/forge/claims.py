"""Claims of offloaded pods (pure): the provider's copy of a consumer claim of gpufed's virtual
StorageClass, and the consumer's virtual PersistentVolume that stands for it.

A claim of the virtual class (WaitForFirstConsumer) waits until the consumer's kube-scheduler picks a
node for its first pod and writes that node into the claim (`volume.kubernetes.io/selected-node`).
When the node is one of a provider's virtual nodes, that provider's virtual kubelet plays the
provisioner: it creates the claim in the twin namespace with one of the StorageClasses the provider
offered in its grant (`remote_claim`), then a PersistentVolume on the consumer bound to the claim
(`virtual_volume`) whose node affinity names the provider (`gpufed.io/remote-cluster-id`, a label
every virtual node of that provider carries). The scheduler then puts the pod, and every later pod
mounting the claim, on that provider's virtual nodes only: the data stays where it was written.

Owns:
- `StorageOffer` and `offers_from`: the classes a provider offered, read from its grant and checked
  (the provider is not trusted: a name that is no valid object name, or an access mode Kubernetes
  does not know, is dropped);
- `choose_offer`: which offered class a claim is bound with (its annotation
  `gpufed.io/provider-storage-class`, else the offer marked default), or a `ClaimRefusedError` that says why
  none (no storage offered, a class or an access mode the provider does not offer);
- `remote_claim`: the twin namespace's claim, a whitelist of the local one (access modes, size, volume
  mode, the chosen class) with the origin labels; never a `volumeName`, `selector` or data source;
- `virtual_volume` and `volume_name`: the consumer's PersistentVolume for a claim bound on a
  provider (capacity and access modes of the claim, its claimRef, the provider's node affinity,
  a CSI source naming the remote claim that no kubelet ever mounts: only virtual nodes can take it);
- `mirror_volume`: the merge patch that makes a virtual volume mirror the provider's claim: its phase
  (annotation `gpufed.io/remote-phase`) and, once that claim is Bound, the capacity and access modes
  of the provider's volume as the claim reports them (`status.capacity.storage`,
  `status.accessModes`). The provider's claim is untrusted: a phase Kubernetes does not know, a size
  that is no quantity, is not positive, is out of range or is smaller than the consumer's claim asked,
  or an access mode Kubernetes does not know, is ignored and named in `VolumeMirror.ignored`. The
  access modes never drop below those the consumer's claim asked (binding on the provider
  guarantees its volume has them) and never mix `ReadWriteOncePod` with another mode (the API server
  refuses that volume). Kubernetes allows both `spec.capacity` and `spec.accessModes` of a
  PersistentVolume to change after creation; the consumer's claim keeps the `status.capacity` it
  got when it was bound (the consumer's kube-controller-manager sets it once), while its
  `status.accessModes` follows the volume;
- `claim_names` and `data_place`: the claims a pod mounts, and where each keeps the pod;
- small readers (`provisioner`, `selected_node`, `storage_class`, `requested`, `remote_claim_ref`).

Does not: talk to any API server (`vkprovider.remote.volumes` does), or decide which node a pod
goes to (the consumer's kube-scheduler does, with the virtual volume's node affinity).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpufed.apis.quantity import QuantityError, format_quantity, parse
from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROVIDER_STORAGE_CLASS_ANNOTATION,
    REMOTE_CLUSTER_LABEL,
    REMOTE_PHASE_ANNOTATION,
    STORAGE_PROVISIONER,
)
from vkprovider.forge.meta import Target, is_dns_subdomain, origin_labels, twin_metadata

#: Kubernetes' annotation on a WaitForFirstConsumer claim: the node the scheduler chose for its first pod.
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
#: Kubernetes' annotations on a claim the kube-controller-manager hands to an external provisioner.
STORAGE_PROVISIONER_ANNOTATIONS = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)
#: Kubernetes' annotation on a dynamically provisioned PersistentVolume: who provisioned it (and deletes it).
PROVISIONED_BY_ANNOTATION = "pv.kubernetes.io/provisioned-by"
#: On the consumer's virtual PersistentVolume: the provider's claim it stands for (`<namespace>/<name>`)
#: and the provider's StorageClass it was bound with.
REMOTE_CLAIM_ANNOTATION = "gpufed.io/remote-claim"
REMOTE_STORAGE_CLASS_ANNOTATION = "gpufed.io/remote-storage-class"
#: The access modes Kubernetes knows.
ACCESS_MODES = frozenset({"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"})
#: The phases a claim can be in (Kubernetes' PersistentVolumeClaimPhase).
CLAIM_PHASES = frozenset({"Pending", "Bound", "Lost"})
#: The phase mirrored onto a virtual volume whose provider claim is gone (or is not this consumer's copy).
MISSING_PHASE = "Missing"
#: The largest volume size a provider's claim may report (bytes): a Kubernetes quantity's int64 range.
MAX_VOLUME_BYTES = Decimal(2**63 - 1)
#: At most this many characters of a value the provider reported are quoted in `VolumeMirror.ignored`.
_QUOTED = 80
#: At most this many offered classes are read from a grant.
MAX_OFFERS = 32
#: Annotation prefixes that are Kubernetes' bookkeeping of the local claim's binding: a copy would
#: tell the provider's controllers that its claim was provisioned or bound already.
_BINDING_PREFIXES = ("volume.kubernetes.io/", "volume.beta.kubernetes.io/", "pv.kubernetes.io/")


@dataclass(frozen=True)
class StorageOffer:
    """A StorageClass a provider offers the consumer's claims."""

    name: str
    default: bool = False
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)


class ClaimRefusedError(ValueError):
    """A claim the provider's offer cannot bind; the message is for the claim's owner."""

    def __init__(self, message: str, reason: str = "StorageNotOffered") -> None:
        super().__init__(message)
        self.reason = reason


def offers_from(raw: Any) -> tuple[StorageOffer, ...]:
    """The offered classes of a grant's `storageClasses` (wire form), checked: entries that are no
    object with a valid class name are dropped, and so are unknown access modes."""
    if not isinstance(raw, list):
        return ()
    out: dict[str, StorageOffer] = {}
    for entry in raw[:MAX_OFFERS]:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not is_dns_subdomain(name) or name in out:
            continue
        modes_raw = entry.get("accessModes")
        modes = tuple(
            sorted({m for m in modes_raw if isinstance(m, str) and m in ACCESS_MODES})
            if isinstance(modes_raw, list)
            else ()
        )
        out[name] = StorageOffer(name, entry.get("default") is True, modes or ("ReadWriteOnce",))
    return tuple(out.values())


def merge_offers(groups: Iterable[tuple[StorageOffer, ...]]) -> tuple[StorageOffer, ...]:
    """The classes of several grants of one provider: a class once, with the access modes any offers
    and marked default when any grant marks it so."""
    merged: dict[str, StorageOffer] = {}
    for offers in groups:
        for o in offers:
            have = merged.get(o.name)
            if have is None:
                merged[o.name] = o
            else:
                modes = tuple(sorted(set(have.access_modes) | set(o.access_modes)))
                merged[o.name] = StorageOffer(o.name, have.default or o.default, modes)
    return tuple(merged[n] for n in sorted(merged))


def storage_class(claim: Mapping[str, Any]) -> str:
    return str((claim.get("spec") or {}).get("storageClassName") or "")


def provisioner(claim: Mapping[str, Any]) -> str:
    """The external provisioner the consumer's kube-controller-manager handed the claim to ("" : none)."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return next((str(annotations[k]) for k in STORAGE_PROVISIONER_ANNOTATIONS if annotations.get(k)), "")


def selected_node(claim: Mapping[str, Any]) -> str:
    return str(((claim.get("metadata") or {}).get("annotations") or {}).get(SELECTED_NODE_ANNOTATION) or "")


def requested(claim: Mapping[str, Any]) -> str:
    """The claim's requested size as written (a quantity string; empty when none)."""
    return str((((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage") or "")


def access_modes(claim: Mapping[str, Any]) -> list[str]:
    return [str(m) for m in (claim.get("spec") or {}).get("accessModes") or []]


def choose_offer(claim: Mapping[str, Any], offers: tuple[StorageOffer, ...], provider: str) -> StorageOffer:
    """The offered class `claim` is bound with on `provider`; `ClaimRefusedError` when there is none."""
    if not offers:
        raise ClaimRefusedError(
            f"provider {provider} offers no storage to this cluster "
            "(peer with `gpufed peer --storage <size>`, and the provider must offer a StorageClass)"
        )
    names = ", ".join(o.name for o in offers)
    wanted = str(((claim.get("metadata") or {}).get("annotations") or {}).get(PROVIDER_STORAGE_CLASS_ANNOTATION) or "")
    if wanted:
        offer = next((o for o in offers if o.name == wanted), None)
        if offer is None:
            raise ClaimRefusedError(
                f"provider {provider} does not offer StorageClass {wanted!r} "
                f"(annotation {PROVIDER_STORAGE_CLASS_ANNOTATION}); it offers: {names}"
            )
    else:
        offer = next((o for o in offers if o.default), offers[0])
    modes = access_modes(claim) or ["ReadWriteOnce"]
    missing = [m for m in modes if m not in offer.access_modes]
    if missing:
        raise ClaimRefusedError(
            f"provider {provider} offers StorageClass {offer.name} with access modes "
            f"{', '.join(offer.access_modes)} only; the claim asks for {', '.join(missing)}",
            reason="AccessModeNotOffered",
        )
    if not requested(claim):
        raise ClaimRefusedError("the claim asks for no storage size (spec.resources.requests.storage)", "InvalidClaim")
    return offer


def remote_claim(claim: Mapping[str, Any], target: Target, offer: StorageOffer) -> dict[str, Any]:
    """The provider's copy of `claim` in `target.namespace`, bound with `offer`'s class."""
    local_meta = claim.get("metadata") or {}
    metadata = twin_metadata(claim, target, origin_labels(local_meta, target))
    metadata["annotations"] = {k: v for k, v in metadata["annotations"].items() if not k.startswith(_BINDING_PREFIXES)}
    spec = claim.get("spec") or {}
    out_spec: dict[str, Any] = {
        "accessModes": access_modes(claim) or ["ReadWriteOnce"],
        "resources": {"requests": {"storage": requested(claim)}},
        "storageClassName": offer.name,
    }
    if spec.get("volumeMode"):
        out_spec["volumeMode"] = str(spec["volumeMode"])
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": out_spec}


def volume_name(claim: Mapping[str, Any]) -> str:
    """The name of the consumer's virtual PersistentVolume for `claim` (one per claim UID)."""
    return f"gpufed-{(claim.get('metadata') or {}).get('uid', '')}"


def virtual_volume(
    claim: Mapping[str, Any], provider: str, remote_namespace: str, offer: StorageOffer, reclaim_policy: str
) -> dict[str, Any]:
    """The consumer's PersistentVolume for `claim`, bound on `provider` in `remote_namespace`."""
    meta = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": requested(claim)},
        "accessModes": access_modes(claim) or ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": reclaim_policy,
        "storageClassName": storage_class(claim),
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
        },
        # A source no kubelet mounts: only virtual nodes (the affinity) take pods of this volume.
        "csi": {"driver": STORAGE_PROVISIONER, "volumeHandle": f"{provider}/{remote_namespace}/{meta.get('name', '')}"},
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": REMOTE_CLUSTER_LABEL, "operator": "In", "values": [provider]}]}
                ]
            }
        },
    }
    if spec.get("volumeMode"):
        pv_spec["volumeMode"] = str(spec["volumeMode"])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "labels": {REMOTE_CLUSTER_LABEL: provider, MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {
                PROVISIONED_BY_ANNOTATION: STORAGE_PROVISIONER,
                REMOTE_CLAIM_ANNOTATION: f"{remote_namespace}/{meta.get('name', '')}",
                REMOTE_STORAGE_CLASS_ANNOTATION: offer.name,
            },
        },
        "spec": pv_spec,
    }


@dataclass(frozen=True)
class VolumeMirror:
    """What a virtual volume changes to mirror the provider's claim (`mirror_volume`)."""

    #: A JSON merge patch for the virtual volume; None when it mirrors the provider's claim already.
    patch: dict[str, Any] | None
    #: What the provider's claim reported that is not mirrored: (the field, `capacity`, `accessModes`
    #: or `phase`; what is wrong with it), for the log.
    ignored: tuple[tuple[str, str], ...] = ()


def _quoted(value: Any) -> str:
    return repr(value)[:_QUOTED]


def _mirrored_capacity(
    volume: Mapping[str, Any], remote: Mapping[str, Any], claim: Mapping[str, Any], ignored: list[tuple[str, str]]
) -> str | None:
    """The provider volume's size to write on `volume` (None: it shows it already, or it is ignored)."""
    raw = ((remote.get("status") or {}).get("capacity") or {}).get("storage")
    if raw is None:
        return None
    try:
        size = parse(raw)
    except QuantityError:
        ignored.append(("capacity", f"capacity {_quoted(raw)} is not a quantity"))
        return None
    try:
        floor = parse(requested(claim))
    except QuantityError:
        floor = Decimal(0)
    if size <= 0 or size > MAX_VOLUME_BYTES or size < floor:
        ignored.append(("capacity", f"capacity {_quoted(raw)} is out of range (the claim asks for {requested(claim)})"))
        return None
    try:
        have = parse((((volume.get("spec") or {}).get("capacity") or {}).get("storage")) or "0")
    except QuantityError:
        have = None
    return None if have == size else format_quantity(size, binary=True)


def _mirrored_access_modes(
    volume: Mapping[str, Any], remote: Mapping[str, Any], claim: Mapping[str, Any], ignored: list[tuple[str, str]]
) -> list[str] | None:
    """The provider volume's access modes (with every mode the consumer's claim asked) to write on
    `volume` (None: it shows them already, or they are ignored)."""
    raw = (remote.get("status") or {}).get("accessModes")
    if raw is None:
        return None
    if not isinstance(raw, list):
        ignored.append(("accessModes", f"access modes {_quoted(raw)} are not a list"))
        return None
    unknown = [m for m in raw if not isinstance(m, str) or m not in ACCESS_MODES]
    if unknown:
        ignored.append(("accessModes", f"access modes {_quoted(unknown)} are not Kubernetes access modes"))
    modes = set(access_modes(claim) or ["ReadWriteOnce"]) | {m for m in raw if isinstance(m, str) and m in ACCESS_MODES}
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        ignored.append(("accessModes", f"access modes {_quoted(raw)} mix ReadWriteOncePod with other modes"))
        modes = set(access_modes(claim) or ["ReadWriteOnce"])
    have = {str(m) for m in (volume.get("spec") or {}).get("accessModes") or []}
    return None if have == modes else sorted(modes)


def mirror_volume(
    volume: Mapping[str, Any], remote: Mapping[str, Any] | None, claim: Mapping[str, Any] | None
) -> VolumeMirror:
    """The merge patch that makes the virtual `volume` mirror `remote`, the provider's claim it stands
    for (None: gone, or not this consumer's copy), checked as untrusted input. `claim` is the
    consumer's claim the volume is bound to; without it only the phase is mirrored (the claim's
    request and access modes are the floor of what the volume may show)."""
    ignored: list[tuple[str, str]] = []
    patch: dict[str, Any] = {}
    if remote is None:
        phase: str | None = MISSING_PHASE
    else:
        raw_phase = (remote.get("status") or {}).get("phase") or "Pending"
        phase = raw_phase if isinstance(raw_phase, str) and raw_phase in CLAIM_PHASES else None
        if phase is None:
            ignored.append(("phase", f"phase {_quoted(raw_phase)} is not a claim phase"))
    if (
        phase is not None
        and ((volume.get("metadata") or {}).get("annotations") or {}).get(REMOTE_PHASE_ANNOTATION) != phase
    ):
        patch["metadata"] = {"annotations": {REMOTE_PHASE_ANNOTATION: phase}}
    if remote is not None and claim is not None and phase == "Bound":
        spec: dict[str, Any] = {}
        capacity = _mirrored_capacity(volume, remote, claim, ignored)
        if capacity is not None:
            spec["capacity"] = {"storage": capacity}
        modes = _mirrored_access_modes(volume, remote, claim, ignored)
        if modes is not None:
            spec["accessModes"] = modes
        if spec:
            patch["spec"] = spec
    return VolumeMirror(patch or None, tuple(ignored))


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The claims `pod` mounts (its `persistentVolumeClaim` volumes), sorted, each once; parts of the
    wrong type, and names no object can have, are skipped."""
    spec = pod.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    names = set()
    for volume in volumes if isinstance(volumes, list) else []:
        ref = volume.get("persistentVolumeClaim") if isinstance(volume, Mapping) else None
        name = ref.get("claimName") if isinstance(ref, Mapping) else None
        if isinstance(name, str) and is_dns_subdomain(name):  # the API server refuses any other
            names.add(name)
    return sorted(names)


def data_place(
    claim: Mapping[str, Any] | None, volume: Mapping[str, Any] | None, class_provisioner: str
) -> tuple[bool, str | None]:
    """Where a pod mounting `claim` must run: (False, None) when the claim does not decide it (absent,
    or of the virtual class and not bound yet: its first pod decides); (True, provider) when it is
    bound to a virtual volume of `provider`; (True, None) when its data is this cluster's own (bound
    to any other volume, or of another class, which only a local node can bind). `volume` is the
    bound volume, `class_provisioner` the provisioner of the claim's StorageClass ("" : none)."""
    if claim is None:
        return False, None
    if (claim.get("spec") or {}).get("volumeName"):
        if volume is None:
            return False, None
        provider = ((volume.get("metadata") or {}).get("labels") or {}).get(REMOTE_CLUSTER_LABEL)
        driver = ((volume.get("spec") or {}).get("csi") or {}).get("driver")
        return True, str(provider) if provider and driver == STORAGE_PROVISIONER else None
    if class_provisioner == STORAGE_PROVISIONER:
        return False, None
    return True, None


def remote_claim_ref(volume: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the provider's claim a virtual volume stands for (None: not one of ours)."""
    ref = str(((volume.get("metadata") or {}).get("annotations") or {}).get(REMOTE_CLAIM_ANNOTATION) or "")
    namespace, _, name = ref.partition("/")
    return (namespace, name) if namespace and name else None
