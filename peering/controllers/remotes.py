"""API clients for providers, built from the consumer's credential Secrets and shared by reconcilers.

Owns `Remotes`: one kubernetes-asyncio client per provider, made from the kubeconfig in Secret
`gpufed/gpufed-remote-<provider>` (written by the consumer role) and kept while that Secret's
resourceVersion is unchanged, so renewed or re-issued credentials are picked up at once and an
unchanged Secret costs no new TLS set-up.

Invariants: at most one client per provider (a lock serialises creation), a
`gpufed.kube.reloadable.ReloadableClient`: when the Secret changes, new requests use the new
credentials at once and the old client is closed once its requests in flight are done; a dropped
client is closed; `close` closes them all. The kubeconfig and its key are never logged.

Does not: write the Secret (the consumer role does), retry calls, or decide whether a provider is
peered (callers check the ForeignCluster).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import yaml

from gpufed.apis.wire import SYSTEM_NAMESPACE, ClusterID, remote_kubeconfig_secret
from gpufed.kube import rest
from gpufed.kube.client import KubeError, client_from_dict
from gpufed.kube.reloadable import ReloadableClient


class Remotes:
    """Provider clients keyed by ClusterID, each tied to the resourceVersion of its Secret."""

    def __init__(self) -> None:
        self._clients: dict[str, tuple[str, ReloadableClient]] = {}
        self._lock = asyncio.Lock()

    async def get(self, provider: str, secret: dict[str, Any]) -> Any:
        """A client for `provider` with the credentials in `secret` (a Secret as read from the API)."""
        rv = secret["metadata"]["resourceVersion"]
        async with self._lock:
            cached = self._clients.get(provider)
            if cached and cached[0] == rv:
                return cached[1]
            try:
                cfg = yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"]))
            except (KeyError, ValueError, yaml.YAMLError) as e:
                await self._drop(provider)
                raise KubeError(f"the credentials Secret for {provider} holds no usable kubeconfig") from e
            try:
                new = await client_from_dict(cfg)
            except KubeError:
                await self._drop(provider)
                raise
            if cached:
                # Renewed or replaced credentials: requests in flight finish on the old client.
                cached[1].swap(new)
                client = cached[1]
            else:
                client = ReloadableClient(new)
            self._clients[provider] = (rv, client)
            return client

    async def for_provider(self, local_api: Any, provider: ClusterID) -> Any | None:
        """A client for `provider` from its Secret in the local `gpufed` namespace; None without one."""
        secret = await rest.get(
            local_api, rest.path("v1", "secrets", remote_kubeconfig_secret(provider), namespace=SYSTEM_NAMESPACE)
        )
        if secret is None or "kubeconfig" not in (secret.get("data") or {}):
            await self.drop(provider)
            return None
        return await self.get(provider, secret)

    async def drop(self, provider: str) -> None:
        """Close and forget the client of `provider` (e.g. after it failed or was unpeered)."""
        async with self._lock:
            await self._drop(provider)

    async def _drop(self, provider: str) -> None:
        cached = self._clients.pop(provider, None)
        if cached:
            await cached[1].close()

    async def close(self) -> None:
        async with self._lock:
            for provider in list(self._clients):
                await self._drop(provider)
