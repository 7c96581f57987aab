"""gpufed's CRDs on a real apiserver: accepted as structural, valid objects stored and printed,
invalid ones refused by the OpenAPI schema and CEL rules with messages a human understands."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import REPO, Clusters

CRDS = REPO / "deploy" / "crds"


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
