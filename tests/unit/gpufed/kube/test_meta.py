"""Typed metadata accessors: values when present, the API's defaults when absent."""

from __future__ import annotations

from typing import Any

from gpufed.kube import meta

OBJ: dict[str, Any] = {
    "metadata": {
        "name": "n",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "42",
        "generation": 3,
        "labels": {"a": "1"},
        "annotations": {"b": "2"},
        "deletionTimestamp": "2026-01-02T03:04:05Z",
    }
}


def test_present_fields() -> None:
    assert (meta.name(OBJ), meta.namespace(OBJ), meta.uid(OBJ), meta.resource_version(OBJ)) == ("n", "ns", "u-1", "42")
    assert meta.generation(OBJ) == 3
    assert meta.labels(OBJ) == {"a": "1"} and meta.annotations(OBJ) == {"b": "2"}
    assert meta.deletion_timestamp(OBJ) == "2026-01-02T03:04:05Z" and meta.is_deleting(OBJ)


def test_absent_fields_and_objects() -> None:
    for obj in (None, {}, {"metadata": None}, {"metadata": {"labels": None, "deletionTimestamp": None}}):
        assert meta.metadata(obj) == {} or meta.metadata(obj) == {"labels": None, "deletionTimestamp": None}
        assert meta.name(obj) == meta.namespace(obj) == meta.uid(obj) == meta.resource_version(obj) == ""
        assert meta.labels(obj) == {} and meta.annotations(obj) == {}
        assert meta.deletion_timestamp(obj) is None and not meta.is_deleting(obj)
        assert meta.generation(obj) == 1 and meta.generation(obj, default=0) == 0
