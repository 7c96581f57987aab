"""`gpufed controller`: flags and GPUFED_* variables -> ControllerSettings -> `vkprovider.app.controller.run`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Annotated

import typer

from peering.controllers.identity import IdentityError
from peering.kube.client import KubeError
from vkprovider.app.controller import ControllerSettings, PreflightError, run
from vkprovider.cli.common import configure_logging, fail


def controller(
    kubeconfig: Annotated[
        Path, typer.Option("--kubeconfig", envvar="GPUFED_KUBECONFIG", help="kubeconfig of the controller's identity")
    ],
    context: Annotated[
        str | None, typer.Option("--context", envvar="GPUFED_CONTEXT", help="context in the kubeconfig")
    ] = None,
    cluster_name: Annotated[
        str, typer.Option("--cluster-name", envvar="GPUFED_CLUSTER_NAME", help="readable prefix of a new ClusterID")
    ] = "",
    cluster_id: Annotated[
        str | None,
        typer.Option("--cluster-id", envvar="GPUFED_CLUSTER_ID", help="explicit ClusterID (first start only)"),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", envvar="GPUFED_LOG_LEVEL")] = "info",
) -> None:
    """Run the per-cluster control plane: identity and both peering roles (provider and consumer)."""
    configure_logging(log_level)
    settings = ControllerSettings(kubeconfig=kubeconfig, context=context, name_hint=cluster_name, cluster_id=cluster_id)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await run(settings)

    try:
        asyncio.run(main())
    except (PreflightError, IdentityError, KubeError) as e:
        raise fail(e) from None
