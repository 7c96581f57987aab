"""`gpufed offload-namespace`, `gpufed unoffload-namespace`: flags -> `peering.ops.offload`, with progress.

The operations are imported when a command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from gpufed.cli.common import Context, Kubeconfig, Report, Timeout, console, run_op
from peering.defaults import OPERATION_TIMEOUT_S

if TYPE_CHECKING:
    from peering.ops.offload import OffloadResult, UnoffloadResult

Namespace = Annotated[str, typer.Argument(help="the consumer namespace")]


def offload_namespace(
    namespace: Namespace,
    kubeconfig: Kubeconfig,
    context: Context = None,
    pod_strategy: Annotated[
        str,
        typer.Option(
            "--pod-strategy",
            help="where the namespace's pods may run: Local, Remote (virtual nodes only) or LocalAndRemote",
        ),
    ] = "LocalAndRemote",
    mapping: Annotated[
        str,
        typer.Option(
            "--mapping",
            help="twin namespace names: DefaultName (<ns>-<consumer-id>), EnforceSameName or SelectedName",
        ),
    ] = "DefaultName",
    remote_name: Annotated[
        str | None, typer.Option("--remote-name", help="the twin namespace's name (with --mapping SelectedName)")
    ] = None,
    selector: Annotated[
        list[str] | None,
        typer.Option(
            "--selector",
            help="providers whose virtual node matches, e.g. nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB or "
            "'gpufed.io/remote-cluster-id in (a,b)'; repeat to require several (all must match)",
        ),
    ] = None,
    timeout: Timeout = OPERATION_TIMEOUT_S,
) -> None:
    """Extend NAMESPACE to the peered providers: twin namespaces there, and pods placed per --pod-strategy."""
    from peering.ops import offload as ops
    from peering.ops.offload import OffloadRequest

    req = OffloadRequest(
        kubeconfig=kubeconfig,
        namespace=namespace,
        context=context,
        pod_strategy=pod_strategy,
        mapping=mapping,
        remote_name=remote_name,
        selectors=tuple(selector or ()),
        timeout_s=timeout,
    )
    result: OffloadResult = run_op(ops.offload(req, Report()))
    table = Table(title=f"namespace {result.namespace} (pods: {result.pod_strategy}): {result.phase}")
    for col in ("provider", "twin namespace", "phase", "message"):
        table.add_column(col)
    for r in result.remote_namespaces:
        table.add_row(r.get("clusterId", ""), r.get("namespace", ""), r.get("phase", ""), r.get("message", ""))
    console.print(table)
    if not result.remote_namespaces and result.pod_strategy != "Local":
        console.print(f"[yellow]note:[/] {result.message}; twins are created when a matching virtual node appears")
    console.print(f"[bold green]offloaded[/] {result.namespace}")


def unoffload_namespace(
    namespace: Namespace,
    kubeconfig: Kubeconfig,
    context: Context = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="also when pods of the namespace run on virtual nodes: they are deleted once the twin "
            "namespaces are gone, so their controllers (Deployment, Job, ...) recreate them on local nodes; "
            "bare pods are not recreated",
        ),
    ] = False,
    delete_volumes: Annotated[
        bool,
        typer.Option(
            "--delete-volumes",
            help="also when claims of the namespace keep their data on providers: delete those claims, and so "
            "their data on the providers, which is lost (without it, unoffloading is refused while such claims exist)",
        ),
    ] = False,
    timeout: Timeout = OPERATION_TIMEOUT_S,
) -> None:
    """Make NAMESPACE local again: remove its twin namespaces on every provider and its offloading."""
    from peering.ops import offload as ops

    result: UnoffloadResult = run_op(
        ops.unoffload(
            kubeconfig, context, namespace, Report(), force=force, delete_volumes=delete_volumes, timeout_s=timeout
        )
    )
    if result.removed:
        console.print(f"[bold green]unoffloaded[/] {result.namespace}")
    else:
        console.print(f"{result.namespace} was not offloaded")
