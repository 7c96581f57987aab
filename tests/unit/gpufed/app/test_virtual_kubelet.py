"""The consumer API address offloaded pods are given (KUBERNETES_SERVICE_HOST/PORT), which addresses a
provider may report for its twins (the fabric's ranges), and the provider labels allowed."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.network import CIDRPair, NetworkConfigSpec, RemoteNetworkSpec
from gpufed.apis.wire import NODE_LABELS_ANNOTATION
from gpufed.app.virtual_kubelet import (
    FabricAddresses,
    VirtualKubeletError,
    VirtualKubeletSettings,
    api_endpoint,
    node_label_allow,
)
from netfabric.controllers.translator import LiveRemapper
from netfabric.plan import remapper


class Remap:
    def to_local_ip(self, ip: str) -> str:
        return ip

    def to_remote_ip(self, ip: str) -> str:
        return ip.replace("192.168.", "10.72.", 1)


@pytest.mark.parametrize(
    ("server", "want"),
    [
        ("https://192.168.1.10:6443", ("10.72.1.10", 6443)),  # an address goes through the translator
        ("https://api.example.com", ("api.example.com", 443)),  # a name does not
        ("192.168.1.10:8443", ("10.72.1.10", 8443)),  # host:port as --consumer-api-server takes it
        ("https://[fd00::1]:6443", ("fd00::1", 6443)),
    ],
)
def test_api_endpoint(server: str, want: tuple[str, int]) -> None:
    assert api_endpoint(server, Remap()) == want


def test_api_endpoint_without_host_is_an_error() -> None:
    with pytest.raises(VirtualKubeletError, match="no host"):
        api_endpoint("https://:6443", Remap())


# ---------------------------------------------------------------- what a provider may report


def fabric(*, configured: bool = True) -> FabricAddresses:
    """Both clusters use 10.244.0.0/16 for pods: the consumer reaches gpu-a's pods at 10.70.0.0/16,
    and gpu-a reaches the consumer's at 10.71.0.0/16; the consumer's external range 10.72.0.0/16."""
    live = LiveRemapper(None, "gpu-a")
    if configured:
        live.current = remapper(
            NetworkConfigSpec(pod_cidr="10.244.0.0/16", external_cidr="10.72.0.0/16"),
            RemoteNetworkSpec(
                cluster_id="gpu-a",
                real=CIDRPair(pod_cidr="10.244.0.0/16", external_cidr="10.80.0.0/16"),
                mapped=CIDRPair(pod_cidr="10.70.0.0/16", external_cidr="10.81.0.0/16"),
                peer_view=CIDRPair(pod_cidr="10.71.0.0/16", external_cidr="10.73.0.0/16"),
            ),
        )
    return FabricAddresses(live)


def test_a_twin_address_must_lie_in_the_providers_pod_range() -> None:
    f = fabric()
    assert f.refuse_pod_ip("10.244.3.9") is None and f.to_local_ip("10.244.3.9") == "10.70.3.9"
    # A consumer pod as gpu-a reaches it: translated back, it would be a consumer pod's own IP.
    assert f.to_local_ip("10.71.1.10") == "10.244.1.10"
    assert "this cluster's own pods" in (f.refuse_pod_ip("10.71.1.10") or "")
    assert "exposes" in (f.refuse_pod_ip("10.73.0.1") or "")  # e.g. the consumer's API server, exposed
    assert "external range" in (f.refuse_pod_ip("10.80.0.5") or "")
    assert "outside the provider's pod range 10.244.0.0/16" in (f.refuse_pod_ip("10.96.0.1") or "")
    assert "no IPv4 address" in (f.refuse_pod_ip("fd00::7") or "")


def test_without_a_fabric_nothing_is_known_and_nothing_refused() -> None:
    assert fabric(configured=False).refuse_pod_ip("10.244.1.10") is None


def test_node_label_allow_list_from_flags_and_the_foreign_cluster() -> None:
    settings = VirtualKubeletSettings(kubeconfig=None, provider="gpu-a", node_name="gpufed-gpu-a")
    fc: dict[str, Any] = {"metadata": {"annotations": {NODE_LABELS_ANNOTATION: " example.com/rack, ,acme.io/*"}}}
    assert node_label_allow(fc, settings) == ("acme.io/*", "example.com/rack")
    flagged = VirtualKubeletSettings(
        kubeconfig=None, provider="gpu-a", node_name="gpufed-gpu-a", node_label_allow=("x.io/y",)
    )
    assert node_label_allow({"metadata": {}}, flagged) == ("x.io/y",)
