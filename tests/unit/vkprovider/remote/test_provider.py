"""`RemoteProvider` against two fake API servers (consumer and provider), as a malicious provider
would drive it: TwinNamespaces it writes are only claims (the consumer's NamespaceOffloadings
decide), its node labels are allow-listed, the addresses it reports for twins are checked, and a
pod naming objects by invalid names is refused before anything is read for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    NAMESPACE_OFFLOADING,
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_UID_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    tenant_namespace,
)
from tests.unit.fakes import FakeApiServer, running, serve, until
from vkprovider.node.provider import ProviderError, Twin
from vkprovider.remote.events_relay import RelayLimits, combined
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


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with world_of() as w:
        yield w


def pod(namespace: str, name: str = "train", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": "gpufed-gpu-a", "containers": [{"name": "main", "image": "x"}], **spec},
    }


# ---------------------------------------------------------------- TwinNamespaces are claims


async def test_a_claim_on_a_namespace_offloaded_to_another_provider_starts_nothing(world: World) -> None:
    world.offload("payments", OTHER)
    world.claim("payments")
    await until(lambda: bool(world.events("payments", "TwinNamespaceRefused")), what="the refusal Event")
    assert world.reflection.started == {}, "nothing of payments is reflected to gpu-a"
    assert world.provider.twin_ns == {}
    (event,) = world.events("payments", "TwinNamespaceRefused")
    assert event["involvedObject"]["kind"] == "NamespaceOffloading" and PROVIDER in event["message"]
    with pytest.raises(ProviderError) as refused:
        await world.provider.create_pod(pod("payments"))
    assert refused.value.reason == "NamespaceNotOffloaded"
    assert not [r for r in world.local.requests if "/secrets" in r.path or "/configmaps" in r.path]


async def test_a_claim_on_a_namespace_never_offloaded_is_reported_on_the_foreign_cluster(world: World) -> None:
    world.claim("kube-system")
    await until(lambda: bool(world.events("default", "TwinNamespaceRefused")), what="the refusal Event")
    (event,) = world.events("default", "TwinNamespaceRefused")
    assert event["involvedObject"]["kind"] == "ForeignCluster" and event["involvedObject"]["name"] == PROVIDER
    assert world.reflection.started == {}


async def test_the_consumers_record_decides_when_reflection_starts_and_stops(world: World) -> None:
    world.claim("team")
    await until(lambda: not world.provider._claims_pending, what="the grace")
    assert world.reflection.started == {}
    world.offload("team", PROVIDER)
    await until(lambda: world.reflection.started == {"team": f"team-{CONSUMER}"}, what="reflection started")
    assert world.events("team", "TwinNamespaceRefused") == [], "a claim confirmed within the grace is no alarm"
    world.offload("team", PROVIDER, phase="Terminating")  # the consumer no longer selects gpu-a
    await until(lambda: world.reflection.started == {}, what="reflection stopped")
    assert world.provider.twin_ns == {}


async def test_a_claim_with_an_invalid_twin_name_is_refused(world: World) -> None:
    world.offload("team", PROVIDER)
    world.claim("team", twin="../../gpufed")
    await until(lambda: bool(world.events("team", "TwinNamespaceRefused")), what="the refusal Event")
    assert world.reflection.started == {}


# ---------------------------------------------------------------- node labels


def slice_(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": "s1", "namespace": SYSTEM_NAMESPACE},
        "spec": {"providerClusterId": PROVIDER},
        "status": {
            "conditions": [{"type": "Resources", "status": "True"}],
            "granted": {"nvidia.com/gpu": "8"},
            "nodeLabels": labels,
        },
    }


async def test_provider_node_labels_are_allow_listed_and_the_dropped_reported_once(world: World) -> None:
    world.local.create(
        "resourceslices",
        slice_({"nvidia.com/gpu.product": "H100", "topology.kubernetes.io/region": "eu", "kubernetes.io/os": "x"}),
        API_VERSION,
    )
    await until(lambda: "s1" in world.provider._slices, what="the slice")
    assert dict(world.provider.grant().labels) == {"nvidia.com/gpu.product": "H100"}
    await until(lambda: bool(world.events("default", "NodeLabelsDropped")), what="the Event")
    world.local.update("resourceslices", SYSTEM_NAMESPACE, "s1", lambda o: o["status"].update(granted={"cpu": "1"}))
    await until(lambda: world.provider._slices["s1"]["status"]["granted"] == {"cpu": "1"}, what="the update")
    (event,) = world.events("default", "NodeLabelsDropped")
    assert "topology.kubernetes.io/region=eu" in event["message"] and "nvidia.com" not in event["message"]


async def test_an_allow_listed_label_passes_but_never_a_reserved_one() -> None:
    async with world_of(node_label_allow=("example.com/rack", "topology.kubernetes.io/*")) as w:
        w.local.create(
            "resourceslices", slice_({"example.com/rack": "r1", "topology.kubernetes.io/region": "eu"}), API_VERSION
        )
        await until(lambda: "s1" in w.provider._slices, what="the slice")
        assert dict(w.provider.grant().labels) == {"example.com/rack": "r1"}


# ---------------------------------------------------------------- twin addresses


def twin_with_ip(ip: str) -> Twin:
    raw = {
        "metadata": {"namespace": f"team-{CONSUMER}", "name": "train", "labels": {ORIGIN_CLUSTER_LABEL: CONSUMER}},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }
    return Twin(
        namespace="team",
        name="train",
        origin_uid="uid-train",
        terminal=False,
        deleting=False,
        unplaced_since=None,
        raw=raw,
    )


async def test_a_twin_address_outside_the_providers_pod_range_is_not_the_pods(world: World) -> None:
    local = pod("team")
    assert world.provider.pod_status(local, twin_with_ip("10.244.1.7"))["status"]["podIP"] == "10.244.1.7"
    patch = world.provider.pod_status(local, twin_with_ip("10.96.0.1"))
    assert patch["status"]["podIP"] is None and patch["status"]["podIPs"] is None
    world.provider.pod_status(local, twin_with_ip("10.96.0.1"))
    await until(lambda: bool(world.events("team", "PodIPRefused")), what="the Event")
    (event,) = world.events("team", "PodIPRefused")
    assert "10.96.0.1" in event["message"] and "outside the provider's pod range" in event["message"]
    assert event["involvedObject"]["uid"] == "uid-train"


# ---------------------------------------------------------------- names from pods


async def test_a_pod_naming_a_secret_outside_its_namespace_is_refused_before_any_read(world: World) -> None:
    world.offload("team", PROVIDER)
    world.claim("team")
    await until(lambda: "team" in world.provider.twin_ns, what="the twin namespace")
    before = len(world.local.requests)
    with pytest.raises(ProviderError) as refused:
        await world.provider.create_pod(pod("team", imagePullSecrets=[{"name": "../../gpufed/secrets/x"}]))
    assert refused.value.reason == "InvalidName" and not refused.value.retry
    assert "../../gpufed/secrets/x" in str(refused.value)
    assert world.local.requests[before:] == []
    assert world.remote.items("pods") == []


def test_twin_names_from_the_provider_must_be_kubernetes_names() -> None:
    provider = RemoteProvider(None, None, RemoteSettings(CONSUMER, PROVIDER, "gpufed-gpu-a"))
    provider.local_ns[f"team-{CONSUMER}"] = "team"
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: "u"}
    provider._on_twin("ADDED", {"metadata": {"namespace": f"team-{CONSUMER}", "name": "../x", "labels": labels}})
    assert provider.twins() == []


# ---------------------------------------------------------------- the provider's Events


def twin_pod(name: str = "train") -> dict[str, Any]:
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: f"uid-{name}"}
    return {"kind": "Pod", "metadata": {"namespace": f"team-{CONSUMER}", "name": name, "labels": labels}}


def remote_event(i: int, reason: str = "BackOff", type_: str = "Warning", pod: str = "train") -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"namespace": f"team-{CONSUMER}", "name": f"{pod}.{i}"},
        "involvedObject": {"kind": "Pod", "namespace": f"team-{CONSUMER}", "name": pod},
        "reason": reason,
        "type": type_,
        "message": f"message {i}",
    }


EVENTS_PATH = f"/api/v1/namespaces/team-{CONSUMER}/events"


async def offloaded_with_a_twin(w: World) -> None:
    """A twin of team/train, and the twin namespace's Events listed (what comes later is new)."""
    w.offload("team", PROVIDER)
    w.claim("team")
    w.remote.create("pods", twin_pod())
    await until(lambda: w.provider.twin("team", "train") is not None, what="the twin")
    await until(lambda: bool(w.remote.calls("GET", EVENTS_PATH)), what="the Events listed")


