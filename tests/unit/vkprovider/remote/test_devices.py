"""The consumer's claims as the pool nodes see them (vkprovider.remote.devices.ClaimCache): which
gpufed devices each pool node's claims hold, and a wake-up whenever that changes."""

from __future__ import annotations

from typing import Any

from gpufed.apis.wire import DRA_DRIVER
from vkprovider.remote.devices import ClaimCache, held_devices


def claim(name: str, *results: tuple[str, str, str]) -> dict[str, Any]:
    allocation = {"devices": {"results": [{"driver": d, "pool": p, "device": x} for d, p, x in results]}}
    return {"metadata": {"namespace": "team", "name": name}, "status": {"allocation": allocation} if results else {}}


def test_held_devices_are_gpufeds_only() -> None:
    c = claim("c", (DRA_DRIVER, "gpufed-a", "g1-0"), ("gpu.nvidia.com", "real-node", "gpu-0"))
    assert held_devices(c) == [("gpufed-a", "g1-0")]


def test_the_cache_tracks_held_devices_per_pool_node_and_wakes_on_change() -> None:
    cache = ClaimCache(api=None)
    woken: list[int] = []
    cache.listeners.append(lambda: woken.append(1))
    cache._on_claim("ADDED", claim("pending"))
    assert woken == [] and cache.held("gpufed-a") == set()
    cache._on_claim("MODIFIED", claim("pending", (DRA_DRIVER, "gpufed-a", "g1-0")))
    cache._on_claim("ADDED", claim("other", (DRA_DRIVER, "gpufed-b", "g2-3")))
    assert cache.held("gpufed-a") == {"g1-0"} and len(woken) == 2
    cache._on_claim("MODIFIED", claim("pending", (DRA_DRIVER, "gpufed-a", "g1-0")))  # a status write elsewhere
    assert len(woken) == 2
    assert cache.held_count(lambda pool: pool.startswith("gpufed-")) == 2
    cache._on_claim("DELETED", claim("pending", (DRA_DRIVER, "gpufed-a", "g1-0")))
    assert cache.held("gpufed-a") == set() and len(woken) == 3
    assert ("team", "pending") not in cache.claims
