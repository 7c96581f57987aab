"""`RemoteStreaming`: logs, exec, attach, port-forward and usage of offloaded pods, from their twins.

Owns the StreamingProvider half of a peered provider: every call is made to the provider's API
server with the peering's credentials (the consumer's identity there, limited to its twin
namespaces), on the twin of the local pod (`twin_ref`):
- logs: `GET pods/<twin>/log` with the same options, the body streamed through as it arrives;
- exec / attach: `POST pods/<twin>/exec|attach` upgraded to SPDY/3.1 (`gpufed.kube.upgrade`),
  then the remote-command protocol (`vkprovider.kubelet.streams`) pumps the caller's streams and the
  remote outcome (exit code) comes back as an `ExecResult`;
- port-forward: `POST pods/<twin>/portforward`, one upgraded connection per forwarded client
  connection (kubectl opens one stream pair per TCP connection);
- usage: PodMetrics of the twin namespaces (`metrics.k8s.io`, served by the provider's
  metrics-server): only aggregates of our own twins, no access to the provider's nodes. The API
  gives a rate; the cumulative CPU counter kubelets publish is integrated here from those rates
  (rate x elapsed time since the previous sample, starting at rate x uptime), so consumers that
  derive a rate from it (metrics-server) get the provider's figure back.

Refusals map to `ProviderError`: 404 -> NotFound, 400 -> InvalidInput, others keep the provider's
message (e.g. a 403 naming the missing permission).

Does not: know which twin belongs to which pod (the caller's `twin_ref` does), authenticate the
caller (the kubelet API did), or keep connections between calls.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from gpufed.apis.quantity import parse
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import parse_rfc3339
from gpufed.kube.upgrade import open_upgraded
from vkprovider.kubelet import streams
from vkprovider.node.provider import (
    INVALID_INPUT,
    NOT_FOUND,
    ContainerUsage,
    Duplex,
    ExecIO,
    ExecResult,
    LogOptions,
    PodUsage,
    ProviderError,
)
from vkprovider.spdy.session import Session

TwinRef = Callable[[Mapping[str, Any]], tuple[str, str]]
METRICS_API = "metrics.k8s.io/v1beta1"


def log_params(container: str, opts: LogOptions) -> dict[str, str]:
    """Query parameters of pods/log for these options."""
    p = {"container": container}
    for name, value in (("follow", opts.follow), ("previous", opts.previous), ("timestamps", opts.timestamps)):
        if value:
            p[name] = "true"
    for name, n in (
        ("tailLines", opts.tail_lines),
        ("limitBytes", opts.limit_bytes),
        ("sinceSeconds", opts.since_seconds),
    ):
        if n is not None:
            p[name] = str(n)
    if opts.since_time:
        p["sinceTime"] = opts.since_time
    if opts.stream and opts.stream != "All":
        p["stream"] = opts.stream
    return p


def _started(pod: Mapping[str, Any], container: str) -> float | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
            if started:
                return parse_rfc3339(str(started)).timestamp()
    return None


class RemoteStreaming:
    def __init__(self, remote_api: Any, provider: str, twin_ref: TwinRef) -> None:
        self.remote = remote_api
        self.provider = provider
        self.twin_ref = twin_ref
        #: (pod uid, container) -> (sample time, cumulative core-seconds)
        self._cpu: dict[tuple[str, str], tuple[float, float]] = {}

    def _error(self, e: KubeError, what: str) -> ProviderError:
        if e.not_found:
            return ProviderError(f"{what}: {e}", reason=NOT_FOUND, retry=False)
        if e.status == 400:
            return ProviderError(f"{what}: {e}", reason=INVALID_INPUT, retry=False)
        return ProviderError(f"{what} on provider {self.provider}: {e}", retry=False)

    async def container_logs(self, pod: Mapping[str, Any], container: str, opts: LogOptions) -> AsyncIterator[bytes]:
        ns, name = self.twin_ref(pod)
        url = rest.path("v1", "pods", name, namespace=ns, sub="log")
        try:
            async with rest.stream(self.remote, url, params=log_params(container, opts), what="logs") as body:
                while chunk := await body.readany():
                    yield chunk
        except KubeError as e:
            raise self._error(e, "logs") from e

    async def _session(
        self, pod: Mapping[str, Any], sub: str, params: list[tuple[str, str]], protocols: Sequence[str]
    ) -> tuple[Session, str]:
        ns, name = self.twin_ref(pod)
        try:
            up = await open_upgraded(
                self.remote,
                "POST",
                rest.path("v1", "pods", name, namespace=ns, sub=sub),
                params,
                upgrade="SPDY/3.1",
                protocols=protocols,
            )
        except KubeError as e:
            raise self._error(e, sub) from e
        return Session(up.reader, up.writer, client=True), up.protocol or protocols[-1]

    @staticmethod
    def _stream_params(container: str, io: ExecIO) -> list[tuple[str, str]]:
        params = [("container", container)]
        if io.stdin is not None:
            params.append(("stdin", "true"))
        if io.stdout is not None:
            params.append(("stdout", "true"))
        if io.stderr is not None and not io.tty:
            params.append(("stderr", "true"))
        if io.tty:
            params.append(("tty", "true"))
        return params

    async def exec_in_container(
        self, pod: Mapping[str, Any], container: str, command: Sequence[str], io: ExecIO
    ) -> ExecResult:
        params = [("command", c) for c in command] + self._stream_params(container, io)
        session, protocol = await self._session(pod, "exec", params, streams.REMOTE_COMMAND_PROTOCOLS)
        return await streams.client_remote_command(session, protocol, io)

    async def attach_to_container(self, pod: Mapping[str, Any], container: str, io: ExecIO) -> ExecResult:
        session, protocol = await self._session(
            pod, "attach", self._stream_params(container, io), streams.REMOTE_COMMAND_PROTOCOLS
        )
        return await streams.client_remote_command(session, protocol, io)

    async def port_forward(self, pod: Mapping[str, Any], port: int, stream: Duplex) -> None:
        session, _ = await self._session(pod, "portforward", [], (streams.PORT_FORWARD_PROTOCOL,))
        await streams.client_port_forward(session, port, stream)

    async def pod_usage(self, pods: Sequence[Mapping[str, Any]]) -> list[PodUsage]:
        by_twin: dict[tuple[str, str], Mapping[str, Any]] = {}
        for pod in pods:
            try:
                by_twin[self.twin_ref(pod)] = pod
            except ProviderError:
                continue
        out: list[PodUsage] = []
        for ns in sorted({ns for ns, _ in by_twin}):
            try:
                items = await rest.list_items(self.remote, rest.path(METRICS_API, "pods", namespace=ns))
            except KubeError as e:
                raise ProviderError(
                    f"provider {self.provider} serves no usable resource metrics API ({METRICS_API}): {e}",
                    retry=False,
                ) from e
            for item in items:
                local = by_twin.get((ns, item["metadata"]["name"]))
                if local is not None:
                    out.append(self._usage(local, item))
        live = {str(p["metadata"].get("uid")) for p in by_twin.values()}
        for key in [k for k in self._cpu if k[0] not in live]:
            del self._cpu[key]
        return out

    def _usage(self, pod: Mapping[str, Any], item: Mapping[str, Any]) -> PodUsage:
        meta = pod["metadata"]
        uid = str(meta.get("uid") or "")
        ts_s = item.get("timestamp")
        ts = parse_rfc3339(str(ts_s)).timestamp() if ts_s else time.time()
        containers = []
        for c in item.get("containers") or []:
            usage = c.get("usage") or {}
            try:
                cores = float(parse(str(usage.get("cpu", "0"))))
                memory = int(parse(str(usage.get("memory", "0"))).to_integral_value())
            except (ValueError, ArithmeticError):
                cores, memory = 0.0, 0
            name = str(c.get("name") or "")
            started = _started(pod, name) or ts
            key = (uid, name)
            prev = self._cpu.get(key)
            if prev is None:
                total = cores * max(0.0, ts - started)
            else:
                last_ts, total = prev
                if ts > last_ts:
                    total += cores * (ts - last_ts)
                ts = max(ts, last_ts)
            self._cpu[key] = (ts, total)
            containers.append(ContainerUsage(name, total, cores, memory, started))
        return PodUsage(str(meta["namespace"]), str(meta["name"]), uid, ts, tuple(containers))


__all__ = ["RemoteStreaming", "log_params"]
