"""A `RemoteProvider` between two fake API servers (consumer and provider), as the tests of the remote
provider and of its parts drive it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import NAMESPACE_OFFLOADING, ClusterID, tenant_namespace
from tests.unit.fakes import FakeApiServer, running, serve, until
from vkprovider.remote.provider import RemoteProvider, RemoteSettings

CONSUMER = "c-1"
PROVIDER = "gpu-a"
OTHER = "gpu-b"
TENANT = tenant_namespace(ClusterID(CONSUMER))


@dataclass
class Reflection:
    """A NamespaceReflection that records what it is told."""

    started: dict[str, str] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    ingress_annotations: dict[str, Sequence[str] | None] = field(default_factory=dict)

    def start_namespace(self, local_ns: str, twin_ns: str) -> None:
        self.started[local_ns] = twin_ns

    def stop_namespace(self, local_ns: str) -> None:
        self.started.pop(local_ns, None)
        self.stopped.append(local_ns)

    def namespace_annotations(self, local_ns: str) -> Mapping[str, str]:
        return {}

    def set_ingress_annotations(self, local_ns: str, allowed: Sequence[str] | None) -> None:
        self.ingress_annotations[local_ns] = allowed

    def held_object(self, side: str, kind: str, local_ns: str, name: str) -> Mapping[str, Any] | None:
        return None


class Ranges:
    """PodAddresses: only 10.244.0.0/16 is the provider's pod range."""

    def refuse_pod_ip(self, remote_ip: str) -> str | None:
        return None if remote_ip.startswith("10.244.") else "it is outside the provider's pod range 10.244.0.0/16"


@dataclass
class World:
    local: FakeApiServer
    remote: FakeApiServer
    provider: RemoteProvider
    reflection: Reflection

    def claim(self, namespace: str, twin: str | None = None, phase: str = "Ready") -> None:
        """The provider writes a TwinNamespace (spec and status: both are its own)."""
        obj = {
            "kind": "TwinNamespace",
            "metadata": {"name": namespace, "namespace": TENANT},
            "spec": {"namespace": namespace},
            "status": {"phase": phase, "twin": twin or f"{namespace}-{CONSUMER}"},
        }
        self.remote.create("twinnamespaces", obj, API_VERSION)

    def offload(self, namespace: str, *providers: str, phase: str = "Ready") -> None:
        """The consumer's offloading controller records where `namespace` is offloaded."""
        entries = [{"clusterId": p, "namespace": f"{namespace}-{CONSUMER}", "phase": phase} for p in providers]
        obj = {
            "kind": "NamespaceOffloading",
            "metadata": {"name": NAMESPACE_OFFLOADING, "namespace": namespace},
            "status": {"remoteNamespaces": entries},
        }
        if self.local.get("namespaceoffloadings", namespace, NAMESPACE_OFFLOADING) is None:
            self.local.create("namespaceoffloadings", obj, API_VERSION)
        else:
            self.local.update("namespaceoffloadings", namespace, NAMESPACE_OFFLOADING, lambda o: o.update(obj))

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.local.items("events", namespace) if e.get("reason") == reason]


@contextlib.asynccontextmanager
async def world_of(**settings: Any) -> AsyncIterator[World]:
    async with serve() as (local, local_api), serve() as (remote, remote_api):
        local.create("foreignclusters", {"kind": "ForeignCluster", "metadata": {"name": PROVIDER}}, API_VERSION)
        reflection = Reflection()
        provider = RemoteProvider(
            local_api,
            remote_api,
            RemoteSettings(CONSUMER, PROVIDER, "gpufed-gpu-a", claim_grace_s=0.05, **settings),
            reflection=reflection,
            pod_addresses=Ranges(),
        )
        w = World(local, remote, provider, reflection)
        async with running(provider.run()):
            await until(provider.ready.is_set, what="provider view synced")
            yield w


def pod(namespace: str, name: str = "train", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": "gpufed-gpu-a", "containers": [{"name": "main", "image": "x"}], **spec},
    }


# ---------------------------------------------------------------- TwinNamespaces are claims
