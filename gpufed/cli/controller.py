"""`gpufed controller`: flags and GPUFED_* variables -> ControllerSettings -> `gpufed.app.controller.run`.

The controller is imported when the command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from gpufed.apis.wire import STORAGE_CLASS
from gpufed.cli.common import MetricsHost, MetricsPort, configure_logging, parse_ports, serve
from gpufed.defaults import METRICS_HOST
from peering.defaults import CLIENT_CERT_RENEW_FRACTION, CLIENT_CERT_SECONDS, MIN_CERT_SECONDS
from vkprovider.defaults import KUBELET_PORTS

EPILOG = """Examples:

  # in a cluster the chart runs it with the pod's service account
  gpufed controller --cluster-name consumer
  gpufed controller --kubeconfig admin.yaml --context consumer --webhook-port 9443 --metrics-port 9100
"""


def controller(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            envvar="GPUFED_KUBECONFIG",
            help="kubeconfig of the controller's identity (default: the pod's service account)",
        ),
    ] = None,
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
    webhook_service: Annotated[
        str | None,
        typer.Option(
            "--webhook-service",
            envvar="GPUFED_WEBHOOK_SERVICE",
            help="NAMESPACE/NAME:PORT of the Service in front of the replicas (in a cluster; replaces --webhook-host)",
        ),
    ] = None,
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
    ] = f"{KUBELET_PORTS[0]}-{KUBELET_PORTS[1]}",
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
    leader_elect: Annotated[
        bool,
        typer.Option(
            "--leader-elect/--no-leader-elect",
            envvar="GPUFED_LEADER_ELECT",
            help="elect a leader among replicas through the Lease gpufed/gpufed-controller",
        ),
    ] = False,
    leader_election_id: Annotated[
        str | None,
        typer.Option("--leader-election-id", envvar="POD_NAME", help="this replica's identity (default: hostname)"),
    ] = None,
    virtual_kubelet_template: Annotated[
        Path | None,
        typer.Option(
            "--virtual-kubelet-template",
            envvar="GPUFED_VIRTUAL_KUBELET_TEMPLATE",
            help="run a Deployment per peered provider from this template (in a cluster)",
        ),
    ] = None,
    gateway_template: Annotated[
        Path | None,
        typer.Option(
            "--gateway-template",
            envvar="GPUFED_GATEWAY_TEMPLATE",
            help="run a Deployment per Gateway.gpufed.io from this template (in a cluster)",
        ),
    ] = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = METRICS_HOST,
    estimator_address: Annotated[
        str | None,
        typer.Option(
            "--estimator-address",
            envvar="GPUFED_ESTIMATOR_ADDRESS",
            help="host:port consumers reach it on (default: --estimator-host and --estimator-port)",
        ),
    ] = None,
    storage_class: Annotated[
        str,
        typer.Option(
            "--storage-class",
            envvar="GPUFED_STORAGE_CLASS",
            help="the virtual StorageClass whose claims are bound on the provider their first pod goes to ('' : none)",
        ),
    ] = STORAGE_CLASS,
    local_storage_class: Annotated[
        str,
        typer.Option(
            "--local-storage-class",
            envvar="GPUFED_LOCAL_STORAGE_CLASS",
            help="this cluster's StorageClass for claims of the virtual class whose first pod stays on a local "
            "node (default: the cluster's default class)",
        ),
    ] = "",
    client_cert_lifetime: Annotated[
        int,
        typer.Option(
            "--client-cert-lifetime",
            envvar="GPUFED_CLIENT_CERT_LIFETIME",
            help="provider: seconds the consumers' client certificates live (>= 600, the CSR API's minimum)",
        ),
    ] = CLIENT_CERT_SECONDS,
    client_cert_renew_fraction: Annotated[
        float,
        typer.Option(
            "--client-cert-renew-fraction",
            envvar="GPUFED_CLIENT_CERT_RENEW_FRACTION",
            help="consumer: renew a client certificate after this fraction of its lifetime (0-1)",
        ),
    ] = CLIENT_CERT_RENEW_FRACTION,
) -> None:
    """Run the per-cluster control plane: identity, both peering roles, offloading, virtual kubelets."""
    from gpufed.app.controller import (
        ControllerSettings,
        EstimatorSettings,
        LeaderElectionSettings,
        VirtualKubeletsSettings,
        WebhookSettings,
        run,
    )
    from gpufed.app.workloads import WorkloadSettings
    from gpupool.estimator.server import EstimatorConfigError, EstimatorServerSettings, advertised_host
    from peering.controllers.consumer import ConsumerSettings
    from peering.controllers.provider import ProviderSettings
    from peering.controllers.renewal import RenewalSettings

    if client_cert_lifetime < MIN_CERT_SECONDS:
        raise typer.BadParameter(
            f"--client-cert-lifetime must be >= {MIN_CERT_SECONDS} seconds (the CSR API's minimum)"
        )
    if not 0 < client_cert_renew_fraction < 1:
        raise typer.BadParameter("--client-cert-renew-fraction must lie between 0 and 1")
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
    service = parse_service(webhook_service) if webhook_service else None
    if webhook_service and webhook_port is None:
        raise typer.BadParameter("--webhook-service needs --webhook-port (the port this process serves on)")
    settings = ControllerSettings(
        kubeconfig=kubeconfig,
        context=context,
        name_hint=cluster_name,
        cluster_id=cluster_id,
        webhook=WebhookSettings(port=webhook_port, host=webhook_host, service=service),
        virtual_kubelets=VirtualKubeletsSettings(
            kubeconfig=vk_kubeconfig, kubelet_ports=(first, last), node_address=node_address, log_dir=log_dir
        ),
        estimator=estimator,
        leader_election=LeaderElectionSettings(
            enabled=leader_elect, identity=leader_election_id or socket.gethostname()
        ),
        workloads=WorkloadSettings(
            virtual_kubelet_template=virtual_kubelet_template, gateway_template=gateway_template
        ),
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        storage_class=storage_class or None,
        local_storage_class=local_storage_class or None,
        provider=ProviderSettings(cert_seconds=client_cert_lifetime),
        consumer=ConsumerSettings(renewal=RenewalSettings(renew_fraction=client_cert_renew_fraction)),
    )

    serve(lambda: run(settings))


def parse_service(text: str) -> tuple[str, str, int]:
    """NAMESPACE/NAME:PORT -> (namespace, name, port), or a BadParameter that shows the form."""
    try:
        ref, port_text = text.rsplit(":", 1)
        namespace, name = ref.split("/", 1)
        port = int(port_text)
        if not (namespace and name and 0 < port < 65536):
            raise ValueError
    except ValueError:
        raise typer.BadParameter(
            f"--webhook-service must be NAMESPACE/NAME:PORT, e.g. gpufed/gpufed-webhook:443 (got {text!r})"
        ) from None
    return namespace, name, port
