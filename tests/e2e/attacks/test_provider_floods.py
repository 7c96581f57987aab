"""Floods and refused objects on the real local clusters: what a PROVIDER writes in bulk must not
decide what the consumer's virtual kubelet spends, and what a TENANT USER's reflected object asks of
the provider beyond its policy is left out or refused with an Event on the user's own object.

Provider position (gpu-a's admin, its kubeconfig context, writes anything into gpu-a):
- 5,000 Events about one twin pod: the consumer records a bounded number of Events on the local pod
  (the per-pod limit of `vkprovider.remote.events_relay`), the rest is counted and logged as dropped;
- more ConfigMaps labelled as the consumer's copies than reflection holds per twin namespace (with
  the provider's quota lifted by its admin): reflection stops watching them, says so with a Warning
  Event `ReflectionLimit` on the NamespaceOffloading, and keeps reflecting by reading each copy.

Tenant user position (a user of the consumer, in an offloaded namespace):
- an Ingress with an ingress controller's configuration snippet: reflected without the annotation,
  and a Warning Event `IngressAnnotationsDropped` on the local Ingress names it;
- an Ingress for a host the provider did not give the tenant: the provider's `gpufed-consumer-objects`
  policy refuses the copy, which is one Warning Event `ReflectionRefused` on the local Ingress naming
  the rule (not a retry storm), and no Ingress exists on the provider.

The module peers the consumer with gpu-a for its duration; each test uses its own namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL, ClusterID, twin_namespace
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from peering import podsecurity
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session, vk_log_lines
from vkprovider.remote.events_relay import RelayLimits

pytestmark = pytest.mark.e2e

PROVIDER = "gpu-a"
SMALL = {"cpu": "10m", "memory": "16Mi"}
#: Seconds a flood is given to cost the consumer something before the test counts.
SETTLE_S = 20.0
#: Concurrent writes of a flood (the local API servers take them in well under a minute).
FLOOD_CONCURRENCY = 32
EVENT_FLOOD = 5_000
SNIPPET = "nginx.ingress.kubernetes.io/configuration-snippet"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {PROVIDER: ("--gpus", "8")})


# ---------------------------------------------------------------------------- helpers


def twin(ids: dict[str, ClusterID], namespace: str) -> str:
    return twin_namespace(namespace, ids["consumer"])


def get(clusters: Clusters, context: str, *args: str) -> dict[str, Any] | None:
    p = clusters.kubectl(context, "get", *args, "-o", "json", check=False)
    if p.returncode:
        assert "NotFound" in p.stderr, p.stderr
        return None
    found: dict[str, Any] = json.loads(p.stdout)
    return found


def apply(clusters: Clusters, context: str, obj: dict[str, Any]) -> None:
    clusters.kubectl(context, "apply", "-f", "-", input_text=json.dumps(obj))


def consumer_events(
    clusters: Clusters, namespace: str, name: str, keep: Callable[[dict[str, Any]], bool] = lambda _e: True
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return [e for e in items if keep(e)]


def with_reason(reason: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("reason") == reason


def offloaded_pod(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, name: str = "app") -> dict[str, Any]:
    """`namespace` offloaded to gpu-a; a running pod there and its twin."""
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}"
    )
    clusters.run_pod("consumer", namespace, name, container={"resources": {"requests": SMALL}})
    found = eventually("the twin on gpu-a", lambda: get(clusters, PROVIDER, "pod", name, "-n", twin(ids, namespace)))
    assert isinstance(found, dict)
    return found


async def flood(api: Any, path: str, bodies: list[dict[str, Any]]) -> int:
    """POST every body to `path` on `api`, FLOOD_CONCURRENCY at a time; how many were created."""
    gate = asyncio.Semaphore(FLOOD_CONCURRENCY)

    async def one(body: dict[str, Any]) -> bool:
        async with gate:
            try:
                await rest.request(api, "POST", path, body=body)
            except KubeError:
                return False
            return True

    results = await asyncio.gather(*(one(b) for b in bodies))
    return sum(results)


async def component_pid(clusters: Clusters, cluster: str, name: str) -> int:
    statuses = {s.name: s for s in await clusters.env.status()}
    pid = next(c.pid for c in statuses[cluster].components if c.name == name)
    assert pid is not None, f"{name} of {cluster} is not running"
    return int(pid)


@contextlib.contextmanager
def provider_controller_paused(pid: int) -> Iterator[None]:
    """gpu-a's gpufed controller stopped (SIGSTOP): what gpu-a's admin changes stays changed, as with
    a provider running its own, modified controller. Resumed (SIGCONT) whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------------------- provider: floods


