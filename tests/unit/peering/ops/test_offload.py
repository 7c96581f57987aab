"""`gpufed offload-namespace` input: selector expressions and the spec, refused before any I/O."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from peering.ops.offload import OffloadError, OffloadRequest, build_spec, parse_selector


def exprs(*raw: str) -> list[dict[str, object]]:
    sel = parse_selector(raw)
    assert sel is not None
    terms = sel["nodeSelectorTerms"]
    assert len(terms) == 1
    return list(terms[0]["matchExpressions"])


def test_selector_forms() -> None:
    assert parse_selector([]) is None
    assert exprs("nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB") == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-40GB"]}
    ]
    assert exprs("zone==z1", "zone != z2") == [
        {"key": "zone", "operator": "In", "values": ["z1"]},
        {"key": "zone", "operator": "NotIn", "values": ["z2"]},
    ]
    assert exprs("gpufed.io/remote-cluster-id in (a-1, b-2)") == [
        {"key": "gpufed.io/remote-cluster-id", "operator": "In", "values": ["a-1", "b-2"]}
    ]
    assert exprs("tier NotIn (x)")[0]["operator"] == "NotIn"
    assert exprs("nvidia.com/gpu.memory>40000")[0] == {
        "key": "nvidia.com/gpu.memory",
        "operator": "Gt",
        "values": ["40000"],
    }
    assert exprs("count<3")[0]["operator"] == "Lt"
    assert exprs("nvidia.com/mig.capable") == [{"key": "nvidia.com/mig.capable", "operator": "Exists"}]
    assert exprs("!nvidia.com/mig.capable") == [{"key": "nvidia.com/mig.capable", "operator": "DoesNotExist"}]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("a=b=c", "cannot parse"),
        ("in (a)", "cannot parse"),
        ("key in ()", "at least one value"),
        ("mem>lots", "integer"),
        ("key=", "empty value"),
        ("bad key=x", "cannot parse"),
        ("/x=1", "cannot parse"),
    ],
)
def test_bad_selectors(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_selector([raw])


def req(**kw: Any) -> OffloadRequest:
    return dataclasses.replace(OffloadRequest(kubeconfig=Path("/nonexistent"), namespace="team"), **kw)


def test_spec_from_flags() -> None:
    s = build_spec(req(pod_strategy="Remote", selectors=("x=y",)))
    assert s.pod_offloading_strategy == "Remote" and s.cluster_selector.matches({"x": "y"})
    assert build_spec(req(mapping="SelectedName", remote_name="elsewhere")).twin_name("team") == "elsewhere"
    with pytest.raises(OffloadError, match="podOffloadingStrategy"):
        build_spec(req(pod_strategy="Sometimes"))
    with pytest.raises(OffloadError, match="only allowed with"):
        build_spec(req(remote_name="x"))
    with pytest.raises(OffloadError, match="cannot parse"):
        build_spec(req(selectors=("a=b=c",)))
