"""`python -m gpufed.devtools.crdref [PATH]`: the CRD reference, generated from deploy/crds/.

Owns: reading gpufed's CustomResourceDefinitions (`deploy/crds/*.yaml`, themselves generated from
the models in `gpufed.apis` by `gpufed.devtools.crdgen`), flattening each served version's OpenAPI
schema into one row per field of `spec`, `status` and any other top-level property (`fields`), and
rendering group, version, kind, scope, names, `kubectl get` columns, the field tables (with what
the API server checks, map lists' keys included) and the CEL validation rules as Markdown
(`render`); `main` writes it to docs/reference/crds.md (or PATH). A unit test
(tests/unit/gpufed/devtools/test_refdoc.py) fails when the committed file differs from `render()`.

Invariants: the output depends only on the YAML files: kinds sorted by name, fields in schema order.

Does not: define or change the CRDs (`python -m gpufed.devtools.crdgen deploy/crds` does), or install them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufed.devtools.gendoc import write_page

CRD_DIR = Path("deploy/crds")
DEFAULT_PATH = Path("docs/reference/crds.md")
REGENERATE = ".venv/bin/python -m gpufed.devtools.crdref"
#: Top-level properties every object has; documented by Kubernetes, not here.
STANDARD = ("apiVersion", "kind", "metadata")
#: gpufed's kinds whose name another widespread kind shares (Kubernetes' own or an add-on's): that
#: other kind, and what a bare `kubectl get <plural>` lists where both are served. The "Naming"
#: section says how to address each, and why the kind stays.
SHARED_KIND_NAMES: dict[str, tuple[str, str]] = {
    "ResourceSlice": (
        "DRA's `ResourceSlice` (`resource.k8s.io`, built in: every cluster from Kubernetes 1.34 serves it)",
        "DRA's (a built-in group always wins)",
    ),
    "Gateway": (
        "the Gateway API's `Gateway` (`gateway.networking.k8s.io`, short name `gtw`) and Istio's"
        " (`networking.istio.io`, `gw`)",
        "whichever group discovery lists first",
    ),
    "Tenant": ("Capsule's `Tenant` (`capsule.clastix.io`, `tnt`)", "whichever group discovery lists first"),
}


@dataclass(frozen=True)
class FieldDoc:
    #: Dotted path from the object's root: `spec.resources`, `status.conditions[].reason`.
    path: str
    type: str
    required: bool
    description: str
    #: enum, pattern, bounds, format — what the API server checks besides the type.
    validation: str


@dataclass(frozen=True)
class RuleDoc:
    path: str
    rule: str
    message: str


@dataclass(frozen=True)
class VersionDoc:
    name: str
    served: bool
    storage: bool
    subresources: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (name, jsonPath)
    fields: tuple[FieldDoc, ...]
    rules: tuple[RuleDoc, ...]


@dataclass(frozen=True)
class CrdDoc:
    name: str
    group: str
    kind: str
    plural: str
    singular: str
    scope: str
    short_names: tuple[str, ...]
    description: str
    versions: tuple[VersionDoc, ...]
    source: str


def _type(schema: dict[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    t = schema.get("type")
    if t == "array":
        return "[]" + _type(schema.get("items", {}))
    if t == "object" and "additionalProperties" in schema and "properties" not in schema:
        extra = schema["additionalProperties"]
        return "map[string]" + (_type(extra) if isinstance(extra, dict) else "any")
    if t is None:
        return "any"
    fmt = schema.get("format")
    return f"{t} ({fmt})" if fmt else str(t)


def _validation(schema: dict[str, Any]) -> str:
    parts: list[str] = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    for key, word in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("minProperties", "entries ≥"),
        ("maxProperties", "entries ≤"),
    ):
        if key in schema:
            parts.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(f"`{k}`" for k in schema.get("x-kubernetes-list-map-keys", []))
        parts.append(f"one entry per {keys} (map list)")
    if "default" in schema:
        parts.append(f"default `{schema['default']}`")
    return "; ".join(parts)


def _walk(schema: dict[str, Any], path: str, required: bool, fields: list[FieldDoc], rules: list[RuleDoc]) -> None:
    validation = _validation(schema)
    # A map's or list's values are validated on the elements: say so on the field itself.
    inner = schema.get("items") if schema.get("type") == "array" else schema.get("additionalProperties")
    if isinstance(inner, dict) and (inner_validation := _validation(inner)):
        validation = "; ".join(v for v in (validation, f"each value: {inner_validation}") if v)
    fields.append(FieldDoc(path, _type(schema), required, " ".join(schema.get("description", "").split()), validation))
    for r in schema.get("x-kubernetes-validations", []):
        rules.append(RuleDoc(path, " ".join(r["rule"].split()), " ".join(r.get("message", "").split())))
    _children(schema, path, fields, rules)


def _children(schema: dict[str, Any], path: str, fields: list[FieldDoc], rules: list[RuleDoc]) -> None:
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for r in items.get("x-kubernetes-validations", []):
            rules.append(RuleDoc(path + "[]", " ".join(r["rule"].split()), " ".join(r.get("message", "").split())))
        _children(items, path + "[]", fields, rules)
        return
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:
        _children(extra, path + ".*", fields, rules)
    required = set(schema.get("required", []))
    for name, sub in schema.get("properties", {}).items():
        _walk(sub, f"{path}.{name}" if path else name, name in required, fields, rules)


def _version(v: dict[str, Any]) -> VersionDoc:
    root = v.get("schema", {}).get("openAPIV3Schema", {})
    fields: list[FieldDoc] = []
    rules: list[RuleDoc] = [
        RuleDoc("(object)", " ".join(r["rule"].split()), " ".join(r.get("message", "").split()))
        for r in root.get("x-kubernetes-validations", [])
    ]
    required = set(root.get("required", []))
    for name, sub in root.get("properties", {}).items():
        if name not in STANDARD:
            _walk(sub, name, name in required, fields, rules)
    return VersionDoc(
        name=v["name"],
        served=bool(v.get("served")),
        storage=bool(v.get("storage")),
        subresources=tuple(sorted(v.get("subresources", {}))),
        columns=tuple((c["name"], c["jsonPath"]) for c in v.get("additionalPrinterColumns", [])),
        fields=tuple(fields),
        rules=tuple(rules),
    )


def crds(directory: Path = CRD_DIR) -> list[CrdDoc]:
    """Every CRD in `directory`, sorted by kind."""
    out: list[CrdDoc] = []
    for path in sorted(directory.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        names = spec["names"]
        versions = spec["versions"]
        root = versions[0].get("schema", {}).get("openAPIV3Schema", {}) if versions else {}
        out.append(
            CrdDoc(
                name=doc["metadata"]["name"],
                group=spec["group"],
                kind=names["kind"],
                plural=names["plural"],
                singular=names.get("singular", ""),
                scope=spec["scope"],
                short_names=tuple(names.get("shortNames", [])),
                description=" ".join(root.get("description", "").split()),
                versions=tuple(_version(v) for v in versions),
                source=(CRD_DIR / path.name).as_posix(),
            )
        )
    return sorted(out, key=lambda c: c.kind)


def _md(text: str) -> str:
    """Text as Markdown shows it literally (code spans left alone), fit for a table cell."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|")


