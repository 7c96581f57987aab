"""`offloaded_to`: the consumer's NamespaceOffloading status is the only record of which namespaces a
provider was given."""

from __future__ import annotations

from typing import Any

from vkprovider.remote.offloaded import OffloadedNamespaces, offloaded_to


def offloading(*entries: tuple[str, str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "offloading", "namespace": "payments"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    remote = [{"clusterId": c, "namespace": "payments-c", "phase": p, "message": ""} for c, p in entries]
    return {"metadata": meta, "status": {"remoteNamespaces": remote}}


def test_only_providers_the_consumer_selected_count() -> None:
    only_b = offloading(("gpu-b", "Ready"))
    assert offloaded_to(only_b, "gpu-b") and not offloaded_to(only_b, "gpu-a")
    for phase in ("Pending", "Ready", "Refused", "Unreachable"):
        assert offloaded_to(offloading(("gpu-a", phase)), "gpu-a"), phase
    assert not offloaded_to(offloading(("gpu-a", "Terminating")), "gpu-a"), "a provider being removed"
    assert not offloaded_to(offloading(("gpu-a", "Ready"), deleting=True), "gpu-a")
    assert not offloaded_to(None, "gpu-a")
    assert not offloaded_to({"metadata": {}, "status": {"remoteNamespaces": ["junk", None]}}, "gpu-a")


def test_changes_are_told_and_nothing_is_allowed_before_the_first_list() -> None:
    seen: list[str] = []
    record = OffloadedNamespaces(None, "gpu-a")
    record.listeners.append(seen.append)
    record._on_event("SYNC", offloading(("gpu-a", "Ready")))
    assert not record.allows("payments"), "not listed yet"
    record._on_synced()
    assert record.allows("payments") and seen == [""]
    record._on_event("MODIFIED", offloading(("gpu-a", "Terminating")))
    assert not record.allows("payments") and seen == ["", "payments"]
    record._on_event("MODIFIED", {"metadata": {"name": "other", "namespace": "x"}})
    assert seen == ["", "payments"], "only objects named `offloading` are NamespaceOffloadings"
