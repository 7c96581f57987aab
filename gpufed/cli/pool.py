"""`gpufed pool`: GPUs per provider and product, and the GPU demand waiting in this cluster.

The report is imported when the command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

from gpufed.cli.common import checked, console, run_op
from gpufed.cli.kubeconfig import Context, Kubeconfig, resolve
from gpufed.cli.output import Output, check_output, emit, stdout_console, table

EPILOG = """Examples:

  # the current context of $KUBECONFIG (or ~/.kube/config)
  gpufed pool
  gpufed pool --context consumer -o wide
  gpufed pool -o json | jq '.pools[].free'
  # the same, as a kubectl plugin
  kubectl gpufed pool -o yaml
"""


def _n(v: object) -> str:
    return "-" if v is None else str(v)


def pool(kubeconfig: Kubeconfig = None, context: Context = None, output: Output = "table") -> None:
    """GPUs per provider and product — total, granted, in use, free, reserved for a waiting group, largest
    placeable — and pending demand."""
    from gpufed.ops.pool import pool as pool_report

    check_output(output)
    target = checked(lambda: resolve(kubeconfig, context))
    data = run_op(pool_report(target.kubeconfig, target.context))
    if emit(data, output):
        return
    out = stdout_console()
    wide = output == "wide"
    columns = ["provider", "node", "product", "ready", "total", "granted", "in use", "free", "reserved", "largest"]
    t = table(
        "GPU pool (live capacity from each provider's estimator)",
        [*columns, "capacity"] if wide else columns,
        right=("total", "granted", "in use", "free", "reserved", "largest"),
    )
    for p in data["pools"]:
        row = [
            p["provider"],
            p["node"],
            p["product"] or "(any)",
            "yes" if p["ready"] else "NO",
            _n(p["total"]),
            _n(p["granted"]),
            _n(p["inUse"]),
            _n(p["free"]),
            _n(p.get("reserved")),
            _n(p["largestPlaceable"]),
        ]
        t.add_row(*row, *([p["capacity"]] if wide else []))
    if data["pools"]:
        out.print(t)
    else:
        console.print("no virtual nodes: peer a provider first (`gpufed peer`)")
    pending = data["pending"]
    out.print(
        f"pending GPU demand: {pending['gpus']} GPUs in {pending['pods']} pods"
        + (f" (largest request: {pending['largest']})" if pending["pods"] else "")
    )
    for provider, row in sorted(data["claims"].items()):
        shown = ", ".join(f"{c['claim']} {c['size']} ({c['remotePhase'] or c['phase']})" for c in row["items"][:10])
        more = f", and {row['claims'] - 10} more" if row["claims"] > 10 else ""
        out.print(f"claims bound on {provider}: {row['claims']} ({row['storage']}): {shown}{more}", markup=False)
