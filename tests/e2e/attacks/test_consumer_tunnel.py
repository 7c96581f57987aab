"""Attacks through the WireGuard tunnel, from the consumer's position, with real packets.

The consumer controls its cluster and its end of the tunnel. Here it has taken its gateway over: its
agent is stopped, the filter chains of its own table are deleted, its WireGuard device sends every
destination to the provider (allowed IPs 0.0.0.0/0) and it routes the provider's API server address
into the tunnel. The provider's gateway must forward only to the consumer's twin pods (and what the
provider exposed): a pod of the provider's own at an address of its pod range, and its API server,
are refused — dropped by the provider's filter, counted in its nftables counter and in
`gpufed_gateway_dropped_packets_total` of the provider's agent — and no packet reaches the victim.
The twin pod still answers the consumer.

Topology (tests/e2e/test_fabric.py's `Fabric`, plus victims linked to the provider's gateway as its
cluster would route them):

    c-pod (10.244.1.10) ─ c-gw ══ WireGuard over the underlay ══ p-gw ─┬─ p-pod (the twin's podIP)
                                                                       └─ victims (a non-twin pod, the API server)
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network

import pytest

from tests.e2e.attacks.test_network_tunnel import Tunnel, _attack, _free_port, clean_up, take_over
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, peered_session
from tests.e2e.test_fabric import Fabric, _missing, offload_a_pod, sh

pytestmark = pytest.mark.timeout(900)


def _seen_from_the_consumer(t: Tunnel, real: str) -> str:
    """The address at which the consumer reaches the provider's pod address `real` (its remapped twin)."""
    rn = t.fabric.remote_network("consumer")
    offset = int(IPv4Address(real)) - int(IPv4Network(rn["real"]["podCidr"]).network_address)
    return str(IPv4Network(rn["mapped"]["podCidr"]).network_address + offset)


@pytest.fixture(scope="module")
def tunnel(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tunnel]:
    missing = _missing()
    if missing:
        pytest.fail("the data-plane tests cannot run on this machine: " + "; ".join(missing), pytrace=False)
    for ids in peered_session(clusters, {"gpu-a": ("--gpus", "8")}):
        f = Fabric(clusters, ids, secrets.token_hex(2), tmp_path_factory.mktemp("ctunnel"))
        api = clusters.kubectl_json("gpu-a", "get", "service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
        t = Tunnel(f, _free_port(), {"papi": str(api)}, defender="gpu-a")
        extra: list[str] = []
        try:
            f.build()
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("GPUFED_METRICS_PORT", str(t.metrics_port))
                mp.setenv("GPUFED_METRICS_HOST", "127.0.0.1")
                f.start_agent("gpu-a")
            f.start_agent("consumer")
            f.serve("cpod", "10.244.1.10")
            f.wait_phase("Connected")
            t.pod = offload_a_pod(f, f"ctunnel-{f.tag}", with_service=False)
            # a pod of the provider's own, in its real pod range, that is no twin of the consumer's
            provider_pods = IPv4Network(f.remote_network("consumer")["real"]["podCidr"])
            t.victims["pother"] = str(provider_pods.broadcast_address - 2)
            assert t.victims["pother"] != t.pod[2], "the address chosen for a non-twin pod is the twin's"
            for role, address in t.victims.items():
                sh("ip", "netns", "add", f.ns(role))
                extra.append(f.ns(role))
                sh("ip", "-n", f.ns(role), "link", "set", "lo", "up")
                f.link("pgw", role, address)
                f.serve(role, address)
            _ns, local_ip, _twin = t.pod
            # before the takeover: the twin answers the consumer pod (the legitimate path)
            eventually("the twin answers the consumer pod", lambda: f.curl("cpod", local_ip, 2))  # noqa: B023
            # the API server's address is routed in; the non-twin pod is reached at its remapped address
            take_over(t, "cgw", t.provider_id, "consumer", routed=[t.victims["papi"]])
            yield t
        except BaseException:
            print(f.diagnostics())
            raise
        finally:
            clean_up(t, extra)


def test_consumer_pod_cannot_reach_a_provider_pod_that_is_no_twin(tunnel: Tunnel) -> None:
    _attack(tunnel, "pother", _seen_from_the_consumer(tunnel, tunnel.victims["pother"]))


def test_consumer_pod_cannot_reach_the_provider_api_server(tunnel: Tunnel) -> None:
    _attack(tunnel, "papi", tunnel.victims["papi"])


def test_the_twin_still_answers_the_consumer_through_the_providers_filter(tunnel: Tunnel) -> None:
    f = tunnel.fabric
    _ns, local_ip, _twin = tunnel.pod
    dropped = tunnel.dropped_counter()
    eventually("the twin answers the consumer pod", lambda: f.curl("cpod", local_ip, 2), timeout=30)
    assert tunnel.dropped_counter() == dropped, "the provider's filter dropped legitimate packets"
