"""The consumer's offloading controller: which providers are selected, how their answers sum up,
and what one reconcile writes, against an in-memory API (no cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpufed.apis.offloading import NamespaceOffloadingSpec
from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import OFFLOADING_LABEL, REMOTE_CLUSTER_LABEL, ClusterID
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from peering.controllers import offloading as off
from peering.controllers.offloading import FINALIZER, OffloadingController, RemoteOutcome
from peering.controllers.remotes import Remotes

A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"
NODES = {
    "gpufed-a": {REMOTE_CLUSTER_LABEL: "a", GPU_PRODUCT_LABEL: H100},
    "gpufed-b": {REMOTE_CLUSTER_LABEL: "b", GPU_PRODUCT_LABEL: A100},
}
ON_B = {"nodeSelectorTerms": [{"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [A100]}]}]}
NS_PATH = "/apis/gpufed.io/v1alpha1/namespaces/team/namespaceoffloadings/offloading"
TWIN_REQ = "/apis/gpufed.io/v1alpha1/namespaces/gpufed-tenant-c/twinnamespaces/team"


@pytest.fixture(autouse=True)
def _logs() -> Iterator[None]:
    with capture_logs():
        yield


def spec(**kw: Any) -> NamespaceOffloadingSpec:
    return NamespaceOffloadingSpec.model_validate(kw)


def test_selection_follows_the_selector_and_the_peerings() -> None:
    assert off.selected_providers(spec(), NODES, {"a", "b"}) == ["a", "b"]
    assert off.selected_providers(spec(clusterSelector=ON_B), NODES, {"a", "b"}) == ["b"]
    assert off.selected_providers(spec(podOffloadingStrategy="Local"), NODES, {"a", "b"}) == []
    # A virtual node of an unpeered provider selects nothing.
    assert off.selected_providers(spec(), NODES, {"a"}) == ["a"]
    assert off.selected_providers(spec(), {}, {"a", "b"}) == []


def test_expected_twin_names() -> None:
    c = ClusterID("c-1")
    assert off.expected_twin(spec(), "team", c) == "team-c-1"
    assert off.expected_twin(spec(namespaceMappingStrategy="EnforceSameName"), "team", c) == "team"
    assert off.expected_twin(spec(namespaceMappingStrategy="SelectedName", remoteNamespaceName="x"), "team", c) == "x"
    assert off.expected_twin(spec(), "n" * 60, c) == ""


def test_summary() -> None:
    ready = RemoteOutcome("a", "t-a", "Ready", "ok")
    pending = RemoteOutcome("b", "t-b", "Pending", "waiting")
    refused = RemoteOutcome("b", "t-b", "Refused", "taken")
    down = RemoteOutcome("b", "", "Unreachable", "timeout")
    assert off.summarize("Local", [])[:3] == ("Ready", True, "LocalOnly")
    assert off.summarize("Remote", [])[:3] == ("Pending", False, "NoMatchingProvider")
    assert off.summarize("Remote", [ready])[:3] == ("Ready", True, "TwinsReady")
    assert off.summarize("Remote", [ready, pending])[:3] == ("Partial", False, "Waiting")
    assert off.summarize("Remote", [ready, refused])[:3] == ("Partial", False, "TwinRefused")
    assert off.summarize("Remote", [refused])[:3] == ("Failed", False, "TwinRefused")
    phase, ok, reason, message = off.summarize("Remote", [down])
    assert (phase, ok, reason) == ("Pending", False, "ProviderUnreachable") and "b: Unreachable: timeout" in message


# ---------------------------------------------------------------------------- one reconcile, in memory


class FakeAPI:
    """Objects by URL path of one cluster; apply merges top-level keys like a single field manager."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.objects: dict[str, dict[str, Any]] = {}
        self.down = False
        #: A KubeError every request raises instead of answering (None: answer).
        self.fails: KubeError | None = None
        self.rv = 0

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{path}")
        meta["resourceVersion"] = str(self.rv)
        self.objects[path] = obj
        return obj


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeAPI]:
    clusters = {n: FakeAPI(n) for n in ("local", "a", "b")}

    def check(api: FakeAPI) -> None:
        if api.down:
            raise KubeError("cannot reach the API server", status=0)
        if api.fails is not None:
            raise api.fails

    async def get(api: FakeAPI, path: str, **_: Any) -> dict[str, Any] | None:
        check(api)
        return api.objects.get(path)

    async def apply(api: FakeAPI, path: str, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        check(api)
        if path.endswith("/status"):
            cur = api.objects[path.removesuffix("/status")]
            cur["status"] = obj["status"]
            return cur
        cur = api.objects.get(path) or {}
        return api.put(path, {**cur, **obj})

    async def merge_patch(api: FakeAPI, path: str, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        check(api)
        cur = api.objects[path]
        meta = cur["metadata"]
        for k, v in patch["metadata"].items():
            if k == "labels":
                labels = {**(meta.get("labels") or {}), **v}
                meta["labels"] = {lk: lv for lk, lv in labels.items() if lv is not None}
            elif k != "resourceVersion":
                meta[k] = v
        return api.put(path, cur)

    async def delete(api: FakeAPI, path: str, **_: Any) -> bool:
        check(api)
        return api.objects.pop(path, None) is not None

    async def emit(api: FakeAPI, obj: dict[str, Any], **kw: Any) -> None:
        api.objects.setdefault("events", {"items": []})["items"].append(kw)

    for name, fn in (("get", get), ("apply", apply), ("merge_patch", merge_patch), ("delete", delete)):
        monkeypatch.setattr(rest, name, fn)
    monkeypatch.setattr(events, "emit", emit)
    local = clusters["local"]
    local.put("/api/v1/namespaces/team", {"metadata": {"name": "team"}})
    return clusters


class FakeRemotes(Remotes):
    def __init__(self, world: dict[str, FakeAPI]) -> None:
        super().__init__()
        self.world = world

    async def for_provider(self, local_api: Any, provider: ClusterID) -> FakeAPI | None:
        return self.world.get(provider)

    async def drop(self, provider: str) -> None:
        pass


def controller(world: dict[str, FakeAPI], offloading_spec: dict[str, Any]) -> OffloadingController:
    c = OffloadingController(world["local"], ClusterID("c"))
    c.remotes = FakeRemotes(world)
    c.virtual_nodes = dict(NODES)
    c.providers = {"a", "b"}
    world["local"].put(
        NS_PATH,
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading", "namespace": "team", "generation": 1},
            "spec": offloading_spec,
        },
    )
    return c


async def test_offload_selects_one_provider_and_reports_its_twin(world: dict[str, FakeAPI]) -> None:
    c = controller(world, {"clusterSelector": ON_B, "namespaceMappingStrategy": "EnforceSameName"})
    world["a"].put(TWIN_REQ, {"metadata": {"name": "team"}, "spec": {"namespace": "team"}})  # selected before
    wait = await c.reconcile("team")
    local = world["local"].objects
    assert FINALIZER in local[NS_PATH]["metadata"]["finalizers"]
    assert local["/api/v1/namespaces/team"]["metadata"]["labels"] == {OFFLOADING_LABEL: "LocalAndRemote"}
    assert world["b"].objects[TWIN_REQ]["spec"] == {"namespace": "team", "twinName": "team"}
    assert TWIN_REQ not in world["a"].objects, "a provider no longer selected loses its twin"
    st = local[NS_PATH]["status"]
    # The removal shows until the provider confirms it (the next pass finds the request gone).
    assert st["phase"] == "Pending" and [(r["clusterId"], r["phase"]) for r in st["remoteNamespaces"]] == [
        ("b", "Pending"),
        ("a", "Terminating"),
    ]
    assert wait == c.settings.pending_poll_s

    world["b"].objects[TWIN_REQ]["status"] = {
        "phase": "Ready",
        "twin": "team",
        "conditions": [{"type": "Ready", "status": "True", "message": "twin namespace team is ready"}],
    }
    assert await c.reconcile("team") == c.settings.resync_s
    st = local[NS_PATH]["status"]
    assert st["phase"] == "Ready" and st["remoteNamespaces"][0] == {
        "clusterId": "b",
        "namespace": "team",
        "phase": "Ready",
        "message": "twin namespace team is ready",
    }
    assert (st["conditions"][0]["type"], st["conditions"][0]["status"]) == ("Ready", "True")
    assert {x["observedGeneration"] for x in st["conditions"]} == {1}
    local[NS_PATH]["metadata"]["generation"] = 2  # a spec change: the status follows it
    await c.reconcile("team")
    st = local[NS_PATH]["status"]
    assert st["observedGeneration"] == 2 and {x["observedGeneration"] for x in st["conditions"]} == {2}


async def test_unreachable_provider_is_a_condition_and_a_retry(world: dict[str, FakeAPI]) -> None:
    c = controller(world, {})
    world["b"].down = True
    assert await c.reconcile("team") == c.settings.unreachable_retry_s
    st = world["local"].objects[NS_PATH]["status"]
    assert {r["clusterId"]: r["phase"] for r in st["remoteNamespaces"]} == {"a": "Pending", "b": "Unreachable"}
    reach = next(x for x in st["conditions"] if x["type"] == "ProvidersReachable")
    assert reach["status"] == "False" and "b" in reach["message"]


async def test_a_quota_not_counted_yet_on_the_provider_is_pending_not_unreachable(world: dict[str, FakeAPI]) -> None:
    c = controller(world, {"clusterSelector": ON_B})
    world["b"].fails = KubeError(
        'twinnamespaces.gpufed.io "team" is forbidden: status unknown for quota: gpufed-grant, '
        "resources: count/twinnamespaces.gpufed.io",
        status=403,
    )
    assert await c.reconcile("team") == c.settings.pending_poll_s
    st = world["local"].objects[NS_PATH]["status"]
    (remote,) = st["remoteNamespaces"]
    assert remote["phase"] == "Pending" and "quota controller has not counted" in remote["message"]
    reach = next(x for x in st["conditions"] if x["type"] == "ProvidersReachable")
    assert reach["status"] == "True"
    # another 403 is no such case: the provider refuses us, which is reported as unreachable
    world["b"].fails = KubeError('twinnamespaces.gpufed.io "team" is forbidden: User cannot create', status=403)
    assert await c.reconcile("team") == c.settings.unreachable_retry_s
    world["b"].fails = None
    await c.reconcile("team")
    assert TWIN_REQ in world["b"].objects


async def test_refusal_is_an_event(world: dict[str, FakeAPI]) -> None:
    c = controller(world, {"clusterSelector": ON_B})
    await c.reconcile("team")
    world["b"].objects[TWIN_REQ]["status"] = {
        "phase": "Refused",
        "conditions": [{"type": "Ready", "status": "False", "message": "namespace taken"}],
    }
    await c.reconcile("team")
    await c.reconcile("team")
    assert world["local"].objects[NS_PATH]["status"]["phase"] == "Failed"
    evs = world["local"].objects["events"]["items"]
    assert len(evs) == 1 and evs[0]["reason"] == "TwinRefused" and "namespace taken" in evs[0]["message"]


async def test_deletion_waits_for_reachable_providers_not_for_unpeered_ones(world: dict[str, FakeAPI]) -> None:
    c = controller(world, {})
    await c.reconcile("team")
    assert TWIN_REQ in world["a"].objects and TWIN_REQ in world["b"].objects
    world["local"].objects[NS_PATH]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world["a"].down = True
    assert await c.reconcile("team") == c.settings.unreachable_retry_s
    local = world["local"].objects
    assert FINALIZER in local[NS_PATH]["metadata"]["finalizers"] and TWIN_REQ not in world["b"].objects
    assert local[NS_PATH]["status"]["phase"] == "Terminating"
    # Provider a is unpeered meanwhile: its tenant namespace (and the request) went with the peering.
    c.providers.discard("a")
    assert await c.reconcile("team") is None
    assert FINALIZER not in local[NS_PATH]["metadata"]["finalizers"]
    assert OFFLOADING_LABEL not in (local["/api/v1/namespaces/team"]["metadata"].get("labels") or {})


# ---------------------------------------------------------------------------- what virtual kubelets may see

RB_PATH = "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings/gpufed-reflection"


async def test_the_reflection_binding_exists_only_while_some_provider_is_given_the_namespace(
    world: dict[str, FakeAPI],
) -> None:
    c = controller(world, {"podOffloadingStrategy": "Local"})
    await c.reconcile("team")
    assert RB_PATH not in world["local"].objects, "offloaded nowhere: no virtual kubelet reads its Secrets"
    world["local"].objects[NS_PATH]["spec"] = {}
    await c.reconcile("team")
    assert RB_PATH in world["local"].objects
    c.virtual_nodes = {}  # no provider matches any more; their twins go
    await c.reconcile("team")
    assert RB_PATH in world["local"].objects, "kept while the twins are being removed"
    await c.reconcile("team")
    assert RB_PATH not in world["local"].objects


async def test_a_provider_being_removed_is_never_listed_as_given_the_namespace(world: dict[str, FakeAPI]) -> None:
    """The status is the consumer's record the virtual kubelets follow (vkprovider.remote.offloaded): a
    deselected provider that does not answer stays `Terminating`, never `Unreachable` like a selected one."""
    c = controller(world, {})
    await c.reconcile("team")
    world["local"].objects[NS_PATH]["spec"] = {"clusterSelector": ON_B}
    world["a"].down = True
    assert await c.reconcile("team") == c.settings.unreachable_retry_s
    st = world["local"].objects[NS_PATH]["status"]
    assert {r["clusterId"]: r["phase"] for r in st["remoteNamespaces"]} == {"a": "Terminating", "b": "Pending"}
    reach = next(x for x in st["conditions"] if x["type"] == "ProvidersReachable")
    assert reach["status"] == "False" and "a" in reach["message"]
