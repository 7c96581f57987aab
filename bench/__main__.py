"""`python -m bench`: the command line of `make bench` — which parts, which sizes, keep or stop.

Owns: argument parsing, running the chosen parts in order (one module per part: `offload`, `reflection`,
`fabric`, `gpupool` for the `gpu-pool` part and `apicost` for `api-cost`), stamping each result
with the machine it ran on, and
handing results to `bench.report`, which writes bench/results/<part>.json and regenerates
docs/benchmarks.md. Exits non-zero only when a part could not run (a missed target is a result, not
an error).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import apicost, fabric, gpupool, gpupool_trace, offload, reflection, report


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pods wants comma-separated integers, got {text!r}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"--pods wants positive integers, got {text!r}")
    return sizes


def _sizes_or_none(text: str) -> tuple[int, ...]:
    return () if text.strip().lower() in ("", "none", "0") else _sizes(text)


def _rates(text: str) -> tuple[float, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated pods per second, e.g. 50,100, or none") from e
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: rates must be positive")
    return rates


def _repeats(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeats wants a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--repeats wants a positive integer, got {text!r}")
    return n


def _durations(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpu-durations wants MIN,MAX seconds, got {text!r}") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"--gpu-durations wants 0 < MIN <= MAX, got {text!r}")
    return lo, hi


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpu-group-share wants a number in [0, 1], got {text!r}") from None
    if not 0 <= share <= 1:
        raise argparse.ArgumentTypeError(f"--gpu-group-share wants a number in [0, 1], got {text!r}")
    return share


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if not modes or any(m not in gpupool.MODES for m in modes):
        raise argparse.ArgumentTypeError(f"--gpu-modes wants some of {', '.join(gpupool.MODES)}, got {text!r}")
    return modes


PARTS = ("offload", "reflection", "fabric", "gpu-pool", "api-cost")


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"unknown part(s) {unknown or text!r}; parts: {', '.join(PARTS)}")
    return parts


def _run_part(part: str, args: argparse.Namespace, bin_dir: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    if part == "offload":
        return offload.run(
            offload.OffloadOptions(
                sizes=args.pods,
                state_dir=args.state_dir,
                bin_dir=bin_dir,
                base_port=args.base_port,
                concurrency=args.concurrency,
                keep=args.keep,
                scheduled_sizes=args.scheduled_pods,
                steady_s=args.steady,
                profile=args.profile,
                rates=args.paced_rates,
                paced_s=args.paced_seconds,
                repeats=args.repeats,
            ),
            progress,
        )
    if part == "gpu-pool":
        return gpupool.run(
            gpupool.GpuPoolOptions(
                state_dir=args.gpu_state_dir,
                bin_dir=bin_dir,
                base_port=args.gpu_base_port,
                jobs=args.gpu_jobs,
                seed=args.gpu_seed,
                durations_s=args.gpu_durations,
                group_share=args.gpu_group_share,
                limit_factor=args.gpu_limit_factor,
                stall_s=args.gpu_stall,
                modes=args.gpu_modes,
                concurrency=args.concurrency,
                keep=args.keep,
            ),
            progress,
        )
    if part == "api-cost":
        return apicost.run(
            apicost.ApiCostOptions(
                bin_dir=bin_dir,
                providers=args.providers,
                window_s=args.api_window,
                concurrency=args.concurrency,
                keep=args.keep,
            ),
            progress,
        )
    if part == "fabric":
        return fabric.run(
            fabric.FabricOptions(
                bin_dir, seconds=args.fabric_seconds, runs=args.fabric_runs, round_trips=args.fabric_round_trips
            ),
            progress,
        )
    return reflection.run(
        reflection.ReflectionOptions(
            args.state_dir, bin_dir, args.base_port, rate=args.rate, duration_s=args.duration, keep=args.keep
        ),
        progress,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--parts", type=_parts, default=PARTS, help=f"comma-separated parts to run ({', '.join(PARTS)})")
    p.add_argument(
        "--pods",
        type=_sizes,
        default=offload.DEFAULT_SIZES,
        help="offload: pre-bound burst sizes (default 100,1000; the clusters grow for larger ones, e.g. 2000)",
    )
    p.add_argument(
        "--scheduled-pods",
        type=_sizes_or_none,
        default=offload.DEFAULT_SCHEDULED_SIZES,
        help="offload: burst sizes through the kube-scheduler (default 500; 'none' for none)",
    )
    p.add_argument(
        "--paced-rates",
        type=_rates,
        default=offload.DEFAULT_RATES,
        help="offload: paced runs, pods per second (default 50,100; 'none' for none)",
    )
    p.add_argument(
        "--paced-seconds",
        type=float,
        default=offload.DEFAULT_PACED_S,
        help=f"offload: seconds each paced run creates pods for ({offload.DEFAULT_PACED_S:g})",
    )
    p.add_argument(
        "--repeats",
        type=_repeats,
        default=None,
        help=f"offload: times each row runs its baseline and virtual arms, alternately, reported as medians "
        f"(default: {offload.DEFAULT_REPEATS} for bursts of up to {offload.REPEAT_MAX_PODS} pods, 1 for larger "
        "bursts and paced runs); pre-bound rows delete every second repeat with grace 0",
    )
    p.add_argument(
        "--steady", type=float, default=offload.STEADY_S, help="offload: seconds of footprint sampling per size (10)"
    )
    p.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="offload: do not run py-spy on the virtual kubelet during the largest pre-bound burst (its first repeat)",
    )
    p.add_argument("--concurrency", type=int, default=offload.DEFAULT_CONCURRENCY, help="concurrent creates (64)")
    p.add_argument("--rate", type=float, default=reflection.DEFAULT_RATE, help="reflection: changes/s (20)")
    p.add_argument(
        "--duration", type=float, default=reflection.DEFAULT_DURATION_S, help="reflection: seconds per kind (20)"
    )
    p.add_argument(
        "--fabric-seconds", type=float, default=fabric.DEFAULT_SECONDS, help="fabric: seconds per iperf3 run (5)"
    )
    p.add_argument("--fabric-runs", type=int, default=fabric.DEFAULT_RUNS, help="fabric: runs per path (3)")
    p.add_argument(
        "--fabric-round-trips",
        type=int,
        default=fabric.DEFAULT_ROUND_TRIPS,
        help="fabric: request/response round trips per run (2000)",
    )
    trace = gpupool_trace
    p.add_argument(
        "--gpu-jobs", type=int, default=trace.DEFAULT_JOBS, help=f"gpu-pool: Jobs in the trace ({trace.DEFAULT_JOBS})"
    )
    p.add_argument("--gpu-seed", type=int, default=trace.DEFAULT_SEED, help="gpu-pool: seed of the trace (8)")
    p.add_argument(
        "--gpu-durations",
        type=_durations,
        default=trace.DEFAULT_DURATIONS_S,
        help="gpu-pool: MIN,MAX seconds a Job runs, uniform (4,16)",
    )
    p.add_argument(
        "--gpu-group-share",
        type=_share,
        default=trace.DEFAULT_GROUP_SHARE,
        help=f"gpu-pool: share of the Jobs that are groups of 2-4 pods ({trace.DEFAULT_GROUP_SHARE})",
    )
    p.add_argument(
        "--gpu-limit-factor",
        type=float,
        default=trace.DEFAULT_LIMIT_FACTOR,
        help=f"gpu-pool: a mode's time limit is this x the ideal makespan + {trace.LIMIT_EXTRA_S:.0f} s (3)",
    )
    p.add_argument(
        "--gpu-stall",
        type=float,
        default=gpupool.DEFAULT_STALL_S,
        help=f"gpu-pool: end a run after this many seconds with no pod Running and no change (60; live and kueue "
        f"at least {gpupool.LIVE_STALL_S:.0f})",
    )
    p.add_argument(
        "--gpu-modes",
        type=_modes,
        default=gpupool.MODES,
        help=f"gpu-pool: modes, in order ({','.join(gpupool.MODES)})",
    )
    p.add_argument("--gpu-state-dir", type=Path, default=gpupool.DEFAULT_STATE_DIR, help="gpu-pool environment state")
    p.add_argument(
        "--gpu-base-port",
        type=int,
        default=gpupool.DEFAULT_BASE_PORT,
        help=f"gpu-pool: first loopback port of its 3 clusters ({gpupool.DEFAULT_BASE_PORT})",
    )
    p.add_argument(
        "--providers",
        type=int,
        default=apicost.DEFAULT_PROVIDERS,
        help=f"api-cost: providers peered in the second phase ({apicost.DEFAULT_PROVIDERS})",
    )
    p.add_argument(
        "--api-window",
        type=float,
        default=apicost.DEFAULT_WINDOW_S,
        help=f"api-cost: seconds of steady state counted per phase ({apicost.DEFAULT_WINDOW_S:.0f})",
    )
    p.add_argument("--keep", action="store_true", help="leave the bench clusters running afterwards")
    p.add_argument("--state-dir", type=Path, default=offload.DEFAULT_STATE_DIR, help="bench environment state")
    p.add_argument("--base-port", type=int, default=offload.DEFAULT_BASE_PORT, help="first loopback port (16000)")
    p.add_argument("--report-only", action="store_true", help="only regenerate docs/benchmarks.md from bench/results")
    args = p.parse_args(argv)

    if args.report_only:
        print(f"wrote {report.write_docs()}")
        return 0
    bin_dir = Path(os.environ.get("GPUFED_BIN_DIR", offload.REPO / ".cache" / "bin"))
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[bench {time.monotonic() - started:6.1f}s] {msg}", flush=True)

    machine = report.machine_info(bin_dir, args.state_dir)
    failed: list[str] = []
    for part in args.parts:
        try:
            data = _run_part(part, args, bin_dir, progress)
        except Exception as e:  # the other parts still run; the exit code says a part failed
            print(f"bench: part {part} failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(part)
            continue
        data["machine"] = machine
        path = report.write_result(part, data)
        print(report.TABLES[part](data))
        print(f"wrote {path}")
    print(f"wrote {report.write_docs()}")
    if failed:
        print(f"bench: part(s) failed: {', '.join(failed)} (their earlier results, if any, were kept)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
