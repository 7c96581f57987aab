"""The network fabric's kinds: endpoints, CIDRs without host bits, disjoint and same-size ranges."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufed.apis.network import DEFAULT_GATEWAY_PORT, GatewaySpec, NetworkConfigSpec, RemoteNetworkSpec, split_endpoint


def test_split_endpoint_defaults_the_wireguard_port() -> None:
    assert split_endpoint("gw.example") == ("gw.example", DEFAULT_GATEWAY_PORT)
    assert split_endpoint("10.0.0.1:4242") == ("10.0.0.1", 4242)
    for bad in (":51820", "host:0", "host:65536", "host:x"):
        with pytest.raises(ValueError, match="host\\[:port\\]"):
            split_endpoint(bad)


def test_network_config_ranges() -> None:
    ok = NetworkConfigSpec.model_validate({"podCidr": "10.244.0.0/16", "gatewayEndpoint": "gw:51820"})
    assert ok.external_cidr == "10.70.0.0/16" and ok.pools == ["10.64.0.0/10"]
    with pytest.raises(ValidationError, match="no host bits"):
        NetworkConfigSpec.model_validate({"podCidr": "10.244.0.1/16"})
    with pytest.raises(ValidationError, match="overlaps podCidr"):
        NetworkConfigSpec.model_validate({"podCidr": "10.70.0.0/24"})
    with pytest.raises(ValidationError, match="outside externalCidr"):
        NetworkConfigSpec.model_validate(
            {"podCidr": "10.244.0.0/16", "externalIps": [{"address": "192.168.1.1", "externalAddress": "10.1.0.1"}]}
        )
    with pytest.raises(ValidationError, match="host\\[:port\\]"):
        NetworkConfigSpec.model_validate({"podCidr": "10.244.0.0/16", "gatewayEndpoint": "gw:0"})


def test_remote_network_mapping_keeps_the_size() -> None:
    pair = {"podCidr": "10.244.0.0/16", "externalCidr": "10.70.0.0/16"}
    same = RemoteNetworkSpec.model_validate({"clusterId": "gpu-a", "real": pair, "mapped": pair})
    assert same.peer_view is None
    with pytest.raises(ValidationError, match="must have the size"):
        RemoteNetworkSpec.model_validate(
            {"clusterId": "gpu-a", "real": pair, "mapped": {**pair, "podCidr": "10.100.0.0/24"}}
        )


def test_gateway_spec_checks_its_endpoint() -> None:
    base = {
        "clusterId": "gpu-a",
        "role": "Client",
        "tunnelAddress": "169.254.100.1",
        "peerTunnelAddress": "169.254.100.2",
        "privateKeySecret": "k",
        "publicKey": "p",
    }
    assert GatewaySpec.model_validate({**base, "endpoint": "gw"}).listen_port == DEFAULT_GATEWAY_PORT
    with pytest.raises(ValidationError):
        GatewaySpec.model_validate({**base, "endpoint": "gw:99999"})
