"""The consumer API address offloaded pods are given (KUBERNETES_SERVICE_HOST/PORT)."""

from __future__ import annotations

import pytest

from gpufed.app.virtual_kubelet import VirtualKubeletError, api_endpoint


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
