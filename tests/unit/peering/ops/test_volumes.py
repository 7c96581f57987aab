"""The consumer's claims bound on providers (peering.ops.volumes), read from the virtual volumes of an
in-memory API server: what unpeering and unoffloading refuse over, and what --delete-volumes deletes."""

from __future__ import annotations

from typing import Any

from peering.ops import volumes
from tests.unit.fakes import serve


def pv(name: str, provider: str | None, namespace: str, claim: str, phase: str = "Bound") -> dict[str, Any]:
    labels = {"gpufed.io/remote-cluster-id": provider} if provider else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"capacity": {"storage": "10Gi"}, "claimRef": {"namespace": namespace, "name": claim}},
        "status": {"phase": phase},
    }


async def test_claims_bound_on_providers_are_found_described_and_deleted() -> None:
    async with serve() as (server, api):
        server.create("persistentvolumes", pv("gpufed-1", "gpu-a", "team", "data"))
        server.create("persistentvolumes", pv("gpufed-2", "gpu-b", "team", "ckpt"))
        server.create("persistentvolumes", pv("gpufed-3", "gpu-a", "other", "set"))
        server.create("persistentvolumes", pv("gpufed-4", "gpu-a", "team", "old", phase="Released"))
        server.create("persistentvolumes", pv("local-1", None, "team", "home"))
        for ns, name in (("team", "data"), ("team", "ckpt")):
            server.create("persistentvolumeclaims", {"metadata": {"name": name, "namespace": ns}})

        on_a = await volumes.bound_claims(api, provider="gpu-a")
        assert [str(c) for c in on_a] == ["other/set on gpu-a (10Gi)", "team/data on gpu-a (10Gi)"]
        in_team = await volumes.bound_claims(api, namespace="team")
        assert [(c.name, c.provider) for c in in_team] == [("ckpt", "gpu-b"), ("data", "gpu-a")]
        many = [volumes.BoundClaim("team", f"c{i}", "gpu-a", "1Gi") for i in range(12)]
        assert volumes.describe(many).endswith("team/c9 on gpu-a (1Gi), and 2 more")
        assert await volumes.delete_claims(api, in_team) == ["team/ckpt", "team/data"]
        assert server.items("persistentvolumeclaims") == []
