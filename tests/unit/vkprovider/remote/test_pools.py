"""`PoolView`: one pool node's view of the shared provider: notifications reach its subscribers,
and it sees only the twins of its own pool node."""

from __future__ import annotations

from typing import Any

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_NODE_LABEL, ORIGIN_UID_LABEL
from tests.unit.fakes import offloaded_here
from vkprovider.forge.pools import Pool
from vkprovider.remote.pools import PoolView, Usage
from vkprovider.remote.provider import RemoteProvider, RemoteSettings

CONSUMER = "consumer-1"
TWIN_NS = "team-consumer-1"


def twin(name: str, node: str) -> dict[str, Any]:
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: f"uid-{name}", ORIGIN_NODE_LABEL: node}
    return {
        "metadata": {"namespace": TWIN_NS, "name": name, "uid": f"remote-{name}", "labels": labels},
        "spec": {"nodeName": "gpu-node-1"},
        "status": {"phase": "Running"},
    }


def test_views_share_notifications_and_split_twins_by_pool_node() -> None:
    provider = RemoteProvider(None, None, RemoteSettings(consumer=CONSUMER, provider="gpu-a", node="gpufed-gpu-a"))
    offloaded_here(provider, "team")  # the consumer's own record: team is offloaded to gpu-a
    provider.claims.on_twin_namespace(
        "ADDED",
        {"metadata": {"name": "team"}, "spec": {"namespace": "team"}, "status": {"phase": "Ready", "twin": TWIN_NS}},
    )
    h100 = PoolView(provider, None, Pool("gpufed-gpu-a-h100", "H100"), lambda _node: Usage())
    a100 = PoolView(provider, None, Pool("gpufed-gpu-a-a100", "A100"), lambda _node: Usage(), draining=True)
    assert (h100.draining, a100.draining) == (False, True)
    assert h100.ready is provider.ready

    def broadcast(namespace: str, name: str) -> None:  # what gpufed.app.pools.PoolManager does
        for view in (h100, a100):
            view.notify(namespace, name)

    provider.subscribe(broadcast)
    seen: dict[str, list[tuple[str, str]]] = {"h100": [], "a100": []}
    h100.subscribe(lambda ns, name: seen["h100"].append((ns, name)))
    a100.subscribe(lambda ns, name: seen["a100"].append((ns, name)))

    provider._on_twin("ADDED", twin("train", "gpufed-gpu-a-h100"))

    assert seen == {"h100": [("team", "train")], "a100": [("team", "train")]}
    found = h100.twin("team", "train")
    assert found is not None and found.origin_uid == "uid-train"
    assert a100.twin("team", "train") is None
    assert [t.name for t in h100.twins()] == ["train"]
    assert a100.twins() == []
