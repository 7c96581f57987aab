"""Cluster identity: created once, loaded afterwards, never regenerated silently (in-memory API)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from peering.controllers.identity import IdentityError, ensure_identity

CM = "/api/v1/namespaces/gpufed/configmaps/gpufed-identity"
SECRET = "/api/v1/namespaces/gpufed/secrets/gpufed-identity-key"


class FakeAPI:
    """Just enough of rest.get / rest.request over a dict of objects by path."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {
            "/api/v1/namespaces/kube-system": {"metadata": {"name": "kube-system", "uid": "3f2c91d0-aaaa-bbbb"}}
        }

    async def get(self, _api: Any, path: str, **_: Any) -> dict[str, Any] | None:
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj else None

    async def request(self, _api: Any, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "GET":
            if path not in self.objects:
                raise KubeError("not found", status=404)
            found: dict[str, Any] = copy.deepcopy(self.objects[path])
            return found
        assert method == "POST"
        full = f"{path}/{body['metadata']['name']}"
        created: dict[str, Any] = copy.deepcopy(body)
        if full in self.objects:
            raise KubeError("exists", status=409)
        self.objects[full] = created
        return created


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    f = FakeAPI()
    monkeypatch.setattr(rest, "get", f.get)
    monkeypatch.setattr(rest, "request", f.request)
    return f


async def test_created_once_then_loaded(fake: FakeAPI) -> None:
    first = await ensure_identity(None, name_hint="GPU A")
    assert first.cluster_id == "gpu-a-3f2c91d0"
    assert fake.objects[CM]["data"]["clusterId"] == first.cluster_id
    assert "PRIVATE" not in str(fake.objects[CM]), "the private key leaked into the ConfigMap"
    again = await ensure_identity(None, name_hint="something else")
    assert again.cluster_id == first.cluster_id and again.public_pem == first.public_pem


async def test_missing_secret_is_not_regenerated(fake: FakeAPI) -> None:
    await ensure_identity(None, name_hint="x")
    del fake.objects[SECRET]
    with pytest.raises(IdentityError, match=r"private key .* is missing"):
        await ensure_identity(None)
    assert SECRET not in fake.objects, "a new key was created silently"


async def test_missing_configmap_is_restored_from_the_secret(fake: FakeAPI) -> None:
    first = await ensure_identity(None, name_hint="x")
    del fake.objects[CM]
    again = await ensure_identity(None)
    assert again.cluster_id == first.cluster_id and again.public_pem == first.public_pem


async def test_mismatched_pair_and_other_cluster_id_are_refused(fake: FakeAPI) -> None:
    await ensure_identity(None, name_hint="x")
    with pytest.raises(IdentityError, match="refusing to become"):
        await ensure_identity(None, cluster_id="someone-else")
    fake.objects[CM]["data"]["clusterId"] = "tampered"
    with pytest.raises(IdentityError, match="does not match"):
        await ensure_identity(None)


async def test_explicit_cluster_id_on_first_start(fake: FakeAPI) -> None:
    ident = await ensure_identity(None, cluster_id="prod-gpus")
    assert ident.cluster_id == "prod-gpus"
