"""`gpufed gpu-agent`: flags and GPUFED_* variables -> GPUAgentSettings -> `gpupool.agent.agent.GPUAgent`.

The agent is imported when the command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from gpufed.cli.common import MetricsHost, MetricsPort, configure_logging, serve
from gpufed.defaults import METRICS_HOST
from gpupool.defaults import GPU_AGENT_INTERVAL_S

EPILOG = """Examples:

  # a DaemonSet on the GPU nodes runs it
  gpufed gpu-agent --node gpu-node-1
  gpufed gpu-agent --node gpu-node-1 --once --kubeconfig agent.yaml
"""

#: A Node name: an RFC 1123 subdomain.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def gpu_agent(
    node: Annotated[
        str,
        typer.Option("--node", envvar="GPUFED_NODE_NAME", help="the Node this agent runs on (its only write target)"),
    ],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            envvar="GPUFED_KUBECONFIG",
            help="kubeconfig of the agent's identity (default: the pod's service account)",
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option("--context", envvar="GPUFED_CONTEXT", help="context in the kubeconfig")
    ] = None,
    interval_s: Annotated[
        float,
        typer.Option("--interval-s", envvar="GPUFED_GPU_AGENT_INTERVAL_S", help="seconds between NVML readings"),
    ] = GPU_AGENT_INTERVAL_S,
    once: Annotated[bool, typer.Option("--once", help="read and publish once, then exit")] = False,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = METRICS_HOST,
    log_level: Annotated[str, typer.Option("--log-level", envvar="GPUFED_LOG_LEVEL")] = "info",
) -> None:
    """Publish this node's GPU model, memory, MIG layout, driver and health as labels and annotations."""
    configure_logging(log_level)
    if len(node) > 253 or not _NODE_NAME.match(node):
        raise typer.BadParameter(f"--node must be a Kubernetes node name (lowercase RFC 1123), got {node!r}")
    if not interval_s >= 1:
        raise typer.BadParameter(f"--interval-s must be at least 1 second (got {interval_s:g})")
    from gpufed.kube.client import api_client
    from gpufed.kube.metrics import serving
    from gpupool.agent.agent import GPUAgent, GPUAgentSettings
    from gpupool.agent.nvml import NvmlReader

    settings = GPUAgentSettings(node=node, interval_s=interval_s, once=once)

    async def run() -> None:
        async with serving(metrics_port, metrics_host), api_client(kubeconfig, context) as api:
            await GPUAgent(api, NvmlReader(), settings).run()

    serve(run)
