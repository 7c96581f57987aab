"""The demo's story without clusters: the pure pieces of its checks."""

from __future__ import annotations

from typing import Any

from gpufed.localenv.story import ready_endpoints


def test_ready_endpoints_of_endpoint_slices() -> None:
    slices: list[dict[str, Any]] = [
        {
            "endpoints": [
                {"addresses": ["10.66.1.2"], "conditions": {"ready": True}, "targetRef": {"name": "b"}},
                {"addresses": ["10.64.1.5"], "targetRef": {"name": "a"}},
                {"addresses": ["10.64.1.9"], "conditions": {"ready": False}, "targetRef": {"name": "c"}},
            ]
        },
        {"endpoints": None},
    ]
    assert ready_endpoints(slices) == [("10.64.1.5", "a"), ("10.66.1.2", "b")]
