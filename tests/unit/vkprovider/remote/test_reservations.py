"""GangReservations: which pods hold GPUs back on which pool node, from the gang controller's marks."""

from __future__ import annotations

from typing import Any

from gpufed.apis.wire import GANG_GATE, GANG_LABEL, GANG_RESERVE_ANNOTATION
from vkprovider.remote.reservations import GangReservations, reserved_on


def marked(name: str, node: str | None = "gpufed-a-h100", gpus: Any = "8", **spec: Any) -> dict[str, Any]:
    annotations = {GANG_RESERVE_ANNOTATION: node} if node is not None else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "labels": {GANG_LABEL: "g"},
            "annotations": annotations,
        },
        "spec": {
            "schedulingGates": [{"name": GANG_GATE}],
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def test_only_gated_unbound_live_pods_hold_gpus_back() -> None:
    assert reserved_on(marked("a")) == "gpufed-a-h100"
    assert reserved_on(marked("a", node=None)) is None
    assert reserved_on(marked("a", nodeName="gpufed-a-h100")) is None  # bound: counted as a pod there
    assert reserved_on(marked("a", schedulingGates=[{"name": "example.com/other"}])) is None
    going = marked("a")
    going["metadata"]["deletionTimestamp"] = "2026-11-28T10:00:00Z"
    assert reserved_on(going) is None
    done = marked("a")
    done["status"]["phase"] = "Failed"
    assert reserved_on(done) is None


def test_reservations_per_node_and_listeners_told_only_of_changes() -> None:
    r = GangReservations(api=None)
    told: list[str] = []
    r.listeners.append(told.append)
    r.on_pod("ADDED", marked("a"))
    r.on_pod("ADDED", marked("b", gpus="4"))
    r.on_pod("ADDED", marked("c", node="gpufed-b"))
    r.on_pod("ADDED", marked("bad", gpus="lots"))  # a malformed request holds nothing
    assert r.reserved("gpufed-a-h100") == (8, 4) and r.reserved("gpufed-b") == (8,)
    assert told == ["gpufed-a-h100", "gpufed-a-h100", "gpufed-b", "gpufed-a-h100"]
    told.clear()
    r.on_pod("MODIFIED", marked("a"))  # nothing changed
    assert told == []
    r.on_pod("MODIFIED", marked("a", node="gpufed-b"))  # moved: both nodes change
    assert sorted(told) == ["gpufed-a-h100", "gpufed-b"] and r.reserved("gpufed-b") == (8, 8)
    told.clear()
    r.on_pod("MODIFIED", marked("b", nodeName="gpufed-a-h100"))  # bound: leaves the watch's selection
    r.on_pod("DELETED", marked("c", node="gpufed-b"))
    assert r.reserved("gpufed-a-h100") == () and r.reserved("gpufed-b") == (8,)
    assert told == ["gpufed-a-h100", "gpufed-b"]