async def test_a_flood_of_provider_events_for_one_twin_makes_a_bounded_number_of_consumer_events(world: World) -> None:
    await offloaded_with_a_twin(world)
    for i in range(2000):
        world.remote.create("events", remote_event(i, reason=f"Reason{i % 50}"))
    limits = world.provider.events.limits
    await until(lambda: world.provider.events.dropped["rate_limited"] >= 2000 - limits.burst, what="the flood seen")
    await world.provider.events.flushed()
    relayed = [e for e in world.local.items("events", "team") if e["involvedObject"]["kind"] == "Pod"]
    assert 0 < len(relayed) <= limits.burst
    assert {e["involvedObject"]["uid"] for e in relayed} == {"uid-train"}


async def test_relayed_events_of_one_reason_are_combined_on_one_counted_event() -> None:
    async with world_of(event_limits=RelayLimits(burst=40, max_similar=3)) as w:
        await offloaded_with_a_twin(w)
        for i in range(30):
            w.remote.create("events", remote_event(i))
        await until(lambda: sum(e.get("count", 0) for e in w.events("team", "BackOff")) == 30, what="all counted")
        backoffs = w.events("team", "BackOff")
        assert len(backoffs) == 4  # three shown as they are, then one combined Event counting the rest
        (summary,) = [e for e in backoffs if e["message"] == combined("BackOff")]
        assert summary["count"] == 27


