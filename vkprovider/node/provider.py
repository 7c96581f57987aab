"""The contract between the virtual kubelet's controllers and a provider.

Owns: `PodProvider` and `NodeProvider` (what `vkprovider.node` needs from whatever runs pods),
`StreamingProvider` (what the kubelet API needs), `Twin` (what the provider knows of one local pod's
remote twin), `NodeState`, and `ProviderError` (a refusal users must see). Each method's docstring
is its part of the contract; `tests/unit/provider_conformance.py` checks the `PodProvider` half
against every implementation (fakes included). In short:

- `subscribe(notify)` registers a callback before `run()`; `run()` watches the provider until
  cancelled, calls every subscriber with the LOCAL key of a pod whenever its twin appears, changes
  or disappears, and sets `ready` once its view is complete.
- `twins()` / `twin(ns, name)` answer from that view without I/O; a twin carries the LOCAL pod's
  UID it was created for, and one whose UID is not the local pod's is stale.
- `create_pod`, `update_pod`, `delete_pod` act on the twin of one local pod (idempotent; refusals
  are `ProviderError`); `pod_status` says what the local pod's status should be.
- `NodeProvider.node_state()` is what the virtual node advertises now.
- `StreamingProvider` serves logs, exec, attach, port-forward and usage of pods bound to the node.

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
    """Where the twins of the pods bound to a virtual node run."""

    #: Set by `run()` once its view is complete (every twin that exists is in `twins()`).
    ready: asyncio.Event

    def subscribe(self, notify: Notify) -> None:
        """Register `notify`, called with the LOCAL (namespace, name) of a pod whenever its twin
        appears, changes or disappears, from the next notification on.

        Called before `run()`; must not block or do I/O and raises nothing. Every registered callback
        is called, in the order they were registered; registering the same callback twice makes it
        called twice. Callbacks run on the event loop and must return at once.
        """
        ...

    async def run(self) -> None:
        """Watch the provider until cancelled: keep the view `twins()` answers from, notify every
        subscriber of each change, and set `ready` once the view is complete.

        Never returns on its own; a failure it cannot recover from raises (the caller's TaskGroup
        then stops the node). Run once per provider object.
        """
        ...

    def twins(self) -> list[Twin]:
        """Every twin in the current view, without I/O (empty before the view is complete)."""
        ...

    def twin(self, namespace: str, name: str) -> Twin | None:
        """The twin of the LOCAL pod namespace/name in the current view, without I/O; None when
        there is none. A twin whose `origin_uid` is not the local pod's UID is stale."""
        ...

    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        """Create the twin of the local `pod` (bound to the node, not terminal).

        Idempotent: a twin of the same UID that already exists is success, and a twin of ANOTHER
        UID under that name is neither adopted nor replaced. Raises `ProviderError` with a message
        for the user on a refusal (quota, policy, a missing ConfigMap); `retry=True` for transient
        failures, `retry=False` for refusals that only change when the pod or the policy does, and
        `fail_back=True` for a pod that can never run there.
        """
        ...

    async def update_pod(self, pod: Mapping[str, Any], twin: Twin) -> None:
        """Bring the mutable fields of the existing `twin` in line with the local `pod` (container
        images, activeDeadlineSeconds). Idempotent: nothing to change is success. Raises
        `ProviderError` when the provider refuses the change."""
        ...

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None:
        """Stop the twin of the LOCAL pod namespace/name created for `uid`, with `grace_period_s`.

        Idempotent: a missing twin, or one created for another UID, is success (and is left
        alone). With grace 0 the twin leaves the view at once; with a grace period it shows as
        `deleting` until the provider has stopped it. Raises `ProviderError` when the provider
        refuses or cannot be reached.
        """
        ...

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        """The status the LOCAL `pod` should show, as the body of a strategic-merge patch of its
        status subresource (`{"status": {...}}`), in local terms (IPs translated), taken from
        `twin` without I/O. Never sets `qosClass`; raises nothing."""
        ...


class NodeProvider(Protocol):
    """Where a virtual node's capacity and health come from."""

    async def node_state(self) -> NodeState:
        """What the virtual node advertises now. Raises nothing: an unhealthy provider is a
        NodeState with `ready` False and the reason. Called every few seconds and on every pod
        change, so it answers from what the provider already knows where it can."""
        ...


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
    async def write(self, data: bytes) -> None:
        """Send `data` (all of it, or raise when the other side is gone)."""
        ...

    async def close(self) -> None:
        """End this direction; further writes fail. Closing twice is harmless."""
        ...


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
    """What the kubelet API (`vkprovider.kubelet.server`) serves for pods bound to the node. Every
    method is given the LOCAL pod, already checked to be bound to this node."""

    def container_logs(self, pod: Mapping[str, Any], container: str, opts: LogOptions) -> AsyncIterator[bytes]:
        """The raw log bytes of `container`, as they arrive (until the end, or forever with
        `opts.follow`). Errors before the first chunk: `ProviderError` with reason `NotFound` (no
        such pod, twin or container) or `InvalidInput` (options the provider rejects)."""
        ...

    async def exec_in_container(
        self, pod: Mapping[str, Any], container: str, command: Sequence[str], io: ExecIO
    ) -> ExecResult:
        """Run `command` in `container` until the remote process ends, pumping the `io` streams
        meanwhile, and return how it ended. Raises `ProviderError` when it cannot start."""
        ...

    async def attach_to_container(self, pod: Mapping[str, Any], container: str, io: ExecIO) -> ExecResult:
        """Attach the `io` streams to the running `container` until it ends or the caller leaves;
        its `ExecResult` as for exec. Raises `ProviderError` when it cannot attach."""
        ...

    async def port_forward(self, pod: Mapping[str, Any], port: int, stream: Duplex) -> None:
        """Join one client connection (`stream`) to `port` of the pod until either side closes.
        Raises `ProviderError` when the port cannot be reached."""
        ...

    async def pod_usage(self, pods: Sequence[Mapping[str, Any]]) -> list[PodUsage]:
        """CPU and memory of the given pods; pods the provider has no figures for are left out.
        Raises `ProviderError` only when the provider cannot be asked at all."""
        ...
