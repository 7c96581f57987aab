"""CRD models: validation, structural schemas, and no drift between models and deploy/crds."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpufed.apis import models
from gpufed.apis.models import ResourceSlice, Tenant
from tests.paths import REPO

CRD_DIR = REPO / "deploy" / "crds"


def test_generated_crds_match_the_files() -> None:
    generated = models.crd_manifests()
    on_disk = {p.name: p.read_text() for p in CRD_DIR.glob("*.yaml")}
    assert set(on_disk) == set(generated), "run `python -m gpufed.apis.models deploy/crds`"
    for name, text in generated.items():
        assert on_disk[name] == text, (
            f"{name} drifted from gpufed/apis/models.py: run `python -m gpufed.apis.models deploy/crds`"
        )


def _walk(node: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(node, dict):
        out.append(node)
        for v in node.values():
            out += _walk(v)
    elif isinstance(node, list):
        for v in node:
            out += _walk(v)
    return out


@pytest.mark.parametrize("kind", models.KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: type[ResourceSlice]) -> None:
    schema = models.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, json.dumps(node)[:200]
        if "properties" in node:
            assert "additionalProperties" not in node
            assert node.get("type") == "object"
    assert "spec" in schema["properties"]
    assert ("status" in schema["properties"]) == ("status" in kind.model_fields)


def test_printer_columns_and_status_subresource() -> None:
    crd = models.crd(ResourceSlice)
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Provider", "GPUs", "Granted GPUs"]
    assert crd["spec"]["scope"] == "Namespaced" and models.crd(Tenant)["spec"]["scope"] == "Cluster"


def test_resource_slice_validation() -> None:
    ok = ResourceSlice.model_validate(
        {"spec": {"providerClusterId": "gpu-a-1", "resources": {"nvidia.com/gpu": "8"}, "gpuProduct": "NVIDIA-L4"}}
    )
    assert ok.spec.resources["nvidia.com/gpu"] == "8"
    with pytest.raises(ValueError, match="must not be negative"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "p", "resources": {"nvidia.com/gpu": "-1"}}})
    with pytest.raises(ValueError, match="unknown resource"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "p", "resources": {"ephemeral-storage": "1"}}})
    with pytest.raises(ValueError, match="not a quantity"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "p", "resources": {"cpu": "lots"}}})
    with pytest.raises(ValueError, match="pattern"):
        ResourceSlice.model_validate({"spec": {"providerClusterId": "Bad_ID", "resources": {"cpu": "1"}}})


def test_crd_files_are_valid_yaml_with_the_header() -> None:
    for p in CRD_DIR.glob("*.yaml"):
        assert p.read_text().startswith("# Generated from gpufed/apis/models.py")
        assert yaml.safe_load(p.read_text())["kind"] == "CustomResourceDefinition"


def test_objects_written_by_a_newer_version_are_read() -> None:
    """Version skew: a field added by the next version (in spec or status) is ignored, not an error."""
    newer = {
        "spec": {"clusterId": "gpu-a-1234abcd", "roles": ["Provider"], "fieldFromTheFuture": {"x": 1}},
        "status": {"phase": "Peered", "anotherNewField": True},
    }
    fc = models.ForeignCluster.model_validate(newer)
    assert fc.spec.cluster_id == "gpu-a-1234abcd"
    assert "fieldFromTheFuture" not in fc.model_dump(by_alias=True)["spec"]