def _naming(docs: list[CrdDoc]) -> list[str]:
    """The "Naming" section: the kinds in SHARED_KIND_NAMES, why they keep their name, how to address them."""
    shared = [c for c in docs if c.kind in SHARED_KIND_NAMES]
    if not shared:
        return []
    lines = [
        "",
        "## Naming",
        "",
        "Some of gpufed's kinds share their name with a kind that Kubernetes itself or a widespread add-on"
        " serves (below). They keep it: gpufed's objects are stored under these kinds, and the names on the wire"
        " (group, kind, plural) stay stable, so no stored object needs a migration and no client changes. Address"
        " them by the qualified plural or by the short name, which is gpufed's alone: a bare plural (`kubectl get"
        " resourceslices`) resolves to one group only, without a word about the other. ResourceSlice and Gateway"
        " are named with their group in every command, message, Event, condition and page of gpufed that names"
        " them: `ResourceSlice.gpufed.io gpufed/<provider-id>`, `kubectl get resourceslices.gpufed.io`.",
        "",
        "| gpufed's kind | shares its name with | address gpufed's | `kubectl get <plural>` alone |",
        "|---|---|---|---|",
    ]
    for c in shared:
        other, bare = SHARED_KIND_NAMES[c.kind]
        short = "".join(f" / `kubectl get {s}`" for s in c.short_names)
        lines.append(f"| {c.kind} | {other} | `kubectl get {c.plural}.{c.group}`{short} | {bare} |")
    lines += [
        "",
        "gpufed's ResourceSlice is the negotiation: a consumer's request for resources on one provider and the"
        " provider's decision ([peering](../peering.md#grants)). DRA's ResourceSlices are a different thing: the"
        " devices a DRA driver publishes for a node, which the scheduler allocates to ResourceClaims; those"
        " gpufed publishes on the consumer for its virtual nodes (driver `gpu.gpufed.io`) are DRA's kind too,"
        " listed by `kubectl get resourceslices`, never by `rslice`. gpufed's Gateway is one peering's WireGuard"
        " tunnel ([networking](../networking.md#the-parts)), not a traffic gateway; its Tenant is a consumer"
        " on a provider ([peering](../peering.md#what-the-consumer-may-do-on-the-provider)).",
    ]
    return lines


