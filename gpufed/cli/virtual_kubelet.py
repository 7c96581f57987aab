"""`gpufed virtual-kubelet`: flags and GPUFED_* variables -> VirtualKubeletSettings -> app.virtual_kubelet.run.

The virtual kubelet is imported when the command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufed.cli.common import MetricsHost, MetricsPort, configure_logging, parse_ports, serve
from gpufed.defaults import METRICS_HOST
from vkprovider.defaults import UNPLACED_TIMEOUT_S, VIRTUAL_KUBELET_BURST, VIRTUAL_KUBELET_QPS

EPILOG = """Examples:

  # the controller starts one per provider; run one by hand to debug
  gpufed virtual-kubelet --provider-cluster-id gpu-a-3f2c91d0
  gpufed virtual-kubelet --provider-cluster-id gpu-a-3f2c91d0 --kubeconfig vk.yaml --kubelet-port 10250
"""


def virtual_kubelet(
    provider: Annotated[
        str, typer.Option("--provider-cluster-id", envvar="GPUFED_PROVIDER", help="ClusterID of the provider")
    ],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            envvar="GPUFED_KUBECONFIG",
            help="kubeconfig of the virtual kubelet (default: the pod's service account)",
        ),
    ] = None,
    node_name: Annotated[
        str | None, typer.Option("--node-name", envvar="GPUFED_NODE_NAME", help="(default: gpufed-<provider>)")
    ] = None,
    context: Annotated[str | None, typer.Option("--context", envvar="GPUFED_CONTEXT")] = None,
    node_address: Annotated[
        str, typer.Option("--node-address", envvar="GPUFED_NODE_ADDRESS", help="InternalIP the node publishes")
    ] = "127.0.0.1",
    kubelet_port: Annotated[
        int | None,
        typer.Option("--kubelet-port", envvar="GPUFED_KUBELET_PORT", help="port of its kubelet API (one node)"),
    ] = None,
    kubelet_ports: Annotated[
        str | None,
        typer.Option(
            "--kubelet-ports",
            envvar="GPUFED_KUBELET_PORTS",
            help="FIRST-LAST ports for the kubelet APIs of the provider's pool nodes, one each (default: 10250-10253)",
        ),
    ] = None,
    capacity: Annotated[
        str,
        typer.Option(
            "--capacity",
            envvar="GPUFED_CAPACITY",
            help="live: the provider's capacity estimator (pools, fit checks, fail-back); static: the grant only",
        ),
    ] = "live",
    gpu_pools: Annotated[
        str,
        typer.Option(
            "--gpu-pools",
            envvar="GPUFED_GPU_POOLS",
            help="per-product: one node per GPU product when the provider has several; provider: one node",
        ),
    ] = "per-product",
    unplaced_timeout: Annotated[
        float,
        typer.Option(
            "--unplaced-timeout",
            envvar="GPUFED_UNPLACED_TIMEOUT",
            help="seconds a pod may stay unplaced at the provider before it is failed back (0: never)",
        ),
    ] = UNPLACED_TIMEOUT_S,
    tls_cert_file: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert-file",
            envvar="GPUFED_TLS_CERT_FILE",
            help="serving certificate of the kubelet API (re-read when it changes); default: a CSR"
            " with signer kubernetes.io/kubelet-serving, approved by gpufed controller",
        ),
    ] = None,
    tls_key_file: Annotated[
        Path | None, typer.Option("--tls-private-key-file", envvar="GPUFED_TLS_PRIVATE_KEY_FILE")
    ] = None,
    serving_cert_lifetime: Annotated[
        int,
        typer.Option(
            "--serving-cert-lifetime", envvar="GPUFED_SERVING_CERT_LIFETIME", help="seconds (CSR certificates; >= 600)"
        ),
    ] = 7 * 24 * 3600,
    serving_cert_renew_fraction: Annotated[
        float,
        typer.Option(
            "--serving-cert-renew-fraction",
            envvar="GPUFED_SERVING_CERT_RENEW_FRACTION",
            help="renew a CSR serving certificate after this fraction of its lifetime (0-1)",
        ),
    ] = 0.8,
    qps: Annotated[
        float, typer.Option("--qps", envvar="GPUFED_QPS", help="requests/s per API server")
    ] = VIRTUAL_KUBELET_QPS,
    burst: Annotated[int, typer.Option("--burst", envvar="GPUFED_BURST", help="request burst")] = VIRTUAL_KUBELET_BURST,
    workers: Annotated[int, typer.Option("--workers", envvar="GPUFED_WORKERS", help="concurrent twin creates")] = 32,
    consumer_api_server: Annotated[
        str | None,
        typer.Option(
            "--consumer-api-server",
            envvar="GPUFED_CONSUMER_API_SERVER",
            help="host:port offloaded pods use to reach this cluster's API (default: the kubeconfig's server)",
        ),
    ] = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = METRICS_HOST,
    log_level: Annotated[str, typer.Option("--log-level", envvar="GPUFED_LOG_LEVEL")] = "info",
    exit_with_parent: Annotated[
        int | None,
        typer.Option("--exit-with-parent", hidden=True, help="PID of the supervising controller: stop when it dies"),
    ] = None,
) -> None:
    """Run the virtual nodes of a peered provider (the controller starts one process per provider)."""
    from gpufed.app.supervisor import exit_with_supervisor

    if exit_with_parent is not None:
        exit_with_supervisor(exit_with_parent)
    configure_logging(log_level)
    if qps <= 0 or burst < 1 or workers < 1:
        raise typer.BadParameter("--qps must be > 0, --burst and --workers >= 1")
    if (tls_cert_file is None) != (tls_key_file is None):
        raise typer.BadParameter("--tls-cert-file and --tls-private-key-file go together")
    if capacity not in ("live", "static"):
        raise typer.BadParameter(f"--capacity must be live or static (got {capacity!r})")
    if gpu_pools not in ("per-product", "provider"):
        raise typer.BadParameter(f"--gpu-pools must be per-product or provider (got {gpu_pools!r})")
    if unplaced_timeout < 0:
        raise typer.BadParameter("--unplaced-timeout must be >= 0 seconds (0: never)")
    if kubelet_port is not None and kubelet_ports is not None:
        raise typer.BadParameter("give --kubelet-port or --kubelet-ports, not both")
    ports = (kubelet_port, kubelet_port) if kubelet_port is not None else parse_ports(kubelet_ports or "10250-10253")
    if serving_cert_lifetime < 600:
        raise typer.BadParameter("--serving-cert-lifetime must be >= 600 seconds (the CSR API's minimum)")
    if not 0 < serving_cert_renew_fraction < 1:
        raise typer.BadParameter("--serving-cert-renew-fraction must lie between 0 and 1")
    from gpufed.apis.wire import VIRTUAL_NODE_PREFIX

    if node_name is not None and not node_name.startswith(VIRTUAL_NODE_PREFIX):
        raise typer.BadParameter(
            f"--node-name must start with {VIRTUAL_NODE_PREFIX} (the consumer's admission policy confines "
            "virtual kubelets to such nodes)"
        )
    from gpufed.app.virtual_kubelet import VirtualKubeletSettings, run
    from vkprovider.kubelet.servingcert import ServingCertSettings
    from vkprovider.node.pods import PodSettings

    serving = ServingCertSettings(
        source="files" if tls_cert_file is not None else "csr",
        cert_file=tls_cert_file,
        key_file=tls_key_file,
        lifetime_s=serving_cert_lifetime,
        renew_fraction=serving_cert_renew_fraction,
    )
    from importlib.metadata import version

    settings = VirtualKubeletSettings(
        kubeconfig=kubeconfig,
        provider=provider,
        node_name=node_name or f"{VIRTUAL_NODE_PREFIX}{provider}",
        context=context,
        node_address=node_address,
        kubelet_ports=ports,
        capacity=capacity,
        per_product_pools=gpu_pools == "per-product",
        serving_cert=serving,
        qps=qps,
        burst=burst,
        pods=PodSettings(workers=workers, unplaced_timeout_s=unplaced_timeout or None),
        consumer_api_server=consumer_api_server,
        version=f"v{version('gpufed')}-gpufed",
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )

    serve(lambda: run(settings))
