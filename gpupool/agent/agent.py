"""The GPU node agent: reads this node's GPUs every interval and publishes what changed on its Node.

Owns: the loop (`GPUAgent.run`: read, compare, patch; once, or every `interval_s`), the read in a
thread (NVML blocks), and the write: one JSON merge patch of `metadata.labels` / `metadata.annotations`
holding only the keys `gpupool.agent.labels` names, and only those whose value differs from the
node's current one (nothing is written while nothing changes; a key someone else changed back is
put right on the next pass).

Invariants:
- The agent only ever reads and patches the Node named in its settings (`--node`): RBAC cannot
  confine a node's agent to its own Node, so this is the guard.
- A Node that does not exist is an error that names it (a wrong `--node`), never a silent no-op.
- In the loop, transient API failures (no answer, 429, 5xx) are logged and retried at the next
  interval; anything else (not found, forbidden) ends `run` with `GPUAgentError` / `KubeError`.
  `once` reports every failure.

Metrics: `gpufed_gpu_agent_publishes_total{outcome}` per pass ("changed": a patch was written,
"unchanged": nothing to write, "failed": the pass raised) and `gpufed_gpu_agent_gpus` (GPUs in the
latest reading; 0 when NVML is unavailable).

Does not: decide labels or health (`labels`), talk to NVML itself (`nvml`), or create Nodes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from gpufed.apis.wire import GPU_HEALTH_ANNOTATION, GPU_SOURCE_ANNOTATION
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpupool import defaults
from gpupool.agent import labels as gl
from gpupool.agent.nvml import GPUReader, NodeGPUReport

log = structlog.get_logger()

#: Seconds between readings.
DEFAULT_INTERVAL_S = defaults.GPU_AGENT_INTERVAL_S

PUBLISHES = Counter(
    "gpufed_gpu_agent_publishes_total",
    "Passes of the GPU node agent by outcome (changed, unchanged, failed).",
    ["outcome"],
)
GPUS = Gauge("gpufed_gpu_agent_gpus", "GPUs the GPU node agent found on its node in the latest reading.")


@dataclass(frozen=True)
class GPUAgentSettings:
    #: The Node this agent publishes on (the node it runs on).
    node: str
    #: Seconds between readings (default DEFAULT_INTERVAL_S).
    interval_s: float = DEFAULT_INTERVAL_S
    #: Read and publish once, then return.
    once: bool = False


class GPUAgentError(GpufedError):
    """The agent cannot do its job (e.g. its Node does not exist)."""


class GPUAgent:
    def __init__(self, api: Any, reader: GPUReader, settings: GPUAgentSettings) -> None:
        self.api = api
        self.reader = reader
        self.s = settings
        #: Set after the first pass that published (or found nothing to publish).
        self.ready = asyncio.Event()
        #: The latest reading.
        self.report: NodeGPUReport | None = None
        self._path = rest.path("v1", "nodes", settings.node)
        self.log = log.bind(kind="Node", node=settings.node)

    async def sync(self) -> dict[str, Any]:
        """One pass: read the GPUs, patch the Node where it differs; the patch sent ({} if none)."""
        try:
            patch = await self._sync()
        except Exception:
            PUBLISHES.labels("failed").inc()
            raise
        PUBLISHES.labels("changed" if patch else "unchanged").inc()
        return patch

    async def _sync(self) -> dict[str, Any]:
        report = await asyncio.to_thread(self.reader.read)
        GPUS.set(len(report.devices))
        previous, self.report = self.report, report
        if report.nvml_error and (previous is None or previous.nvml_error != report.nvml_error):
            self.log.warning("nvml unavailable, node capacity and labels speak for it", error=report.nvml_error)
        elif report.nvml_error is None and previous is not None and previous.nvml_error:
            self.log.info("nvml available again")
        node = await rest.get(self.api, self._path, what=f"get node {self.s.node}")
        if node is None:
            raise GPUAgentError(
                f"node {self.s.node!r} not found: --node must be the Kubernetes name of the node the agent "
                "runs on (kubectl get nodes)"
            )
        meta = node.get("metadata") or {}
        labels: dict[str, str] = meta.get("labels") or {}
        annotations: dict[str, str] = meta.get("annotations") or {}
        pub = gl.desired(report, labels, annotations)
        patch = gl.merge_patch(pub, labels, annotations)
        if patch:
            await rest.merge_patch(self.api, self._path, patch, what=f"patch node {self.s.node}")
            changed = patch["metadata"]
            self.log.info(
                "published gpu facts",
                source=pub.annotations.get(GPU_SOURCE_ANNOTATION),
                health=pub.annotations.get(GPU_HEALTH_ANNOTATION) or annotations.get(GPU_HEALTH_ANNOTATION),
                gpus=len(report.devices),
                changed=sorted([*changed.get("labels", {}), *changed.get("annotations", {})]),
            )
        self.ready.set()
        return patch

    async def run(self) -> None:
        """Read and publish every `interval_s` (or once); see the module's invariants for failures."""
        self.log.info("gpu agent started", interval_s=self.s.interval_s, once=self.s.once)
        while True:
            try:
                await self.sync()
            except KubeError as e:
                if self.s.once or not e.transient:
                    raise
                self.log.warning("publishing gpu facts failed, retrying", error=str(e))
            if self.s.once:
                return
            await asyncio.sleep(self.s.interval_s)


__all__ = ["DEFAULT_INTERVAL_S", "GPUAgent", "GPUAgentError", "GPUAgentSettings"]
