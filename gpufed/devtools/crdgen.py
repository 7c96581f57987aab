"""`python -m gpufed.devtools.crdgen [DIR]`: gpufed's CustomResourceDefinitions, generated from the models.

Owns: turning each kind of `gpufed.apis.kinds.KINDS` into a CRD (`crd`): pydantic's JSON schema
made structural (references inlined, optionals collapsed, every node typed), resource maps held to
the quantity pattern and the known resource names, the kind's CEL rules, `kubectl get` columns, the
category `gpufed` (so `kubectl get gpufed` lists every kind) and the status subresource;
`crd_manifests` renders them as YAML with a header naming this command, and `main` writes them to
DIR (default deploy/crds). A unit test fails when the files drift from the models; the Helm chart
carries exact copies in deploy/charts/gpufed/crds/ (also checked by a test).

Does not: define the kinds (`gpufed.apis`), install CRDs, or document them (`gpufed.devtools.crdref`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from gpufed.apis.kinds import KINDS, CRDKind
from gpufed.apis.meta import GROUP, QUANTITY_PATTERN, VERSION
from gpufed.apis.peering import GRANT_RESOURCES

DEFAULT_DIR = Path("deploy/crds")
COMMAND = "python -m gpufed.devtools.crdgen deploy/crds"
#: `kubectl get gpufed` lists the objects of every gpufed kind.
CATEGORIES = ("gpufed",)
HEADER = f"# Generated from gpufed/apis/ by `{COMMAND}`; do not edit.\n"


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn pydantic's JSON schema into a Kubernetes structural schema: refs inlined, Optional
    collapsed, titles and defaults dropped, every node typed."""
    if "$ref" in schema:
        return _structural(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {schema}")
        merged = _structural(options[0], defs)
        if "description" in schema:
            merged["description"] = schema["description"]
        return merged
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "default", "$defs"):
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas forbid it beside `properties`; the apiserver prunes instead
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _quantity_maps(schema: dict[str, Any]) -> None:
    """Resource maps hold quantities: forbid other keys and enforce the quantity pattern."""
    for name, prop in schema.get("properties", {}).items():
        if name in ("resources", "granted", "used", "maxResources"):
            prop["additionalProperties"] = {"type": "string", "pattern": QUANTITY_PATTERN}
            if name in ("resources", "maxResources"):
                prop["x-kubernetes-validations"] = [
                    {
                        "rule": "self.all(k, k in " + str(list(GRANT_RESOURCES)).replace("'", '"') + ")",
                        "message": "resources may only be " + ", ".join(GRANT_RESOURCES),
                    }
                ]
        elif prop.get("type") == "object":
            _quantity_maps(prop)


def crd(model: CRDKind) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    defs = raw.get("$defs", {})
    props = {k: _structural(v, defs) for k, v in raw["properties"].items() if k in ("spec", "status")}
    for p in props.values():
        _quantity_maps(p)
    schema = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **props,
        },
        "required": ["spec"],
    }
    validations: list[dict[str, str]] = getattr(model, "root_validations", [])
    if validations:
        schema["x-kubernetes-validations"] = validations
    names: dict[str, Any] = {
        "kind": model.kind,
        "listKind": f"{model.kind}List",
        "plural": model.plural,
        "singular": model.kind.lower(),
    }
    if model.short_names:
        names["shortNames"] = model.short_names
    names["categories"] = list(CATEGORIES)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{model.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": model.scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p} for n, t, p in model.columns],
                }
            ],
        },
    }


def crd_manifests() -> dict[str, str]:
    """File name -> YAML text for every CRD."""
    return {f"{GROUP}_{m.plural}.yaml": HEADER + yaml.safe_dump(crd(m), sort_keys=False) for m in KINDS}


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m gpufed.devtools.crdgen [OUT_DIR]", file=sys.stderr)
        return 2
    out = Path(argv[0]) if argv else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, text in crd_manifests().items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