async def test_provider_floods_a_twin_pod_with_five_thousand_events(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, api: dict[str, Any]
) -> None:
    twin_pod = offloaded_pod(clusters, ids, namespace)
    twin_ns = twin(ids, namespace)
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": twin_ns,
        "name": "app",
        "uid": twin_pod["metadata"]["uid"],
    }
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    bodies = [
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"app.flood-{i}", "namespace": twin_ns},
            "involvedObject": involved,
            # Varying reasons and messages: neither the kubelet-style counting nor one correlator
            # key per reason may let them through one by one.
            "reason": f"Flood{i % 100}",
            "message": f"flood {i}: please look at http://phish.example/{i}",
            "type": "Warning",
            "source": {"component": "kubelet"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        for i in range(EVENT_FLOOD)
    ]
    started = time.monotonic()
    created = await flood(api[PROVIDER], rest.path("v1", "events", namespace=twin_ns), bodies)
    assert created == EVENT_FLOOD, f"gpu-a took only {created} of the {EVENT_FLOOD} Events"

    def flooded() -> list[dict[str, Any]]:
        return consumer_events(clusters, namespace, "app", lambda e: str(e.get("reason", "")).startswith("Flood"))

    eventually("the first relayed Events", flooded, timeout=60)
    time.sleep(SETTLE_S)
    relayed = flooded()
    elapsed = time.monotonic() - started
    limits = RelayLimits()
    bound = limits.burst + math.ceil(elapsed / limits.refill_s)
    assert len(relayed) <= bound, f"{len(relayed)} Events on the local pod for {EVENT_FLOOD} at gpu-a (bound {bound})"
    assert sum(int(e.get("count") or 1) for e in relayed) <= bound
    assert all(e["involvedObject"]["uid"] == twin_pod["metadata"]["labels"][ORIGIN_UID_LABEL] for e in relayed)
    # The consumer's side records the flood: the relay's drops are logged (and counted in
    # gpufed_relayed_events_dropped_total).
    assert vk_log_lines(clusters, ids[PROVIDER], "events dropped", "rate_limited"), "the drops are not logged"
    # The virtual kubelet still serves: the pod stays Ready and a new pod is offloaded.
    pod = clusters.kubectl_json("consumer", "get", "pod", "app", "-n", namespace)
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]), pod["status"]
    clusters.run_pod("consumer", namespace, "after", container={"resources": {"requests": SMALL}})


def forged_copy(namespace: str, name: str, consumer: ClusterID) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {ORIGIN_CLUSTER_LABEL: consumer}},
        "data": {"padding": "x" * 512},
    }


# ---------------------------------------------------------------------------- tenant user: Ingresses


def ingress(namespace: str, name: str, cls: str, host: str, annotations: dict[str, str]) -> dict[str, Any]:
    backend = {"service": {"name": "web", "port": {"number": 80}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "ingressClassName": cls,
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}],
        },
    }


@contextlib.contextmanager
def provider_ingress_setup(clusters: Clusters, ids: dict[str, ClusterID], cls: str, host: str) -> Iterator[None]:
    """gpu-a has IngressClass `cls` and gives the consumer `host` (and no annotation)."""
    apply(
        clusters,
        PROVIDER,
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IngressClass",
            "metadata": {"name": cls},
            "spec": {"controller": "example.com/ingress"},
        },
    )
    policy = {"spec": {"policy": {"ingressHosts": [host]}}}
    clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(policy))
    try:
        yield
    finally:
        clusters.kubectl(PROVIDER, "delete", "ingressclass", cls, check=False)
        reset = {"spec": {"policy": {"ingressHosts": None}}}
        clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(reset))


def offloaded_with_hosts(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, host: str) -> str:
    """`namespace` offloaded to gpu-a, its twin's projection giving the tenant `host`."""
    offload(clusters, namespace, "--selector", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}")
    twin_ns = twin(ids, namespace)

    def projected() -> bool:
        ns = get(clusters, PROVIDER, "namespace", twin_ns)
        return bool(ns and (ns["metadata"].get("annotations") or {}).get(podsecurity.INGRESS_HOSTS_ANNOTATION) == host)

    eventually("the tenant's hosts projected onto the twin namespace", projected, timeout=90)
    return twin_ns


def test_tenant_ingress_with_a_configuration_snippet_is_reflected_without_it(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    cls, host = f"nginx-{namespace[-6:]}", f"web-{namespace[-6:]}.example.com"
    with provider_ingress_setup(clusters, ids, cls, host):
        twin_ns = offloaded_with_hosts(clusters, ids, namespace, host)
        snippet = {SNIPPET: "proxy_pass http://169.254.169.254/latest/meta-data/;"}
        apply(clusters, "consumer", ingress(namespace, "web", cls, host, snippet))
        copy = eventually("the Ingress on gpu-a", lambda: get(clusters, PROVIDER, "ingress", "web", "-n", twin_ns))
        assert SNIPPET not in (copy["metadata"].get("annotations") or {}), copy["metadata"]
        assert copy["spec"]["rules"][0]["host"] == host
        dropped = eventually(
            "the Event on the local Ingress",
            lambda: consumer_events(clusters, namespace, "web", with_reason("IngressAnnotationsDropped")),
        )
        assert dropped[0]["type"] == "Warning" and SNIPPET in dropped[0]["message"]
        assert consumer_events(clusters, namespace, "web", with_reason("ReflectionRefused")) == []


def test_tenant_ingress_for_a_host_the_provider_did_not_give_is_refused_with_one_event(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    cls, host = f"nginx-{namespace[-6:]}", f"web-{namespace[-6:]}.example.com"
    with provider_ingress_setup(clusters, ids, cls, host):
        twin_ns = offloaded_with_hosts(clusters, ids, namespace, host)
        apply(clusters, "consumer", ingress(namespace, "login", cls, "login.provider.example", {}))
        refused = eventually(
            "the refusal on the local Ingress",
            lambda: consumer_events(clusters, namespace, "login", with_reason("ReflectionRefused")),
            timeout=90,
        )
        message = refused[0]["message"]
        assert refused[0]["type"] == "Warning"
        assert f"ValidatingAdmissionPolicy '{podsecurity.OBJECTS_POLICY_NAME}'" in message, message
        assert "login.provider.example" in message and "ingressHosts" in message, message
        time.sleep(SETTLE_S)  # no retry storm: still that one Event, counted once
        again = consumer_events(clusters, namespace, "login", with_reason("ReflectionRefused"))
        assert len(again) == 1 and int(again[0].get("count") or 1) == 1, again
        assert get(clusters, PROVIDER, "ingress", "login", "-n", twin_ns) is None
