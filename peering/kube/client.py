"""Building kubernetes-asyncio clients from kubeconfig files, with the library's errors mapped.

Owns: `api_client` (an ApiClient for one kubeconfig context, or the pod's service account in a
cluster) and `KubeError`, the one exception
type callers outside `peering.kube` see. Does not retry or rate-limit (later layers do).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import incluster_config as incluster


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 when none was received)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def forbidden(self) -> bool:
        return self.status in (401, 403)

    @property
    def transient(self) -> bool:
        """No answer, throttled, or a server-side failure: worth retrying."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def map_error(e: ApiException, what: str) -> KubeError:
    return KubeError(f"{what}: {e.status} {e.reason}", status=int(e.status or 0), reason=str(e.reason or ""))


@asynccontextmanager
async def api_client(kubeconfig: Path | None, context: str | None = None) -> AsyncIterator[Any]:
    """An ApiClient for `context` of `kubeconfig` — or, with None, the pod's own service account
    (in cluster; its projected token is re-read as the kubelet rotates it); closed on exit. Bad
    files, or None outside a pod, raise KubeError."""
    try:
        if kubeconfig is None:
            configuration = client.Configuration()
            incluster.InClusterConfigLoader(
                token_filename=incluster.SERVICE_TOKEN_FILENAME,
                cert_filename=incluster.SERVICE_CERT_FILENAME,
                try_refresh_token=True,
            ).load_and_set(configuration)
            api = client.ApiClient(configuration)
        else:
            api = await config.new_client_from_config(config_file=str(kubeconfig), context=context)
    except (OSError, config.ConfigException, yaml.YAMLError) as e:
        if kubeconfig is None:
            raise KubeError(f"no kubeconfig given and not running in a pod (in-cluster configuration: {e})") from e
        raise KubeError(f"cannot load kubeconfig {kubeconfig} (context {context or 'current'}): {e}") from e
    try:
        yield api
    finally:
        await api.close()


async def client_from_dict(kubeconfig: dict[str, Any], context: str | None = None) -> Any:
    """An ApiClient for an in-memory kubeconfig (e.g. credentials read from a Secret); caller closes it."""
    try:
        return await config.new_client_from_config_dict(kubeconfig, context=context)
    except (config.ConfigException, KeyError, ValueError, TypeError) as e:
        raise KubeError(f"invalid kubeconfig: {e}") from e


@asynccontextmanager
async def translating(what: str) -> AsyncIterator[None]:
    """Turn the client library's exceptions raised inside the block into KubeError."""
    try:
        yield
    except ApiException as e:
        raise map_error(e, what) from e
    except (OSError, TimeoutError, aiohttp.ClientError) as e:
        raise KubeError(f"{what}: {e}") from e


__all__ = ["KubeError", "api_client", "client", "client_from_dict", "map_error", "translating"]