async def test_a_relayed_event_keeps_to_the_reasons_and_types_kubernetes_writes(world: World) -> None:
    await offloaded_with_a_twin(world)
    world.remote.create("events", remote_event(1, reason="../../etc passwd", type_="Critical"))
    await until(lambda: bool(world.events("team", "Remote")), what="the relayed Event")
    (event,) = world.events("team", "Remote")
    assert event["type"] == "Normal" and event["message"] == f"message 1 (on {PROVIDER})"


async def test_events_of_other_objects_than_pods_are_not_even_watched(world: World) -> None:
    await offloaded_with_a_twin(world)
    reads = world.remote.calls("GET", EVENTS_PATH)
    assert reads and all(r.query.get("fieldSelector") == "involvedObject.kind=Pod" for r in reads)


async def test_the_ingress_annotations_a_provider_publishes_reach_reflection(world: World) -> None:
    world.offload("team", PROVIDER)
    obj = {
        "kind": "TwinNamespace",
        "metadata": {"name": "team", "namespace": TENANT},
        "spec": {"namespace": "team"},
        "status": {"phase": "Ready", "twin": f"team-{CONSUMER}", "ingressAnnotations": ["example.com/*"]},
    }
    world.remote.create("twinnamespaces", obj, API_VERSION)
    await until(lambda: world.reflection.ingress_annotations.get("team") == ["example.com/*"], what="published")
    world.claim("other")
    world.offload("other", PROVIDER)
    await until(lambda: "other" in world.reflection.started, what="the second namespace")
    assert world.reflection.ingress_annotations["other"] is None, "nothing published: nothing allowed beyond the class"
