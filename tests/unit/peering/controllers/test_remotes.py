"""`Remotes`: one client per provider; a changed credentials Secret (a renewal) swaps the credentials
in the same client, so holders keep working and new requests use the new certificate; an unchanged
Secret builds nothing."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from gpufed.kube import rest
from peering.controllers.remotes import Remotes
from tests.unit.fakes import FakeApiServer, serve


def _secret(host: str, rv: str) -> dict[str, Any]:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "p", "cluster": {"server": host}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "p", "context": {"cluster": "p", "user": "u"}}],
        "current-context": "p",
    }
    return {
        "metadata": {"resourceVersion": rv},
        "data": {"kubeconfig": base64.b64encode(yaml.safe_dump(cfg).encode()).decode()},
    }


async def test_a_renewed_secret_swaps_the_credentials_of_the_same_client() -> None:
    first, second = FakeApiServer(), FakeApiServer()
    for server, value in ((first, "first"), (second, "second")):
        server.create("configmaps", {"metadata": {"name": "which", "namespace": "default"}, "data": {"v": value}})
    path = rest.path("v1", "configmaps", "which", namespace="default")
    remotes = Remotes()
    async with serve(first) as (_, a1), serve(second) as (_, a2):
        try:
            client = await remotes.get("p", _secret(a1.configuration.host, "1"))
            assert await remotes.get("p", _secret(a1.configuration.host, "1")) is client
            got = await rest.get(client, path)
            assert got is not None and got["data"]["v"] == "first"
            renewed = await remotes.get("p", _secret(a2.configuration.host, "2"))
            assert renewed is client and client.generation == 1
            got = await rest.get(client, path)
            assert got is not None and got["data"]["v"] == "second"
        finally:
            await remotes.close()
