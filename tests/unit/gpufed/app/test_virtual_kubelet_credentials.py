"""The virtual kubelet's `CredentialsFollower`: renewed credentials in the Secret are swapped in
without a restart (new requests use them, the listeners hear of them), an unchanged Secret swaps
nothing, and a Secret that does not load keeps the current client. Against the in-memory API server."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from gpufed.apis.wire import SYSTEM_NAMESPACE, ClusterID, remote_kubeconfig_secret
from gpufed.app.virtual_kubelet import CredentialsFollower, _expiry
from gpufed.kube import rest
from gpufed.kube.client import client_from_dict
from gpufed.kube.reloadable import ReloadableClient
from tests.unit.fakes import FakeApiServer, running, serve, until
from tests.unit.gpufed.ops.doctor.scenario import certificate

PROVIDER = ClusterID("prov-reload-0001")
SECRET = remote_kubeconfig_secret(PROVIDER)


def _kubeconfig(server: str, days_left: float) -> dict[str, Any]:
    cert, key = certificate(days_left)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "p", "cluster": {"server": server}}],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate-data": base64.b64encode(cert).decode(),
                    "client-key-data": base64.b64encode(key).decode(),
                },
            }
        ],
        "contexts": [{"name": "p", "context": {"cluster": "p", "user": "u"}}],
        "current-context": "p",
    }


def _data(cfg: dict[str, Any]) -> str:
    return base64.b64encode(yaml.safe_dump(cfg).encode()).decode()


def _store(server: FakeApiServer, data: str) -> None:
    if server.get("secrets", SYSTEM_NAMESPACE, SECRET) is None:
        server.create(
            "secrets", {"metadata": {"name": SECRET, "namespace": SYSTEM_NAMESPACE}, "data": {"kubeconfig": data}}
        )
    else:
        server.update("secrets", SYSTEM_NAMESPACE, SECRET, lambda s: s.__setitem__("data", {"kubeconfig": data}))


def _host(api: Any) -> str:
    return str(api.configuration.host)


async def test_renewed_credentials_are_swapped_in_and_the_listeners_told() -> None:
    consumer, old_provider, new_provider = FakeApiServer(), FakeApiServer(), FakeApiServer()
    for server, value in ((old_provider, "old"), (new_provider, "new")):
        server.create("configmaps", {"metadata": {"name": "which", "namespace": "default"}, "data": {"v": value}})
    async with serve(consumer) as (_, api), serve(old_provider) as (_, a1), serve(new_provider) as (_, a2):
        first = _kubeconfig(_host(a1), 90)
        _store(consumer, _data(first))
        remote = ReloadableClient(await client_from_dict(first), retire_poll_s=0.01)
        heard: list[dict[str, Any]] = []
        follower = CredentialsFollower(
            api, PROVIDER, remote, first, _data(first), reload_s=0.02, listeners=[heard.append]
        )
        path = rest.path("v1", "configmaps", "which", namespace="default")
        try:
            assert await follower.check() is False, "an unchanged Secret swapped the client"
            got = await rest.get(remote, path)
            assert got is not None and got["data"]["v"] == "old"
            # The controller renews: a new certificate (and here a new server, to tell them apart).
            renewed = _kubeconfig(_host(a2), 120)
            _store(consumer, _data(renewed))
            async with running(follower.run()):
                await until(lambda: remote.generation == 1, what="the renewed credentials to be swapped in")
            got = await rest.get(remote, path)
            assert got is not None and got["data"]["v"] == "new"
            assert heard == [renewed] and follower.cfg == renewed
            assert _expiry(renewed) is not None and _expiry(renewed) != _expiry(first)
            await until(lambda: remote.retiring == 0, what="the old client to be closed")
        finally:
            await remote.close()


async def test_credentials_that_do_not_load_keep_the_current_client() -> None:
    async with serve() as (consumer, api):
        first = _kubeconfig(_host(api), 90)
        _store(consumer, _data(first))
        remote = ReloadableClient(await client_from_dict(first))
        follower = CredentialsFollower(api, PROVIDER, remote, first, _data(first))
        try:
            _store(consumer, base64.b64encode(b"users: [not a kubeconfig").decode())
            assert await follower.check() is False
            assert remote.generation == 0 and follower.cfg == first
            assert await follower.check() is False, "the same bad Secret is not retried on every read"
        finally:
            await remote.close()
