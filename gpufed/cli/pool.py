"""`gpufed pool`: GPUs per provider and product, and the GPU demand waiting in this cluster.

The report is imported when the command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from gpufed.cli.common import Context, Kubeconfig, Output, check_output, run_op


def _n(v: object) -> str:
    return "-" if v is None else str(v)


def pool(kubeconfig: Kubeconfig, context: Context = None, output: Output = "table") -> None:
    """GPUs per provider and product — total, granted, in use, free, largest placeable — and pending demand."""
    from gpufed.ops.pool import pool as pool_report

    check_output(output)
    console = Console()  # the report is the command's output: stdout, like -o json
    data = run_op(pool_report(kubeconfig, context))
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    t = Table(title="GPU pool (live capacity from each provider's estimator)")
    for col in ("provider", "node", "product", "ready", "total", "granted", "in use", "free", "largest", "capacity"):
        t.add_column(col)
    for p in data["pools"]:
        t.add_row(
            p["provider"],
            p["node"],
            p["product"] or "(any)",
            "yes" if p["ready"] else "NO",
            _n(p["total"]),
            _n(p["granted"]),
            _n(p["inUse"]),
            _n(p["free"]),
            _n(p["largestPlaceable"]),
            p["capacity"],
        )
    console.print(t if data["pools"] else "no virtual nodes: peer a provider first (`gpufed peer`)")
    pending = data["pending"]
    console.print(
        f"pending GPU demand: {pending['gpus']} GPUs in {pending['pods']} pods"
        + (f" (largest request: {pending['largest']})" if pending["pods"] else "")
    )
    for provider, row in sorted(data["claims"].items()):
        shown = ", ".join(f"{c['claim']} {c['size']} ({c['remotePhase'] or c['phase']})" for c in row["items"][:10])
        more = f", and {row['claims'] - 10} more" if row["claims"] > 10 else ""
        console.print(f"claims bound on {provider}: {row['claims']} ({row['storage']}): {shown}{more}")
