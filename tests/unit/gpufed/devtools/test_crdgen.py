"""The CRD generator: structural schemas, printer columns, the header, and no drift between the
models and deploy/crds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.apis.kinds import KINDS, CRDKind
from gpufed.apis.meta import QUANTITY_PATTERN
from gpufed.apis.peering import ResourceSlice, Tenant
from gpufed.devtools import crdgen
from tests.paths import REPO

CRD_DIR = REPO / crdgen.DEFAULT_DIR


def test_generated_crds_match_the_files() -> None:
    generated = crdgen.crd_manifests()
    on_disk = {p.name: p.read_text() for p in CRD_DIR.glob("*.yaml")}
    assert set(on_disk) == set(generated), f"run `{crdgen.COMMAND}`"
    for name, text in generated.items():
        assert on_disk[name] == text, f"{name} drifted from gpufed/apis/: run `{crdgen.COMMAND}`"


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


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: CRDKind) -> None:
    schema = crdgen.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, json.dumps(node)[:200]
        if "properties" in node:
            assert "additionalProperties" not in node
            assert node.get("type") == "object"
    assert "spec" in schema["properties"]
    assert ("status" in schema["properties"]) == ("status" in kind.model_fields)


def test_printer_columns_and_status_subresource() -> None:
    crd = crdgen.crd(ResourceSlice)
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Provider", "GPUs", "Granted GPUs"]
    assert crd["spec"]["scope"] == "Namespaced" and crdgen.crd(Tenant)["spec"]["scope"] == "Cluster"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_kind_is_in_the_gpufed_category(kind: CRDKind) -> None:
    """`kubectl get gpufed` lists every kind."""
    assert crdgen.crd(kind)["spec"]["names"]["categories"] == ["gpufed"]


def test_crd_files_are_valid_yaml_with_the_header() -> None:
    for p in CRD_DIR.glob("*.yaml"):
        assert p.read_text().startswith(crdgen.HEADER)
        assert f"`{crdgen.COMMAND}`" in crdgen.HEADER
        assert yaml.safe_load(p.read_text())["kind"] == "CustomResourceDefinition"


def test_resource_maps_hold_quantities_of_known_resources() -> None:
    schema = crdgen.crd(ResourceSlice)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    resources = schema["properties"]["spec"]["properties"]["resources"]
    assert resources["additionalProperties"]["pattern"] == QUANTITY_PATTERN
    assert "nvidia.com/gpu" in resources["x-kubernetes-validations"][0]["rule"]


def test_main_writes_one_file_per_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main([str(tmp_path / "out")]) == 0
    written = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.yaml")}
    assert written == crdgen.crd_manifests()
    assert capsys.readouterr().out.count("wrote ") == len(KINDS)
    assert crdgen.main(["a", "b"]) == 2


#: Short names kubectl already knows: the built-in kinds', and those of widespread add-ons (Istio's
#: Gateway `gw`, the Gateway API's `gtw`, Capsule's Tenant `tnt`, cert-manager's, Argo's, Prometheus
#: Operator's): a gpufed kind taking one would make `kubectl get <short>` ambiguous.
_TAKEN = (
    "cs cm ds deploy ep ev hpa ing limits netpol no ns pdb po psp pv pvc quota rc rs sa sc svc sts csr crd crds "
    "pc ipaddr gw gtw tnt vs dr se cert certs cr crs iss ciss app apps appproj prom am smon pmon rules "
    "ks ksvc rev route"
)
TAKEN_SHORT_NAMES = frozenset(_TAKEN.split())


def test_every_kind_has_short_names_of_its_own() -> None:
    names = [n for kind in KINDS for n in crdgen.crd(kind)["spec"]["names"]["shortNames"]]
    assert all(crdgen.crd(kind)["spec"]["names"].get("shortNames") for kind in KINDS)
    assert len(names) == len(set(names)), names
    assert not set(names) & TAKEN_SHORT_NAMES


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_kind_shows_its_age_and_its_ready_condition(kind: CRDKind) -> None:
    version = crdgen.crd(kind)["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_conditions_are_a_map_list_keyed_by_type(kind: CRDKind) -> None:
    """Every kind reports a Ready condition; server-side apply merges conditions per type, so `type`
    must be required."""
    schema = crdgen.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]
    assert "observedGeneration" in conditions["items"]["properties"]
    assert "Ready" in conditions["description"]
