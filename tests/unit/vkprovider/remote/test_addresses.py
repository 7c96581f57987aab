"""`remote.addresses`: the addresses a provider reports for twins are checked."""

from __future__ import annotations

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL
from tests.unit.fakes import until
from tests.unit.vkprovider.remote.worlds import CONSUMER, World, pod
from vkprovider.node.provider import Twin


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
