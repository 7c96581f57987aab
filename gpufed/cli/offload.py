"""`gpufed offload-namespace`, `gpufed unoffload-namespace`: flags -> `peering.ops.offload`;
progress on stderr, the result on stdout.

The kubeconfig, the namespace's name and the offloading asked for are checked before anything
connects (exit 2). The operations are imported when a command runs, not with the CLI (gpufed.cli
says why).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gpufed.cli.common import Report, Timeout, check_timeout, checked, console, fail, run_op
from gpufed.cli.kubeconfig import Context, Kubeconfig, resolve
from gpufed.cli.output import stdout_console, table
from peering.defaults import OPERATION_TIMEOUT_S

if TYPE_CHECKING:
    from peering.ops.offload import OffloadResult, UnoffloadResult

Namespace = Annotated[str, typer.Argument(help="the consumer namespace")]
#: A namespace name: a DNS label (RFC 1123).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

OFFLOAD_EPILOG = """Examples:

  gpufed offload-namespace team-a
  gpufed offload-namespace team-a --context consumer --pod-strategy Remote
  gpufed offload-namespace team-a --selector nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB
"""
UNOFFLOAD_EPILOG = """Examples:

  gpufed unoffload-namespace team-a
  gpufed unoffload-namespace team-a --context consumer --force
"""


def _check_namespace(namespace: str) -> None:
    if not _DNS_LABEL.fullmatch(namespace):
        raise fail(
            f"NAMESPACE {namespace!r} is not a namespace name (lowercase letters, digits and '-', at most 63)", code=2
        )


def offload_namespace(
    namespace: Namespace,
    kubeconfig: Kubeconfig = None,
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
    from gpufed.errors import UsageError
    from peering.ops import offload as ops
    from peering.ops.offload import OffloadError, OffloadRequest

    _check_namespace(namespace)
    check_timeout(timeout)
    target = checked(lambda: resolve(kubeconfig, context))
    req = OffloadRequest(
        kubeconfig=target.kubeconfig,
        namespace=namespace,
        context=target.context,
        pod_strategy=pod_strategy,
        mapping=mapping,
        remote_name=remote_name,
        selectors=tuple(selector or ()),
        timeout_s=timeout,
    )

    def check_spec() -> None:
        try:
            ops.build_spec(req)
        except OffloadError as e:
            raise UsageError(str(e)) from None

    checked(check_spec)
    result: OffloadResult = run_op(ops.offload(req, Report()))
    out = stdout_console()
    t = table(
        f"namespace {result.namespace} (pods: {result.pod_strategy}): {result.phase}",
        ("provider", "twin namespace", "phase", "message"),
    )
    for r in result.remote_namespaces:
        t.add_row(*(escape(r.get(k, "")) for k in ("clusterId", "namespace", "phase", "message")))
    out.print(t)
    if not result.remote_namespaces and result.pod_strategy != "Local":
        console.print(
            f"[yellow]note:[/] {escape(result.message)}; twins are created when a matching virtual node appears"
        )
    out.print(f"[bold green]offloaded[/] {result.namespace}")


def unoffload_namespace(
    namespace: Namespace,
    kubeconfig: Kubeconfig = None,
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

    _check_namespace(namespace)
    check_timeout(timeout)
    target = checked(lambda: resolve(kubeconfig, context))
    result: UnoffloadResult = run_op(
        ops.unoffload(
            target.kubeconfig,
            target.context,
            namespace,
            Report(),
            force=force,
            delete_volumes=delete_volumes,
            timeout_s=timeout,
        )
    )
    if result.removed:
        stdout_console().print(f"[bold green]unoffloaded[/] {result.namespace}")
    else:
        console.print(f"{result.namespace} was not offloaded")
