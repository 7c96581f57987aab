"""NamespaceOffloading and TwinNamespace.twinName: validation, selector matching, generated CRD rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpufed.apis.kinds import KINDS
from gpufed.apis.offloading import (
    NamespaceOffloading,
    NamespaceOffloadingSpec,
    NodeSelector,
    OffloadPodSecurity,
    TwinNamespaceSpec,
    reserved_namespace,
)
from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.devtools import crdgen

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"


def spec(**kw: Any) -> NamespaceOffloadingSpec:
    return NamespaceOffloadingSpec.model_validate(kw)


def test_defaults_and_twin_names() -> None:
    s = spec()
    assert s.pod_offloading_strategy == "LocalAndRemote" and s.namespace_mapping_strategy == "DefaultName"
    assert s.twin_name("team-a") is None
    assert spec(namespaceMappingStrategy="EnforceSameName").twin_name("team-a") == "team-a"
    assert spec(namespaceMappingStrategy="SelectedName", remoteNamespaceName="x").twin_name("team-a") == "x"


def test_remote_name_only_with_selected_name() -> None:
    with pytest.raises(ValidationError, match="only allowed with"):
        spec(namespaceMappingStrategy="SelectedName")
    with pytest.raises(ValidationError, match="only allowed with"):
        spec(remoteNamespaceName="x")
    with pytest.raises(ValidationError):
        spec(podOffloadingStrategy="Sometimes")
    with pytest.raises(ValidationError, match="pattern"):
        spec(namespaceMappingStrategy="SelectedName", remoteNamespaceName="Not_A_Label")


def test_selector_requirements_check_their_values() -> None:
    def sel(op: str, values: list[str]) -> NodeSelector:
        expr = {"key": "k", "operator": op, "values": values}
        return NodeSelector.model_validate({"nodeSelectorTerms": [{"matchExpressions": [expr]}]})

    with pytest.raises(ValidationError, match="at least one value"):
        sel("In", [])
    with pytest.raises(ValidationError, match="takes no values"):
        sel("Exists", ["x"])
    with pytest.raises(ValidationError, match="an integer"):
        sel("Gt", ["many"])
    assert sel("Gt", ["4"]).matches({"k": "8"}) and not sel("Gt", ["4"]).matches({"k": "2"})
    assert sel("Lt", ["4"]).matches({"k": "2"}) and not sel("Lt", ["4"]).matches({"k": "x"})
    assert sel("Exists", []).matches({"k": ""}) and not sel("Exists", []).matches({})
    assert sel("DoesNotExist", []).matches({}) and sel("NotIn", ["a"]).matches({})


def test_selector_matching_is_node_affinity() -> None:
    empty = NodeSelector()
    assert empty.matches({}) and empty.matches({"anything": "x"})
    s = NodeSelector.model_validate(
        {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [H100]},
                        {"key": "gpufed.io/remote-cluster-id", "operator": "NotIn", "values": ["gpu-c-1"]},
                    ]
                },
                {"matchExpressions": [{"key": "gpufed.io/remote-cluster-id", "operator": "In", "values": ["gpu-b-1"]}]},
            ]
        }
    )
    assert s.matches({GPU_PRODUCT_LABEL: H100, "gpufed.io/remote-cluster-id": "gpu-a-1"})
    assert not s.matches({GPU_PRODUCT_LABEL: H100, "gpufed.io/remote-cluster-id": "gpu-c-1"})
    assert s.matches({GPU_PRODUCT_LABEL: A100, "gpufed.io/remote-cluster-id": "gpu-b-1"})
    assert not s.matches({GPU_PRODUCT_LABEL: A100})
    # A term without expressions matches nothing, as in Kubernetes.
    assert not NodeSelector.model_validate({"nodeSelectorTerms": [{}]}).matches({})


def test_twin_name_is_a_label_and_not_reserved() -> None:
    assert TwinNamespaceSpec.model_validate({"namespace": "a", "twinName": "b"}).twin_name == "b"
    assert TwinNamespaceSpec.model_validate({"namespace": "a"}).twin_name is None
    for bad in ("kube-system", "gpufed", "default", "gpufed-tenant-x", "Upper", "x" * 64):
        with pytest.raises(ValidationError):
            TwinNamespaceSpec.model_validate({"namespace": "a", "twinName": bad})


def test_crd_enforces_the_name_and_the_remote_name_rule() -> None:
    crd = crdgen.crd(NamespaceOffloading)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert crd["spec"]["scope"] == "Namespaced"
    assert schema["x-kubernetes-validations"][0]["rule"] == "self.metadata.name == 'offloading'"
    assert "remoteNamespaceName" in schema["properties"]["spec"]["x-kubernetes-validations"][0]["rule"]
    cols = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert cols == ["Pods", "Mapping", "Phase", "Ready", "Age"]
    assert NamespaceOffloading in KINDS


@pytest.mark.parametrize(
    "name,reserved",
    [
        ("default", True),
        ("kube-system", True),
        ("kube-anything", True),
        ("gpufed", True),
        ("gpufed-tenant-x", True),
        ("gpufed-future", True),
        ("team-a-consumer", False),
        ("kubeflow", False),
    ],
)
def test_reserved_namespaces(name: str, reserved: bool) -> None:
    assert reserved_namespace(name) is reserved


def test_the_pod_security_options_are_checked() -> None:
    policy = OffloadPodSecurity.model_validate(
        {
            "level": "restricted",
            "allowHostPorts": True,
            "allowedVolumeTypes": ["nfs", "csi", "nfs"],
            "allowedTolerations": ["dedicated", "example.com/gpu-only"],
            "allowedPriorityClasses": ["batch"],
        }
    )
    assert policy.level == "restricted" and policy.allowed_volume_types == ["csi", "nfs"]
    for bad in (
        {"level": "privileged"},
        {"allowedVolumeTypes": ["hostPath"]},
        {"allowedVolumeTypes": ["NFS volume"]},
        {"allowedTolerations": [""]},
        {"allowedPriorityClasses": ["Not_A_Name"]},
    ):
        with pytest.raises(ValidationError):
            OffloadPodSecurity.model_validate(bad)
