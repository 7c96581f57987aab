"""The virtual nodes' address in the local environment: which addresses the API server may proxy to,
which are this machine's, and what the controller is told to publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufed.localenv import components, nodeaddr
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import TopologyError, default_topology, load_topology


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("198.18.0.1", True),
        ("10.1.2.3", True),
        ("127.0.0.1", False),
        ("127.5.0.1", False),
        ("::1", False),
        ("169.254.1.1", False),
        ("0.0.0.0", False),
        ("not-an-ip", False),
    ],
)
def test_the_api_server_proxies_to_no_loopback_or_link_local_address(address: str, ok: bool) -> None:
    assert nodeaddr.proxyable(address) is ok


def test_loopback_is_local_and_a_documentation_address_is_not() -> None:
    assert nodeaddr.is_local("127.0.0.1")
    assert not nodeaddr.is_local("192.0.2.222")  # TEST-NET-1, never assigned here by the tests


def test_an_address_already_here_needs_nothing() -> None:
    assert nodeaddr.ensure("127.0.0.1") is None


def test_without_root_ensure_says_why_and_loopback_is_chosen_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    why = nodeaddr.ensure("192.0.2.222")
    assert why is not None and "needs root" in why and "192.0.2.222" in why
    address, warning = nodeaddr.choose("192.0.2.222")
    assert address == "127.0.0.1" and warning is not None and "needs root" in warning and "proxy" in warning
    assert nodeaddr.choose("127.0.0.1") == ("127.0.0.1", None)  # asked for: no warning


def test_the_controller_publishes_the_address_up_chose(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    spec = env.topology.cluster("consumer")
    ports = env.topology.ports("consumer")
    # Before `up` chose one: loopback.
    assert "--node-address=127.0.0.1" in components.command(env, spec, ports, components.CONTROLLER, audit=False)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.json").write_text(json.dumps({"node_address": "198.18.0.1"}))
    assert "--node-address=198.18.0.1" in components.command(env, spec, ports, components.CONTROLLER, audit=False)


def test_the_topology_names_the_node_address(tmp_path: Path) -> None:
    assert default_topology().node_address == nodeaddr.DEFAULT_NODE_ADDRESS
    p = tmp_path / "t.yaml"
    cluster = "clusters:\n- name: one\n  nodePools:\n  - {name: cpu, count: 1}\n"
    p.write_text(cluster + "nodeAddress: 10.9.9.9\n")
    assert load_topology(p).node_address == "10.9.9.9"
    p.write_text(cluster + "nodeAddress: nine\n")
    with pytest.raises(TopologyError, match="nodeAddress"):
        load_topology(p)
