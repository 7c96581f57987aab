"""Claims of offloaded pods (vkprovider.forge.claims): what a provider's offer is read as, which class
a claim gets, what the provider's claim and the consumer's virtual volume contain, and how the
virtual volume mirrors the provider's claim (checked: the provider is not trusted)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_UID_LABEL,
    PROVIDER_STORAGE_CLASS_ANNOTATION,
    REMOTE_PHASE_ANNOTATION,
)
from vkprovider.forge.claims import (
    ClaimRefusedError,
    StorageOffer,
    choose_offer,
    merge_offers,
    mirror_volume,
    offers_from,
    provisioner,
    remote_claim,
    remote_claim_ref,
    virtual_volume,
)
from vkprovider.forge.meta import Target

FAST = StorageOffer("fast", True, ("ReadWriteOnce",))
SHARED = StorageOffer("shared", False, ("ReadWriteMany", "ReadWriteOnce"))


def claim(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "data",
            "namespace": "team",
            "uid": "u-1",
            "labels": {"app": "train", ORIGIN_CLUSTER_LABEL: "forged"},
            "annotations": {
                "volume.kubernetes.io/selected-node": "gpufed-gpu-a",
                "volume.kubernetes.io/storage-provisioner": "storage.gpufed.io",
                "pv.kubernetes.io/bind-completed": "yes",
                "team.example/owner": "ana",
            },
        },
        "spec": {
            "storageClassName": "gpufed",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
            **spec,
        },
    }


def test_offers_from_a_provider_are_checked() -> None:
    raw = [
        {"name": "fast", "default": True, "accessModes": ["ReadWriteOnce", "Anything"]},
        {"name": "Not_A_Name"},
        {"name": "fast", "accessModes": ["ReadWriteMany"]},  # a second entry of one name is ignored
        "junk",
        {"name": "bare"},
    ]
    assert offers_from(raw) == (FAST, StorageOffer("bare", False, ("ReadWriteOnce",)))
    assert offers_from({"name": "x"}) == () and offers_from(None) == ()
    assert offers_from([{"name": f"c{i}"} for i in range(100)])[-1].name == "c31"  # bounded


def test_offers_of_several_grants_are_merged() -> None:
    merged = merge_offers([(StorageOffer("fast"),), (FAST, SHARED), (StorageOffer("fast", False, ("ReadOnlyMany",)),)])
    assert merged == (StorageOffer("fast", True, ("ReadOnlyMany", "ReadWriteOnce")), SHARED)


def test_a_claim_gets_the_default_or_the_class_it_names() -> None:
    assert choose_offer(claim(), (SHARED, FAST), "gpu-a") == FAST
    named = claim()
    named["metadata"]["annotations"][PROVIDER_STORAGE_CLASS_ANNOTATION] = "shared"
    assert choose_offer(named, (SHARED, FAST), "gpu-a") == SHARED
    assert choose_offer(claim(accessModes=["ReadWriteMany"]), (SHARED,), "gpu-a") == SHARED


@pytest.mark.parametrize(
    ("change", "offers", "reason", "words"),
    [
        ({}, (), "StorageNotOffered", "offers no storage"),
        ({"annotation": "gold"}, (FAST,), "StorageNotOffered", "does not offer StorageClass 'gold'"),
        ({"accessModes": ["ReadWriteMany"]}, (FAST,), "AccessModeNotOffered", "asks for ReadWriteMany"),
        ({"resources": {}}, (FAST,), "InvalidClaim", "no storage size"),
    ],
)
def test_a_claim_the_offer_cannot_bind_is_refused_with_its_reason(
    change: dict[str, Any], offers: tuple[StorageOffer, ...], reason: str, words: str
) -> None:
    c = claim(**{k: v for k, v in change.items() if k != "annotation"})
    if "annotation" in change:
        c["metadata"]["annotations"][PROVIDER_STORAGE_CLASS_ANNOTATION] = change["annotation"]
    with pytest.raises(ClaimRefusedError) as e:
        choose_offer(c, offers, "gpu-a")
    assert e.value.reason == reason and words in str(e.value), str(e.value)


def test_the_providers_claim_is_a_whitelist_of_the_local_one() -> None:
    c = claim(
        volumeName="someone-elses-pv",
        selector={"matchLabels": {"tenant": "other"}},
        dataSource={"kind": "PersistentVolumeClaim", "name": "other"},
        dataSourceRef={"kind": "PersistentVolumeClaim", "name": "other"},
        volumeMode="Filesystem",
    )
    remote = remote_claim(c, Target("consumer-1", "gpufed-gpu-a", "team-consumer-1", "gpu-a"), FAST)
    assert remote["metadata"]["namespace"] == "team-consumer-1" and remote["metadata"]["name"] == "data"
    # origin labels are the virtual kubelet's, never the consumer's own
    assert remote["metadata"]["labels"][ORIGIN_CLUSTER_LABEL] == "consumer-1"
    assert remote["metadata"]["labels"][ORIGIN_UID_LABEL] == "u-1"
    # the local claim's binding bookkeeping stays here
    assert remote["metadata"]["annotations"] == {"team.example/owner": "ana"}
    assert remote["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
        "storageClassName": "fast",
        "volumeMode": "Filesystem",
    }


def test_the_virtual_volume_pins_the_claims_pods_to_the_provider() -> None:
    pv = virtual_volume(claim(), "gpu-a", "team-consumer-1", FAST, "Delete")
    assert pv["metadata"]["name"] == "gpufed-u-1"
    assert pv["spec"]["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "team",
        "name": "data",
        "uid": "u-1",
    }
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "gpufed.io/remote-cluster-id", "operator": "In", "values": ["gpu-a"]}]}
    ]
    assert pv["spec"]["capacity"] == {"storage": "10Gi"} and pv["spec"]["storageClassName"] == "gpufed"
    assert pv["spec"]["csi"]["driver"] == "storage.gpufed.io"
    assert remote_claim_ref(pv) == ("team-consumer-1", "data")
    assert remote_claim_ref({"metadata": {}}) is None
    assert provisioner(claim()) == "storage.gpufed.io" and provisioner({"metadata": {}}) == ""


def provider_claim(phase: Any = "Bound", capacity: Any = "50Gi", modes: Any = ("ReadWriteOnce",)) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if capacity is not None:
        status["capacity"] = {"storage": capacity}
    if modes is not None:
        status["accessModes"] = list(modes) if isinstance(modes, tuple) else modes
    return {"metadata": {"name": "data", "namespace": "team-consumer-1"}, "spec": {}, "status": status}


def mirrored(pv: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """`pv` with a merge patch of `mirror_volume` applied (maps merged, lists replaced)."""
    out = {**pv, "metadata": {**pv["metadata"]}, "spec": {**pv["spec"]}}
    for part, changes in (patch or {}).items():
        for k, v in changes.items():
            out[part][k] = {**out[part].get(k, {}), **v} if isinstance(v, dict) else v
    return out


def test_the_virtual_volume_mirrors_the_providers_bound_volume() -> None:
    pv = virtual_volume(claim(), "gpu-a", "team-consumer-1", FAST, "Delete")
    m = mirror_volume(pv, provider_claim(modes=("ReadWriteMany", "ReadWriteOnce")), claim())
    assert m.ignored == ()
    assert m.patch == {
        "metadata": {"annotations": {REMOTE_PHASE_ANNOTATION: "Bound"}},
        "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"]},
    }
    # mirrored once: nothing more to change, whatever form the provider writes the same size in
    after = mirrored(pv, m.patch)
    assert mirror_volume(after, provider_claim(modes=("ReadWriteOnce", "ReadWriteMany")), claim()).patch is None
    assert mirror_volume(after, provider_claim(capacity="53687091200", modes=None), claim()).patch is None


def test_the_phase_alone_is_mirrored_until_the_providers_claim_is_bound() -> None:
    pv = virtual_volume(claim(), "gpu-a", "team-consumer-1", FAST, "Delete")
    phase = {"metadata": {"annotations": {REMOTE_PHASE_ANNOTATION: "Pending"}}}
    assert mirror_volume(pv, provider_claim(phase="Pending"), claim()).patch == phase
    assert mirror_volume(pv, provider_claim(phase=None, capacity=None, modes=None), claim()).patch == phase
    # gone, or not this consumer's copy
    assert mirror_volume(pv, None, claim()).patch == {"metadata": {"annotations": {REMOTE_PHASE_ANNOTATION: "Missing"}}}
    # without the consumer's claim at hand there is no floor to check a size against: phase only
    assert mirror_volume(pv, provider_claim(), None).patch == {
        "metadata": {"annotations": {REMOTE_PHASE_ANNOTATION: "Bound"}}
    }


def test_access_modes_never_drop_below_what_the_claim_asked() -> None:
    pv = virtual_volume(claim(), "gpu-a", "team-consumer-1", FAST, "Delete")
    m = mirror_volume(pv, provider_claim(capacity="10Gi", modes=("ReadOnlyMany",)), claim())
    assert m.patch is not None and m.patch["spec"] == {"accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}
    # a volume that shows more than the provider now reports goes back to it, never below the claim
    wide = mirrored(pv, {"spec": {"accessModes": ["ReadWriteMany", "ReadWriteOnce"]}})
    m = mirror_volume(wide, provider_claim(capacity="10Gi", modes=()), claim())
    assert m.patch is not None and m.patch["spec"] == {"accessModes": ["ReadWriteOnce"]}


@pytest.mark.parametrize(
    ("capacity", "modes", "phase", "field", "words"),
    [
        ("lots", None, "Bound", "capacity", ["capacity 'lots' is not a quantity"]),
        (12.5, None, "Bound", "capacity", ["capacity 12.5 is not a quantity"]),
        ({"storage": "1Gi"}, None, "Bound", "capacity", ["is not a quantity"]),
        ("5Gi", None, "Bound", "capacity", ["capacity '5Gi' is out of range (the claim asks for 10Gi)"]),
        ("-50Gi", None, "Bound", "capacity", ["out of range"]),
        ("0", None, "Bound", "capacity", ["out of range"]),
        ("1e40", None, "Bound", "capacity", ["out of range"]),
        ("1e999999999", None, "Bound", "capacity", ["not a quantity"]),
        (None, "ReadWriteOnce", "Bound", "accessModes", ["are not a list"]),
        (
            None,
            ["ReadWriteOnce", "Everything", 7],
            "Bound",
            "accessModes",
            ["['Everything', 7] are not Kubernetes access modes"],
        ),
        (None, ["ReadWriteOncePod"], "Bound", "accessModes", ["mix ReadWriteOncePod with other modes"]),
        (None, None, "Sideways", "phase", ["phase 'Sideways' is not a claim phase"]),
        (None, None, ["Bound"], "phase", ["is not a claim phase"]),
        ("x" * 500, None, "Bound", "capacity", ["x" * 40]),
    ],
)
def test_what_the_provider_reports_wrongly_is_ignored_and_said(
    capacity: Any, modes: Any, phase: Any, field: str, words: list[str]
) -> None:
    pv = virtual_volume(claim(), "gpu-a", "team-consumer-1", FAST, "Delete")
    pv["metadata"]["annotations"][REMOTE_PHASE_ANNOTATION] = "Bound"
    m = mirror_volume(pv, provider_claim(phase, capacity, modes), claim())
    assert m.patch is None, m.patch  # nothing of it reaches the consumer's volume
    assert len(m.ignored) == 1 and all(w in m.ignored[0][1] for w in words), m.ignored
    assert m.ignored[0][0] == field
    assert len(m.ignored[0][1]) < 200  # the provider's words are quoted short


def test_an_unknown_mode_beside_known_ones_still_mirrors_the_known_ones() -> None:
    pv = virtual_volume(claim(), "gpu-a", "team-consumer-1", FAST, "Delete")
    m = mirror_volume(pv, provider_claim(modes=["ReadWriteMany", "Teleport"]), claim())
    assert m.patch is not None and m.patch["spec"]["accessModes"] == ["ReadWriteMany", "ReadWriteOnce"]
    assert m.patch["spec"]["capacity"] == {"storage": "50Gi"}
    assert m.ignored == (("accessModes", "access modes ['Teleport'] are not Kubernetes access modes"),)
