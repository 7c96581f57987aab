"""gpufed's CRDs on a real apiserver: accepted as structural, valid objects stored and printed,
invalid ones refused by the OpenAPI schema and CEL rules with messages a human understands; the
names kubectl resolves where a gpufed kind shares its name with a built-in one (docs/reference/crds.md,
"Naming")."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.e2e.conftest import REPO, Clusters

CRDS = REPO / "deploy" / "crds"
#: The collection path of a list request in kubectl's `-v=6` log: group and plural.
_LIST_URL = re.compile(r"/apis/([^/\s\"]+)/[^/\s\"]+/(?:namespaces/[^/\s\"]+/)?([a-z]+)\b")


def test_crds_install_and_validate(clusters: Clusters, namespace: str, tmp_path: Path) -> None:
    ctx = "consumer"
    clusters.kubectl(ctx, "apply", "--server-side", "--field-manager=gpufed", "-f", str(CRDS))
    clusters.kubectl(
        ctx,
        "wait",
        "--for=condition=Established",
        "crd/resourceslices.gpufed.io",
        "crd/foreignclusters.gpufed.io",
        "crd/tenants.gpufed.io",
        "--timeout=30s",
        timeout=40,
    )

    clusters.create(
        ctx,
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "ResourceSlice",
            "metadata": {"name": "gpu-a", "namespace": namespace},
            "spec": {
                "providerClusterId": "gpu-a-1234abcd",
                "gpuProduct": "NVIDIA-H100-80GB-HBM3",
                "resources": {"nvidia.com/gpu": "16", "cpu": "32", "memory": "256Gi"},
            },
        },
    )
    table = clusters.kubectl(ctx, "get", "rslice", "-n", namespace).stdout
    assert "PROVIDER" in table and "gpu-a-1234abcd" in table and " 16 " in table

    bad = clusters.create(
        ctx,
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "ResourceSlice",
            "metadata": {"name": "bad", "namespace": namespace},
            "spec": {"providerClusterId": "Not_An_ID", "resources": {"nvidia.com/gpu": "-2", "disk": "1"}},
        },
        check=False,
    )
    assert bad.returncode != 0
    assert "spec.resources.nvidia.com/gpu" in bad.stderr and "should match" in bad.stderr
    assert "resources may only be cpu, memory, pods, nvidia.com/gpu" in bad.stderr
    assert "spec.providerClusterId" in bad.stderr
    assert clusters.kubectl(ctx, "get", "rslice", "-n", namespace, "bad", check=False).returncode != 0

    fc = clusters.create(
        ctx,
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "ForeignCluster",
            "metadata": {"name": "x"},
            "spec": {"clusterId": "x", "roles": ["Landlord"]},
        },
        check=False,
    )
    assert fc.returncode != 0 and "Unsupported value" in fc.stderr


def _groups_listed(clusters: Clusters, ctx: str, resource: str) -> set[str]:
    """The API groups `kubectl get <resource> -A` really lists from (its `-v=6` request log)."""
    proc = clusters.kubectl(ctx, "get", resource, "-A", "-v=6")
    return {group for group, plural in _LIST_URL.findall(proc.stderr) if plural in ("resourceslices", "gateways")}


def _api_resources(clusters: Clusters, ctx: str) -> list[dict[str, str]]:
    """`kubectl api-resources` as rows (NAME, SHORTNAMES, APIVERSION, ...), cut at the header's columns."""
    header, *rows = clusters.kubectl(ctx, "api-resources").stdout.splitlines()
    names = header.split()
    starts = [header.index(n) for n in names] + [None]
    return [{n: row[starts[i] : starts[i + 1]].strip() for i, n in enumerate(names)} for row in rows if row.strip()]


def test_shared_kind_names_resolve_to_the_group_documented(clusters: Clusters) -> None:
    """`resourceslices` alone is DRA's (a built-in group wins); the qualified plural and gpufed's short
    names reach gpufed's kinds; no gpufed short name is any other resource's."""
    ctx = "consumer"
    clusters.kubectl(
        ctx,
        "wait",
        "--for=condition=Established",
        "crd/resourceslices.gpufed.io",
        "crd/gateways.gpufed.io",
        "--timeout=30s",
        timeout=40,
    )
    rows = _api_resources(clusters, ctx)
    served = {(r["NAME"], r["APIVERSION"].split("/")[0]) for r in rows if "/" in r["APIVERSION"]}
    assert {("resourceslices", "resource.k8s.io"), ("resourceslices", "gpufed.io")} <= served, served

    assert _groups_listed(clusters, ctx, "resourceslices") == {"resource.k8s.io"}
    for name in ("resourceslices.gpufed.io", "rslice", "gateways.gpufed.io", "gfgw"):
        assert _groups_listed(clusters, ctx, name) == {"gpufed.io"}, name

    ours = {s for f in CRDS.glob("*.yaml") for s in yaml.safe_load(f.read_text())["spec"]["names"]["shortNames"]}
    theirs = {
        s: f"{r['NAME']}.{r['APIVERSION']}"
        for r in rows
        if not r["APIVERSION"].startswith("gpufed.io/")
        for s in r["SHORTNAMES"].split(",")
        if s
    }
    assert {s: theirs[s] for s in ours & set(theirs)} == {}
    assert ours == {
        s for r in rows if r["APIVERSION"].startswith("gpufed.io/") for s in r["SHORTNAMES"].split(",") if s
    }
