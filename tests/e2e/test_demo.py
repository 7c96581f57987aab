"""`gpufed local demo` end to end, against the session's clusters, as `make demo` runs it.

The demo runs as a subprocess with this session's state and bin dirs. It must exit 0; every step's
header and timing must be printed, and the summary table; the requests through the Service must be
answered by the Deployment's offloaded pods (real HTTP servers at the twins' pod IPs, reached through
the WireGuard tunnels); and its clean-up must leave nothing behind, so that the modules after this one
start from clean clusters. What a killed earlier run left (a namespace no living run holds, with a
process still in it) is removed by the demo; a namespace a living run holds is left alone. The
network steps need root, /dev/net/tun, ip, nft and unshare: without
them the demo skips them loudly, and this module FAILS saying why (CI has them), after checking the
rest of the story.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufed.localenv.demo import DEFAULT_NAMESPACE, Demo, DemoSettings
from gpufed.localenv.manifests import APP
from gpufed.localenv.podnet import NS_PREFIX, REGISTRY, hold_tag, missing_requirements
from gpufed.localenv.steps import Narrator
from tests.e2e.conftest import REPO, Clusters
from tests.e2e.helpers import leftovers, processes

pytestmark = pytest.mark.timeout(900)


def _gateway_agents(kubeconfig: Path) -> list[int]:
    """Pids of `gpufed gateway` processes that point at this environment."""
    return sorted(processes("gpufed.cli gateway ", str(kubeconfig)))


@dataclass
class OtherRuns:
    """A killed run's namespace with a process still in it, and one a living run holds."""

    stale: str
    living: str
    left_process: subprocess.Popen[bytes] | None = None


@pytest.fixture
def other_runs(clusters: Clusters) -> Iterator[OtherRuns | None]:
    if missing_requirements(clusters.env.binary("wireguard-go")):
        yield None
        return
    runs = OtherRuns(stale=f"{NS_PREFIX}dead-cgw9", living=f"{NS_PREFIX}live-cgw9")
    held = hold_tag(REGISTRY, "live")  # this test is the living run
    assert held is not None
    try:
        for ns in (runs.stale, runs.living):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        runs.left_process = subprocess.Popen(["ip", "netns", "exec", runs.stale, "sleep", "900"])
        yield runs
    finally:
        if runs.left_process is not None:
            runs.left_process.kill()
            runs.left_process.wait()
        for ns in (runs.stale, runs.living):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        os.close(held)
        (REGISTRY / "live.lock").unlink(missing_ok=True)


def test_make_demo_tells_the_whole_story_and_cleans_up(clusters: Clusters, other_runs: OtherRuns | None) -> None:
    missing = missing_requirements(clusters.env.binary("wireguard-go"))
    env = {**os.environ, "COLUMNS": "200", "PATH": f"{os.environ.get('PATH', '/usr/bin:/bin')}:/usr/sbin:/sbin"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "gpufed.cli", "local", "demo",
         "--state-dir", str(clusters.env.state_dir), "--bin-dir", str(clusters.env.settings.bin_dir)],
        capture_output=True, text=True, timeout=840, check=False, cwd=REPO, env=env,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    print(text)  # the whole narration, for the report of a failure
    assert proc.returncode == 0, text[-3000:]

    # every step: its header, its outcome with seconds, its row in the summary
    steps = Demo(clusters.env, DemoSettings(), Narrator(io.StringIO())).steps()
    total = len(steps)
    summary = text[text.index("━━━ Summary") :]
    for n, step in enumerate(steps, start=1):
        skipped = bool(missing) and step.network
        if skipped:
            assert f"Step {n}/{total} ({step.title}) skipped: network steps skipped" in text
            continue
        assert f"━━━ Step {n}/{total} · {step.title} " in text, step.title
        assert re.search(rf"✓ Step {n}/{total} ok in \d+\.\d s", text), step.title
        assert re.search(rf"^\s*{n}\s+{re.escape(step.title)}\s+ok\s+\d+\.\d$", summary, re.M), step.title
    assert re.search(r"^\s+total\s+\d+\.\d$", summary, re.M)
    assert "demo OK" in text and "DEMO FAILED" not in text
    assert "The clusters keep running" in text

    if other_runs is not None:
        stale, living = other_runs.stale, other_runs.living
        assert f"deleted netns {stale}" in text and f"killed 1 process(es) left in {stale}" in text, text[-3000:]
        assert other_runs.left_process is not None and other_runs.left_process.wait(timeout=30) == -9
        assert f"deleted netns {living}" not in text
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
        assert living in listed and stale not in listed
        subprocess.run(["ip", "netns", "del", living], check=True, capture_output=True)

    if not missing:
        # The requests through the Service were answered by the Deployment's pods, which ran on virtual
        # nodes (the demo's `kubectl get pods -o wide` lists them there), from the twins' real pod IPs.
        answers = [json.loads(line.split("│", 1)[1]) for line in text.splitlines() if '"answeredBy"' in line]
        assert answers, "no answer through the Service"
        pods = {a["answeredBy"] for a in answers}
        assert len(pods) == 2, pods  # round-robin over both replicas
        for a in answers:
            ns, pod = a["answeredBy"].split("/")
            assert ns == DEFAULT_NAMESPACE and pod.startswith(f"{APP}-"), a
            assert a["runsOn"] in ("gpu-a", "gpu-b"), a
            listed = [line for line in text.splitlines() if line.strip("│ ").startswith(pod) and "gpufed-" in line]
            assert listed, f"{pod} is not listed on a virtual node"
            # the consumer pod is seen at its remapped address, never at its own
            assert a["clientSeenAs"] != "10.244.1.10" and a["clientSeenAs"].startswith("10."), a

    # Nothing of the demo is left: later modules start from clean clusters.
    assert leftovers(clusters) == []
    got = clusters.kubectl("consumer", "get", "namespace", DEFAULT_NAMESPACE, check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert not [line for line in netns.splitlines() if line.startswith(NS_PREFIX)], netns
    assert _gateway_agents(clusters.kubeconfig) == []

    if missing:
        pytest.fail("the demo's network steps could not run on this machine: " + "; ".join(missing), pytrace=False)
