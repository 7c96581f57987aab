"""gpufed.kube.metrics: the metrics server (a real aiohttp server on 127.0.0.1, scraped and parsed
with prometheus_client's parser), `serving`, and the StateGauge / GaugeMap helpers (own registries)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from gpufed import defaults
from gpufed.apis.quantity import resource_unit
from gpufed.app.controller import ControllerSettings
from gpufed.kube.metrics import GaugeMap, MetricsServer, MetricsServerError, StateGauge, serving
from tests.unit.fakes import running, until


async def _get(port: int, path: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_the_server_serves_the_registry_and_healthz_until_cancelled() -> None:
    registry = CollectorRegistry()
    calls = Counter("gpufed_test_calls_total", "Calls.", ["outcome"], registry=registry)
    calls.labels("ok").inc(3)
    server = MetricsServer(0, "127.0.0.1", registry)
    async with running(server.run()):
        await until(server.ready.is_set, what="metrics server listening")
        port = server.port
        assert port != 0
        status, content_type, text = await _get(port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        (sample,) = [s for s in families["gpufed_test_calls"].samples if s.name == "gpufed_test_calls_total"]
        assert (sample.labels, sample.value) == ({"outcome": "ok"}, 3.0)
        calls.labels("ok").inc()
        assert 'gpufed_test_calls_total{outcome="ok"} 4.0' in (await _get(port, "/metrics"))[2]
        assert (await _get(port, "/healthz"))[::2] == (200, "ok")
        assert (await _get(port, "/nothing"))[0] == 404
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(port, "/healthz")


async def test_serving_listens_before_the_block_and_stops_after_it() -> None:
    registry = CollectorRegistry()
    Gauge("gpufed_test_level", "A level.", registry=registry).set(7)
    async with serving(0, "127.0.0.1", registry) as server:
        assert server is not None and server.ready.is_set()
        text = (await _get(server.port, "/metrics"))[2]
        assert [s.value for f in text_string_to_metric_families(text) for s in f.samples] == [7.0]
        port = server.port
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(port, "/metrics")


async def test_serving_without_a_port_serves_nothing() -> None:
    async with serving(None) as server:
        assert server is None


async def test_a_busy_port_is_a_clear_error_at_the_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsServerError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            async with serving(port, "127.0.0.1"):
                pytest.fail("the block must not run")


async def test_cancelling_the_block_cancels_the_caller_too() -> None:
    entered = asyncio.Event()

    async def hold() -> None:
        async with serving(0, "127.0.0.1", CollectorRegistry()):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.values()): s.value for f in registry.collect() for s in f.samples if s.name == name}


def test_state_gauge_is_one_for_the_current_state_and_drops_a_thing_that_is_gone() -> None:
    registry = CollectorRegistry()
    phase = StateGauge(Gauge("gpufed_test_phase", "Phase.", ["peer", "phase"], registry=registry), ("A", "B"))
    phase.set("A", "p1")
    assert _samples(registry, "gpufed_test_phase") == {("p1", "A"): 1, ("p1", "B"): 0}
    phase.set("Other", "p1")  # a state not declared is exported too, and kept at 0 afterwards
    phase.set("B", "p1")
    phase.set("A", "p2")
    assert _samples(registry, "gpufed_test_phase") == {
        ("p1", "A"): 0,
        ("p1", "B"): 1,
        ("p1", "Other"): 0,
        ("p2", "A"): 1,
        ("p2", "B"): 0,
    }
    phase.remove("p1")
    phase.remove("never-seen")
    assert _samples(registry, "gpufed_test_phase") == {("p2", "A"): 1, ("p2", "B"): 0}


def test_gauge_map_exports_a_whole_mapping_and_removes_keys_that_went() -> None:
    registry = CollectorRegistry()
    granted = GaugeMap(Gauge("gpufed_test_granted", "Granted.", ["peer", "resource"], registry=registry))
    granted.set({"cpu": 4, "nvidia.com/gpu": 8}, "p1")
    granted.set({"cpu": 1}, "p2")
    granted.set({"nvidia.com/gpu": 6}, "p1")
    assert _samples(registry, "gpufed_test_granted") == {("p1", "nvidia.com/gpu"): 6, ("p2", "cpu"): 1}
    granted.remove("p1")
    assert _samples(registry, "gpufed_test_granted") == {("p2", "cpu"): 1}


def test_a_gauge_map_with_units_says_each_keys_unit_in_a_label() -> None:
    registry = CollectorRegistry()
    labels = ["peer", "resource", "unit"]
    granted = GaugeMap(Gauge("gpufed_test_units", "Granted.", labels, registry=registry), resource_unit)
    granted.set({"cpu": 4, "memory": 2**30, "nvidia.com/gpu": 8, "hugepages-2Mi": 2**21}, "p1")
    assert _samples(registry, "gpufed_test_units") == {
        ("p1", "cpu", "core"): 4,
        ("p1", "memory", "byte"): 2**30,
        ("p1", "nvidia.com/gpu", "integer"): 8,
        ("p1", "hugepages-2Mi", "byte"): 2**21,
    }
    granted.set({"cpu": 2}, "p1")
    assert _samples(registry, "gpufed_test_units") == {("p1", "cpu", "core"): 2}
    assert resource_unit("requests.storage") == "byte" and resource_unit("pods") == "integer"


def _outward_address() -> str | None:
    """An address of this machine other than loopback (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the route picks the source address
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


async def test_by_default_metrics_listen_on_loopback_only() -> None:
    """/metrics answers anyone who connects: unless a host is asked for, only this machine can."""
    assert defaults.METRICS_HOST == "127.0.0.1"
    assert ControllerSettings(kubeconfig=None).metrics_host == "127.0.0.1"
    async with serving(0, registry=CollectorRegistry()) as server:
        assert server is not None and server.host == "127.0.0.1"
        assert (await _get(server.port, "/healthz"))[0] == 200
        outward = _outward_address()
        if outward is not None:
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((outward, server.port)) != 0, f"/metrics answered on {outward}"
