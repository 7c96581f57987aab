"""Claims of offloaded pods (vkprovider.forge.claims): what a provider's offer is read as, which class
a claim gets, and what the provider's claim and the consumer's virtual volume contain."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL, PROVIDER_STORAGE_CLASS_ANNOTATION
from vkprovider.forge.claims import (
    ClaimRefusedError,
    StorageOffer,
    choose_offer,
    merge_offers,
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