def render(directory: Path = CRD_DIR) -> str:
    docs = crds(directory)
    lines = [
        "# CRD reference",
        "",
        f"<!-- Generated by `{REGENERATE}` from deploy/crds/*.yaml: do not edit."
        " A unit test (tests/unit/gpufed/devtools/test_refdoc.py) fails when this file and the CRDs disagree. -->",
        "",
        "gpufed's CustomResourceDefinitions, as the API server enforces them. The CRDs are generated"
        " from the models in `gpufed/apis/` (`python -m gpufed.devtools.crdgen deploy/crds`); the Helm chart ships the"
        " same files in `deploy/charts/gpufed/crds/`. `apiVersion`, `kind` and `metadata` are"
        " Kubernetes' own and not repeated below. `[]` in a path is every element of a list.",
        "",
        "Every kind is in the category `gpufed` (`kubectl get gpufed -A` lists them all, with their age). Every"
        " kind with conditions has a `Ready` one (`kubectl wait --for=condition=Ready <kind>/<name>`); its"
        " `status.conditions` field says when it is True. Conditions are a map list keyed by `type`, and each"
        " carries the `observedGeneration` of the spec the controller acted on: a condition whose"
        " observedGeneration is below `metadata.generation` describes an older spec.",
        "",
        "| kind | API version | scope | short names | plural |",
        "|---|---|---|---|---|",
    ]
    for c in docs:
        served = ", ".join(f"{c.group}/{v.name}" for v in c.versions if v.served)
        short = ", ".join(f"`{s}`" for s in c.short_names) or "—"
        lines.append(f"| [{c.kind}](#{c.kind.lower()}) | `{served}` | {c.scope} | {short} | `{c.plural}` |")
    lines += _naming(docs)
    for c in docs:
        lines += ["", f"## {c.kind}", ""]
        if c.description:
            lines += [_md(c.description), ""]
        lines += [
            "| | |",
            "|---|---|",
            f"| name | `{c.name}` |",
            f"| group | `{c.group}` |",
            f"| kind | `{c.kind}` |",
            f"| plural / singular | `{c.plural}` / `{c.singular}` |",
            f"| scope | {c.scope} |",
            f"| short names | {', '.join(f'`{s}`' for s in c.short_names) or '—'} |",
            f"| file | `{c.source}` |",
        ]
        for v in c.versions:
            flags = [w for w, on in (("served", v.served), ("storage", v.storage)) if on]
            lines += ["", f"### {c.kind} `{c.group}/{v.name}`", ""]
            lines.append(f"Version `{v.name}`: {', '.join(flags) or 'not served'}.")
            if v.subresources:
                lines[-1] += " Subresources: " + ", ".join(f"`{s}`" for s in v.subresources) + "."
            if v.columns:
                cols = ", ".join(f"{_md(n)} (`{_md(p)}`)" for n, p in v.columns)
                lines[-1] += f" `kubectl get` columns: {cols}."
            if v.fields:
                lines += ["", "| field | type | required | description | validation |", "|---|---|---|---|---|"]
                for f in v.fields:
                    lines.append(
                        f"| `{f.path}` | {_md(f.type)} | {'yes' if f.required else ''} | {_md(f.description)}"
                        f" | {_md(f.validation)} |"
                    )
            if v.rules:
                lines += ["", "Validation rules (CEL, checked by the API server):", ""]
                lines += ["| on | rule | message |", "|---|---|---|"]
                for r in v.rules:
                    lines.append(f"| `{r.path}` | `{_md(r.rule)}` | {_md(r.message)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    write_page(argv, DEFAULT_PATH, render, f"{len(crds())} CRDs")


if __name__ == "__main__":
    main()
