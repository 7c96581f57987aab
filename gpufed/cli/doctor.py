"""`gpufed doctor`: flags -> `gpufed.ops.doctor.report`, the report as a table, JSON or YAML on stdout.

Exit codes: 0 when every check is OK or WARN, 1 when any FAILs or the cluster cannot be read
(a one-line error, no traceback), 2 on bad usage (flags, or a kubeconfig that cannot work, found
before anything connects). The doctor is imported when the command runs,
not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from gpufed.apis.wire import parse_cluster_id
from gpufed.cli.common import check_timeout, checked, fail, run_op
from gpufed.cli.kubeconfig import Context, Kubeconfig, resolve
from gpufed.cli.output import Output, check_output, emit, stdout_console, table
from gpufed.defaults import DOCTOR_CHECK_TIMEOUT_S, DOCTOR_SLOW_API_MS, DOCTOR_UNDERLAY_MTU

if TYPE_CHECKING:
    from gpufed.ops.doctor.checks import Report

_COLOR = {"OK": "green", "WARN": "yellow", "FAIL": "bold red"}

EPILOG = """Examples:

  gpufed doctor
  gpufed doctor --context gpu-a --remote-cluster-id consumer-1a2b3c4d
  gpufed doctor -o json | jq '.checks[] | select(.status != "OK")'
"""


def render(report: Report, console: Console) -> None:
    from gpufed.ops.doctor.checks import THIS_CLUSTER

    roles = {p.cluster_id: p.role for p in report.peers}
    t = table(
        f"gpufed doctor: cluster {report.cluster_id or '?'} ({report.api_server})",
        ("peer", "check", "status", "finding", "fix"),
    )
    last_peer: str | None = None
    for c in report.checks:
        if c.peer == THIS_CLUSTER:
            peer = "(this cluster)"
        else:
            peer = f"{c.peer} ({roles[c.peer]})" if c.peer in roles else c.peer
        t.add_row(
            escape(peer) if peer != last_peer else "",
            c.name,
            f"[{_COLOR[c.status]}]{c.status}[/]",
            escape(c.finding),
            escape(c.fix),
        )
        last_peer = peer
    console.print(t)
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in ("OK", "WARN", "FAIL")}
    console.print(
        f"[{_COLOR[report.status]}]{report.status}[/]: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + ("" if report.peers else " (no peering checked)")
    )


def doctor(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    remote_cluster_id: Annotated[
        str | None, typer.Option("--remote-cluster-id", help="check only this peer (default: every peering)")
    ] = None,
    output: Output = "table",
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds each check may take (they run side by side)")
    ] = DOCTOR_CHECK_TIMEOUT_S,
    underlay_mtu: Annotated[
        int, typer.Option("--underlay-mtu", help="MTU of the network between the gateways, to judge the tunnel MTU")
    ] = DOCTOR_UNDERLAY_MTU,
    slow_api_ms: Annotated[
        float,
        typer.Option("--slow-api-ms", help="a provider API round trip slower than this many ms is a WARN"),
    ] = DOCTOR_SLOW_API_MS,
) -> None:
    """Check this cluster's peerings end to end (installation, credentials, API, grant, virtual nodes,
    tunnel, webhook, estimator) and say what is wrong and how to fix it."""
    from gpufed.ops.doctor.report import doctor as run_doctor
    from gpufed.ops.doctor.settings import DoctorSettings

    check_output(output)
    check_timeout(timeout)
    if not 576 <= underlay_mtu <= 65535:
        raise fail("--underlay-mtu must be 576..65535", code=2)
    if not slow_api_ms > 0:  # also NaN
        raise fail("--slow-api-ms must be a positive number of milliseconds", code=2)
    if remote_cluster_id is not None:
        try:
            parse_cluster_id(remote_cluster_id)
        except ValueError as e:
            raise fail(f"--remote-cluster-id: {e}", code=2) from None
    target = checked(lambda: resolve(kubeconfig, context))
    settings = DoctorSettings(
        kubeconfig=target.kubeconfig,
        context=target.context,
        remote_cluster_id=remote_cluster_id,
        check_timeout_s=timeout,
        underlay_mtu=underlay_mtu,
        slow_api_ms=slow_api_ms,
    )
    report = run_op(run_doctor(settings))
    if not emit(report.to_dict(), output):
        render(report, stdout_console())
    if report.failed:
        raise typer.Exit(1)
