"""Twin metadata forge: origin labels, the metadata whitelist, the annotation filter, ownership."""

from __future__ import annotations

import copy
from typing import Any

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL
from vkprovider.forge.meta import (
    LAST_APPLIED_ANNOTATION,
    Target,
    is_dns_label,
    is_dns_subdomain,
    origin_labels,
    owned_by,
    twin_annotations,
    twin_metadata,
)

CONSUMER = "consumer-1a2b3c4d"
TARGET = Target(consumer=CONSUMER, node="gpufed-gpu-a", namespace="team-consumer-1a2b3c4d")


def local() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "app",
            "generateName": "app-",
            "namespace": "team",
            "uid": "u-1",
            "resourceVersion": "9",
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {"app": "x"},
            "annotations": {LAST_APPLIED_ANNOTATION: "{}", "gpufed.io/offloaded-by": "webhook", "note": "keep"},
            "ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "d1"}],
            "finalizers": ["example.com/f"],
            "managedFields": [{"manager": "m"}],
        }
    }


def test_origin_labels_name_the_consumer_and_the_local_uid() -> None:
    assert origin_labels({"uid": "u-1"}, TARGET) == {
        ORIGIN_CLUSTER_LABEL: CONSUMER,
        ORIGIN_UID_LABEL: "u-1",
        MANAGED_BY_LABEL: MANAGED_BY,
    }
    assert origin_labels({}, TARGET)[ORIGIN_UID_LABEL] == ""


def test_twin_metadata_is_a_whitelist_in_the_twin_namespace() -> None:
    obj = local()
    before = copy.deepcopy(obj)
    meta = twin_metadata(obj, TARGET, origin_labels(obj["metadata"], TARGET))
    assert meta == {
        "name": "app",
        "namespace": TARGET.namespace,
        "labels": {"app": "x", **origin_labels(obj["metadata"], TARGET)},
        "annotations": {"note": "keep"},
    }
    assert obj == before


def test_twin_metadata_extra_labels_win_over_local_ones() -> None:
    obj = local()
    obj["metadata"]["labels"][ORIGIN_CLUSTER_LABEL] = "someone-else"
    labels = twin_metadata(obj, TARGET, origin_labels(obj["metadata"], TARGET))["labels"]
    assert labels[ORIGIN_CLUSTER_LABEL] == CONSUMER


def test_twin_annotations_drop_last_applied_and_optionally_gpufed_ones() -> None:
    meta = local()["metadata"]
    assert twin_annotations(meta, drop_gpufed=True) == {"note": "keep"}
    assert twin_annotations(meta, drop_gpufed=False) == {"gpufed.io/offloaded-by": "webhook", "note": "keep"}
    assert twin_annotations({}, drop_gpufed=True) == {}


def test_owned_by_checks_consumer_and_uid() -> None:
    twin = {"metadata": {"labels": origin_labels({"uid": "u-1"}, TARGET)}}
    assert owned_by(twin, CONSUMER)
    assert owned_by(twin, CONSUMER, "u-1")
    assert not owned_by(twin, CONSUMER, "u-2")
    assert not owned_by(twin, "consumer-ffffffff")
    assert not owned_by({"metadata": {"name": "x"}}, CONSUMER)
    assert not owned_by({}, CONSUMER)


def test_kubernetes_name_rules() -> None:
    assert is_dns_subdomain("db-password") and is_dns_subdomain("kube-root-ca.crt")
    assert is_dns_label("team-consumer-1a2b3c4d") and not is_dns_label("a.b")
    for bad in ("", ".", "..", "../../gpufed/secrets/x", "a/b", "A", "a-", "abc\n", "a" * 254):
        assert not is_dns_subdomain(bad), bad
    assert not is_dns_label("a" * 64)
