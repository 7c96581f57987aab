"""`gpufed controller`: flags and GPUFED_* variables -> ControllerSettings -> `vkprovider.app.controller.run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from peering.controllers.identity import IdentityError
from peering.estimator.server import EstimatorConfigError, EstimatorServerSettings, advertised_host
from peering.kube.client import KubeError
from vkprovider.app.controller import (
    DEFAULT_KUBELET_PORTS,
    ControllerSettings,
    EstimatorSettings,
    PreflightError,
    VirtualKubeletsSettings,
    WebhookSettings,
    run,
)
from vkprovider.cli.common import configure_logging, parse_ports, serve


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
    webhook_port: Annotated[
        int | None,
        typer.Option("--webhook-port", envvar="GPUFED_WEBHOOK_PORT", help="serve the offloading webhook on this port"),
    ] = None,
    webhook_host: Annotated[
        str,
        typer.Option("--webhook-host", envvar="GPUFED_WEBHOOK_HOST", help="address the API server reaches it on"),
    ] = "127.0.0.1",
    vk_kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--virtual-kubelet-kubeconfig",
            envvar="GPUFED_VIRTUAL_KUBELET_KUBECONFIG",
            help="start a virtual kubelet per peered provider, with this identity",
        ),
    ] = None,
    kubelet_ports: Annotated[
        str,
        typer.Option(
            "--kubelet-ports", envvar="GPUFED_KUBELET_PORTS", help="port range FIRST-LAST for their kubelet APIs"
        ),
    ] = f"{DEFAULT_KUBELET_PORTS[0]}-{DEFAULT_KUBELET_PORTS[1]}",
    node_address: Annotated[
        str, typer.Option("--node-address", envvar="GPUFED_NODE_ADDRESS", help="address virtual nodes publish")
    ] = "127.0.0.1",
    log_dir: Annotated[
        Path | None, typer.Option("--log-dir", envvar="GPUFED_LOG_DIR", help="log files of the virtual kubelets")
    ] = None,
    estimator_port: Annotated[
        int | None,
        typer.Option(
            "--estimator-port",
            envvar="GPUFED_ESTIMATOR_PORT",
            help="serve the capacity estimator (gRPC, mutual TLS) to consumers on this port",
        ),
    ] = None,
    estimator_host: Annotated[
        str,
        typer.Option(
            "--estimator-host", envvar="GPUFED_ESTIMATOR_HOST", help="address it listens on (0.0.0.0: every interface)"
        ),
    ] = "127.0.0.1",
    estimator_address: Annotated[
        str | None,
        typer.Option(
            "--estimator-address",
            envvar="GPUFED_ESTIMATOR_ADDRESS",
            help="host:port consumers reach it on (default: --estimator-host and --estimator-port)",
        ),
    ] = None,
) -> None:
    """Run the per-cluster control plane: identity, both peering roles, offloading, virtual kubelets."""
    configure_logging(log_level)
    first, last = parse_ports(kubelet_ports)
    estimator = EstimatorSettings(port=estimator_port, host=estimator_host, address=estimator_address)
    if estimator_port is not None:
        if not 0 < estimator_port < 65536:
            raise typer.BadParameter(f"--estimator-port must be 1..65535 (got {estimator_port})")
        try:
            advertised_host(
                EstimatorServerSettings(port=estimator_port, host=estimator_host, address=estimator_address)
            )
        except EstimatorConfigError as e:
            raise typer.BadParameter(str(e)) from None
    settings = ControllerSettings(
        kubeconfig=kubeconfig,
        context=context,
        name_hint=cluster_name,
        cluster_id=cluster_id,
        webhook=WebhookSettings(port=webhook_port, host=webhook_host),
        virtual_kubelets=VirtualKubeletsSettings(
            kubeconfig=vk_kubeconfig, kubelet_ports=(first, last), node_address=node_address, log_dir=log_dir
        ),
        estimator=estimator,
    )

    serve(lambda: run(settings), (PreflightError, IdentityError, KubeError))
