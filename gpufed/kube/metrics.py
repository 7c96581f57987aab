"""Serving Prometheus metrics: a small aiohttp server and helpers the instrumented modules share.

Owns: `MetricsServer` (GET /metrics in the Prometheus text format from a prometheus_client
registry, GET /healthz -> "ok"; `run()` until cancelled, `ready` once it listens, the listener
closed in `finally`), `serving` (an optional server around a block: nothing when no port is given,
a bind failure raised at entry as `MetricsServerError`), `StateGauge` (one gauge series per
possible state of a thing, 1 for the state it is in, 0 for the others) and `GaugeMap` (a thing's
mapping, e.g. resource -> amount, as one series per key, keys that went away removed).

Invariants: the metric objects themselves live next to the code that updates them (module-level
prometheus_client objects, names prefixed `gpufed_`, labels of low cardinality — never pod names or
UIDs); this module defines only `gpufed_build_info` (1, labelled with gpufed's and Python's
versions), which every gpufed process serves. Scrapes only read the registry: nothing here blocks the loop for
longer than rendering the text.

Does not: know any gpufed domain, authenticate scrapers (it listens on loopback unless given
another host; the Helm chart binds every interface of the pod and leaves the fence to a
NetworkPolicy), or push anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import platform
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Gauge, generate_latest

from gpufed import defaults
from gpufed.errors import GpufedError

BUILD_INFO = Gauge("gpufed_build_info", "Always 1; the labels say which gpufed runs.", ["version", "python"])


def _version() -> str:
    try:
        return importlib.metadata.version("gpufed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


BUILD_INFO.labels(_version(), platform.python_version()).set(1)

#: Address the metrics server listens on when only a port is given: loopback (`gpufed.defaults`);
#: a scrape target reached from elsewhere is asked for with an explicit host.
DEFAULT_HOST = defaults.METRICS_HOST


class MetricsServerError(GpufedError):
    """The metrics server cannot listen (e.g. the port is taken); the message names host and port."""


class MetricsServer:
    """Serves `registry` on http://host:port/metrics until cancelled."""

    def __init__(self, port: int, host: str = DEFAULT_HOST, registry: CollectorRegistry = REGISTRY) -> None:
        self.host = host
        #: The port asked for; once `ready`, the port bound (differs when 0 was asked for).
        self.port = port
        self.registry = registry
        self.ready = asyncio.Event()
        self._log = structlog.get_logger().bind(component="metrics")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def run(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            try:
                await site.start()
            except OSError as e:
                raise MetricsServerError(
                    f"cannot serve metrics on {self.host}:{self.port}: {e.strerror or e} (--metrics-port)"
                ) from e
            self.port = int(runner.addresses[0][1])
            self._log.info("serving metrics", address=f"{self.host}:{self.port}", path="/metrics")
            self.ready.set()
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(runner.cleanup())


@contextlib.asynccontextmanager
async def serving(
    port: int | None, host: str = DEFAULT_HOST, registry: CollectorRegistry = REGISTRY
) -> AsyncIterator[MetricsServer | None]:
    """Serve metrics while the block runs (nothing when `port` is None). The server listens before
    the block starts (MetricsServerError if it cannot) and is stopped when the block ends."""
    if port is None:
        yield None
        return
    server = MetricsServer(port, host, registry)
    task = asyncio.create_task(server.run(), name="metrics-server")
    listening = asyncio.create_task(server.ready.wait())
    try:
        await asyncio.wait([task, listening], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the bind failure (or a bug) surfaces here, not inside a task group
        yield server
    finally:
        for t in (listening, task):
            t.cancel()
        # asyncio.wait, not `await task`: the task's CancelledError is not ours, ours still propagates.
        await asyncio.wait([listening, task])


class StateGauge:
    """A gauge that says which of several states a thing is in: 1 on the series of the current
    state, 0 on the others it has been in (PromQL: `metric == 1`). Remembers its label sets so
    that `remove` can drop every series of a thing that is gone."""

    def __init__(self, gauge: Gauge, states: Iterable[str]) -> None:
        self.gauge = gauge
        #: States always exported (0 or 1), so a dashboard shows them before they first occur.
        self.states = tuple(states)
        self._seen: dict[tuple[str, ...], set[str]] = {}

    def set(self, state: str, *labelvalues: str) -> None:
        """`labelvalues` (all labels but the last, which is the state) are now in `state`."""
        seen = self._seen.setdefault(labelvalues, set(self.states))
        seen.add(state)
        for s in seen:
            self.gauge.labels(*labelvalues, s).set(1 if s == state else 0)

    def remove(self, *labelvalues: str) -> None:
        """Drop every series of `labelvalues` (the thing is gone)."""
        for s in self._seen.pop(labelvalues, set()):
            self.gauge.remove(*labelvalues, s)


class GaugeMap:
    """A gauge whose last label is a key of a mapping (e.g. resource -> amount): `set` exports a
    thing's whole mapping and removes the series of keys it no longer has. With `unit_of`, the gauge
    has one more label after the key, the key's unit (kube-state-metrics' `unit` convention: one
    metric name whose series count cores, bytes and items says which in a label)."""

    def __init__(self, gauge: Gauge, unit_of: Callable[[str], str] | None = None) -> None:
        self.gauge = gauge
        self.unit_of = unit_of
        self._keys: dict[tuple[str, ...], set[str]] = {}

    def _labels(self, labelvalues: tuple[str, ...], key: str) -> tuple[str, ...]:
        return (*labelvalues, key) if self.unit_of is None else (*labelvalues, key, self.unit_of(key))

    def set(self, values: Mapping[str, float], *labelvalues: str) -> None:
        """`labelvalues` (all labels but the key's and its unit's) now have exactly `values`."""
        for gone in self._keys.get(labelvalues, set()) - values.keys():
            self.gauge.remove(*self._labels(labelvalues, gone))
        self._keys[labelvalues] = set(values)
        for key, value in values.items():
            self.gauge.labels(*self._labels(labelvalues, key)).set(value)

    def remove(self, *labelvalues: str) -> None:
        """Drop every series of `labelvalues` (the thing is gone)."""
        for key in self._keys.pop(labelvalues, set()):
            self.gauge.remove(*self._labels(labelvalues, key))


__all__ = ["DEFAULT_HOST", "GaugeMap", "MetricsServer", "MetricsServerError", "StateGauge", "serving"]
