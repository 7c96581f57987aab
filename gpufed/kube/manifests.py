"""Applying YAML manifests (CRDs, RBAC, namespaces) with server-side apply, like `kubectl apply --server-side`.

Owns: splitting multi-document YAML, finding each object's URL for the few kinds installers use,
applying them as field manager `gpufed`, and waiting until CRDs are Established. An unknown kind
is an error naming it (no discovery client: installers apply a known, small set).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gpufed.kube import rest
from gpufed.kube.client import KubeError

#: kind -> (plural, namespaced)
KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "ServiceAccount": ("serviceaccounts", True),
    "ConfigMap": ("configmaps", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
}


def load(files: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in files:
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d:
                    raise ValueError(f"{f}: a document without apiVersion/kind")
                docs.append(d)
    return docs


def object_path(obj: dict[str, Any]) -> str:
    kind = obj["kind"]
    if kind not in KINDS:
        raise ValueError(f"cannot apply kind {kind!r}: known kinds are {', '.join(sorted(KINDS))}")
    plural, namespaced = KINDS[kind]
    meta = obj.get("metadata") or {}
    return rest.path(obj["apiVersion"], plural, meta["name"], namespace=meta.get("namespace") if namespaced else None)


async def apply_all(api: Any, docs: Iterable[dict[str, Any]]) -> list[str]:
    """Apply every object (Namespaces first, CRDs next, the rest after); '<Kind>/<name>' of each."""
    order = {"Namespace": 0, "CustomResourceDefinition": 1}
    done = []
    for obj in sorted(docs, key=lambda d: order.get(d["kind"], 2)):
        await rest.apply(api, object_path(obj), obj, what=f"apply {obj['kind']} {obj['metadata']['name']}")
        done.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return done


async def wait_established(api: Any, names: Iterable[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            crd = await rest.get(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = ((crd or {}).get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise KubeError(f"CRD {name} not Established after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)
