"""The GPU node agent against this machine's real NVML, end to end through its CLI: run on a GPU node.

Owns: a check that `gpufed gpu-agent --once` (the real `NvmlReader`, no recording) reads every GPU
NVML reports and publishes them on its Node, judged against what nvidia-smi says. The Node lives in
the unit tests' in-memory API server (`tests.unit.fakes`), served over HTTP on loopback and named by
a kubeconfig, so the agent goes through its own client and flags exactly as in a DaemonSet. Writes
the Node's labels and annotations, and nvidia-smi's answers, as JSON to the file in argv[1].

Does not: run as a whole in `make test` (CI machines have no NVIDIA driver): there the unit suite runs
its `publish` (which then reports that NVML is missing) and checks that the real reader says so
instead of raising. tests/device/run.sh runs it on a machine with a GPU.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import GPU_HEALTH_ANNOTATION, GPU_HEALTHY, GPU_SOURCE_ANNOTATION
from gpupool.agent import labels as gl
from tests.paths import REPO
from tests.unit.fakes import FakeApiServer, serve

NODE = "gpu-node-1"


def smi() -> list[dict[str, str]]:
    """nvidia-smi's view of the GPUs, the independent witness."""
    fields = "index,name,uuid,memory.total,driver_version,mig.mode.current"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = fields.split(",")
    return [dict(zip(names, (v.strip() for v in line.split(",")), strict=True)) for line in out.splitlines()]


def kubeconfig(port: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "agent", "user": {"token": "device-check"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
            "current-context": "fake",
        }
    )


async def publish() -> tuple[dict[str, str], dict[str, str], str]:
    server = FakeApiServer()
    server.create("nodes", {"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
    async with serve(server) as (_, api):
        port = int(api.configuration.host.rsplit(":", 1)[1])
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as kc:
            kc.write(kubeconfig(port))
            kc.flush()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                "from gpufed.cli import main; main()",
                "gpu-agent",
                "--node",
                NODE,
                "--once",
                "--kubeconfig",
                kc.name,
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
        log = out.decode()
        if proc.returncode != 0:
            raise SystemExit(f"gpufed gpu-agent --once exited {proc.returncode}:\n{log}")
        node = server.get("nodes", "", NODE)
        assert node is not None
        meta = node["metadata"]
        return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}), log


def main(out: Path) -> None:
    gpus = smi()
    labels, annotations, log = asyncio.run(publish())
    out.write_text(json.dumps({"nvidia-smi": gpus, "labels": labels, "annotations": annotations}, indent=1) + "\n")
    print(log)
    print(json.dumps({"labels": labels, "annotations": annotations}, indent=1))
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    check(annotations.get(GPU_SOURCE_ANNOTATION) == "nvml", f"{GPU_SOURCE_ANNOTATION} is nvml")
    check(labels.get(gl.GPU_COUNT_LABEL) == str(len(gpus)), f"{gl.GPU_COUNT_LABEL} = nvidia-smi's {len(gpus)}")
    products = {gl.product_label_value(g["name"]) for g in gpus}
    check(len(products) != 1 or labels.get(GPU_PRODUCT_LABEL) in products, f"product label one of {products}")
    memory = {g["memory.total"] for g in gpus}
    check(len(memory) != 1 or labels.get(gl.GPU_MEMORY_LABEL) in memory, f"memory label one of {memory} MiB")
    driver = gpus[0]["driver_version"]
    check(labels.get(f"{gl.DRIVER_VERSION_LABEL}.full") == driver, f"driver version label is nvidia-smi's {driver}")
    check(annotations.get(GPU_HEALTH_ANNOTATION) == GPU_HEALTHY, f"{GPU_HEALTH_ANNOTATION} is {GPU_HEALTHY}")
    check(labels.get("kubernetes.io/hostname") == NODE, "labels the agent does not own are left as they were")
    if failures:
        raise SystemExit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
