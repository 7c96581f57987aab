"""The contract between the virtual kubelet's controllers and a provider (DESIGN.md §3).

Owns: `PodProvider` and `NodeProvider` (what `vkprovider.node` needs from whatever runs pods),
`Twin` (what the provider knows of one local pod's remote twin), `NodeState`, and `ProviderError`
(a refusal users must see). The contract, which `tests/unit/provider_conformance.py` checks against
every implementation (fakes included):

- `run(notify)` watches the provider; it calls `notify(namespace, name)` with the LOCAL key of a pod
  whenever its twin appears, changes or disappears, and sets `ready` once its view is complete
  (every twin that exists is in `twins()`). It runs until cancelled.
- `twins()` / `twin(ns, name)` answer from that view without I/O. A twin carries the LOCAL pod's UID
  it was created for; a twin whose UID is not the local pod's is stale and must be deleted.
- `create_pod(pod)` creates the twin of a local pod. Idempotent: a twin of the same UID that
  already exists is success. Refusals (quota, policy, a missing ConfigMap) raise `ProviderError`
  with a message for the user; transient failures raise `ProviderError(retry=True)`.
  A pod that can never run there raises `ProviderError(fail_back=True)`.
- `update_pod(pod)` brings the mutable fields of an existing twin in line (images, deadline).
- `delete_pod(ns, name, uid, grace_period_s)` stops the twin of that UID; a missing twin is success.
- `pod_status(pod, twin)` is the status the LOCAL pod should show, as the body of a strategic-merge
  patch of its status subresource (`{"status": {...}}`), in local terms (IPs translated).
- `NodeProvider.node_state()` is what the virtual node advertises now; it raises nothing: an
  unhealthy provider is a NodeState with ready False and the reason.
- `StreamingProvider` serves the kubelet API (`vkprovider.kubelet.server`) for pods bound to the
  node, always given the LOCAL pod (the API checked it is bound to this node): `container_logs`
  is an async iterator of raw log bytes (errors before the first chunk: `ProviderError` with
  reason `NotFound` or `InvalidInput`); `exec_in_container` / `attach_to_container` run until the
  remote process ends and return its `ExecResult`, pumping the `ExecIO` streams meanwhile;
  `port_forward` joins one client connection (`Duplex`) to `port` of the pod until either side
  closes; `pod_usage` reports CPU/memory of the given pods (missing pods are left out).

Does not: talk to the consumer's API server (the controllers do), or decide when to retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Notify = Callable[[str, str], None]


class ProviderError(Exception):
    """The provider refused or failed a pod; `reason` is CamelCase, the message is for the user.

    `fail_back`: the pod can never run on this node (e.g. no provider node can take its GPUs):
    the pod controller fails it (phase Failed) so that its owner replaces it and the scheduler
    can choose another node, instead of retrying.
    """

    def __init__(
        self, message: str, *, reason: str = "ProviderFailed", retry: bool = True, fail_back: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry and not fail_back
        self.fail_back = fail_back


@dataclass(frozen=True)
class Twin:
    """A remote twin as the provider sees it, keyed by the LOCAL pod's namespace and name."""

    namespace: str
    name: str
    #: UID of the local pod this twin was created for.
    origin_uid: str
    #: Succeeded or Failed remotely.
    terminal: bool
    #: The provider is already deleting it.
    deleting: bool
    #: The provider's own object (opaque to the controllers; handed back to `pod_status`).
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: Unix time since which the provider has not placed it (Pending, on no node); None once placed.
    unplaced_since: float | None = None


@dataclass(frozen=True)
class NodeState:
    """What a virtual node advertises: resources, labels, and health with a reason."""

    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]
    labels: Mapping[str, str]
    ready: bool
    reason: str
    message: str
    annotations: Mapping[str, str] = field(default_factory=dict)


class PodProvider(Protocol):
    ready: asyncio.Event

    async def run(self, notify: Notify) -> None: ...

    def twins(self) -> list[Twin]: ...

    def twin(self, namespace: str, name: str) -> Twin | None: ...

    async def create_pod(self, pod: Mapping[str, Any]) -> None: ...

    async def update_pod(self, pod: Mapping[str, Any], twin: Twin) -> None: ...

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None: ...

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]: ...


class NodeProvider(Protocol):
    async def node_state(self) -> NodeState: ...


# ---- the kubelet API's needs (StreamingProvider)

#: `ProviderError.reason` values the kubelet API maps to HTTP statuses.
NOT_FOUND = "NotFound"
INVALID_INPUT = "InvalidInput"


@dataclass(frozen=True)
class LogOptions:
    """`kubectl logs` options as the kubelet receives them (already validated)."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_seconds: int | None = None
    #: RFC 3339 time; exclusive with since_seconds.
    since_time: str | None = None
    #: All, Stdout or Stderr (newer API servers send it); None = All.
    stream: str | None = None


class ByteSource(Protocol):
    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (any amount when -1); b"" at the end."""
        ...


class ByteSink(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


class Duplex(ByteSource, ByteSink, Protocol):
    """Both directions of one connection (a port-forward data stream)."""


@dataclass(frozen=True)
class TermSize:
    width: int
    height: int


@dataclass
class ExecIO:
    """The caller's side of an exec/attach: streams it asked for, None for the others."""

    stdin: ByteSource | None
    stdout: ByteSink | None
    stderr: ByteSink | None
    tty: bool
    #: Terminal sizes as the user resizes (tty only); None ends the sequence.
    resize: asyncio.Queue[TermSize | None] | None = None


@dataclass(frozen=True)
class ExecResult:
    """How a remote command ended: exit code 0 = success; `message` for failures without a code."""

    exit_code: int
    message: str = ""


@dataclass(frozen=True)
class ContainerUsage:
    name: str
    #: Cumulative CPU time in core-seconds since the container started.
    cpu_seconds: float
    #: Current CPU use in cores (rate over the provider's window).
    cpu_cores: float
    memory_working_set_bytes: int
    start_time: float


@dataclass(frozen=True)
class PodUsage:
    namespace: str
    name: str
    uid: str
    #: Unix time the sample was taken.
    timestamp: float
    containers: tuple[ContainerUsage, ...]


class StreamingProvider(Protocol):
    def container_logs(self, pod: Mapping[str, Any], container: str, opts: LogOptions) -> AsyncIterator[bytes]: ...

    async def exec_in_container(
        self, pod: Mapping[str, Any], container: str, command: Sequence[str], io: ExecIO
    ) -> ExecResult: ...

    async def attach_to_container(self, pod: Mapping[str, Any], container: str, io: ExecIO) -> ExecResult: ...

    async def port_forward(self, pod: Mapping[str, Any], port: int, stream: Duplex) -> None: ...

    async def pod_usage(self, pods: Sequence[Mapping[str, Any]]) -> list[PodUsage]: ...
