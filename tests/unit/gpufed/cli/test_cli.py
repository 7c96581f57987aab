"""The `gpufed local` CLI: clear errors and machine-readable status without running clusters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli import app
from tests.unit.gpufed.ops.doctor.scenario import kubeconfig_of

runner = CliRunner()


def test_status_of_nothing_is_unhealthy_json(tmp_path: Path) -> None:
    res = runner.invoke(app, ["local", "status", "--state-dir", str(tmp_path / "none"), "-o", "json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert [c["name"] for c in data] == ["consumer", "gpu-a", "gpu-b"]
    assert not any(c["healthy"] for c in data)
    assert all(not comp["running"] for c in data for comp in c["components"].values())


def test_up_with_invalid_topology_fails_clearly(tmp_path: Path) -> None:
    topo = tmp_path / "t.yaml"
    topo.write_text("clusters:\n- name: UPPER\n  nodePools: [{name: p, count: 1}]\n")
    res = runner.invoke(app, ["local", "up", "--state-dir", str(tmp_path / "s"), "--topology", str(topo)])
    assert res.exit_code == 1
    assert "invalid topology" in res.output and "DNS label" in res.output
    assert not (tmp_path / "s").exists(), "nothing is created for a refused topology"


def test_down_of_nothing_succeeds(tmp_path: Path) -> None:
    res = runner.invoke(app, ["local", "down", "--state-dir", str(tmp_path / "none")])
    assert res.exit_code == 0, res.output
    assert "stopped 0 processes" in res.output


def test_version() -> None:
    res = runner.invoke(app, ["version"])
    assert res.exit_code == 0 and res.stdout.startswith("gpufed ")


def test_network_flags_are_checked_before_any_cluster_is_touched(tmp_path: Path) -> None:
    kc = str(tmp_path / "kubeconfig")
    base = ["network", "connect", "--kubeconfig", kc, "--remote-kubeconfig", kc]
    res = runner.invoke(app, [*base, "--driver", "vpp"])
    assert res.exit_code == 2 and "--driver must be auto, kernel or wireguard-go" in res.output
    res = runner.invoke(app, [*base, "--mtu", "600"])
    assert res.exit_code == 2 and "--mtu must be 0 (automatic) or 1280..9000" in res.output
    res = runner.invoke(app, ["network", "status", "--kubeconfig", kc, "-o", "xml"])
    assert res.exit_code == 2 and "--output must be one of table, wide, json, yaml" in res.output
    res = runner.invoke(app, ["network", "status", "--kubeconfig", kc])
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())


def test_peer_refuses_bad_network_flags_too(tmp_path: Path) -> None:
    kc = str(tmp_path / "kubeconfig")
    res = runner.invoke(app, ["peer", "--kubeconfig", kc, "--remote-kubeconfig", kc, "--driver", "x"])
    assert res.exit_code == 2 and "--driver must be" in res.output


def test_controller_estimator_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    base = ["controller", "--kubeconfig", str(tmp_path / "kubeconfig")]
    res = runner.invoke(app, [*base, "--estimator-port", "7443", "--estimator-host", "0.0.0.0"])
    assert res.exit_code == 2 and "--estimator-address" in " ".join(res.output.split())
    res = runner.invoke(app, [*base, "--estimator-port", "7443", "--estimator-address", "gpu-a.example"])
    assert res.exit_code == 2 and "is not host:port" in " ".join(res.output.split())
    res = runner.invoke(app, [*base, "--estimator-port", "70000"])
    assert res.exit_code == 2 and "--estimator-port must be 1..65535" in " ".join(res.output.split())


#: What only the verb that needs it may load: the HTTP and Kubernetes clients, the CRD models, the
#: composition roots, the controllers and the data plane.
WORKING_PARTS = ("aiohttp", "pydantic", "kubernetes_asyncio", "grpc", "cryptography", "structlog", "prometheus_client")
WORKING_PACKAGES = (
    "gpufed.app",
    "vkprovider.node",
    "gpufed.localenv",
    "gpufed.kube",
    "peering.ops",
    "netfabric",
)

START_PROBE = """
import json, sys
import gpufed.cli
from gpufed.cli import app
import typer.main
typer.main.get_command(app)  # every verb's click command built, as for `gpufed --help`
print(json.dumps(sorted(sys.modules)))
"""


def test_the_cli_starts_without_loading_the_parts_that_do_the_work() -> None:
    """Every gpufed process imports gpufed.cli: a verb's flags must not pull in every other
    verb's machinery (that cost ~1.5 s of each `gpufed peer` and each virtual kubelet's start)."""
    proc = subprocess.run([sys.executable, "-c", START_PROBE], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "gpufed.cli.peer" in loaded and "gpufed.cli.controller" in loaded, "the probe saw no verbs"
    heavy = [
        m
        for m in loaded
        if m.split(".")[0] in WORKING_PARTS or any(m == p or m.startswith(p + ".") for p in WORKING_PACKAGES)
    ]
    assert heavy == [], f"importing the CLI loaded {heavy}"


def test_a_verb_loads_its_parts_when_it_runs(tmp_path: Path) -> None:
    """The other side of the lazy imports: a verb that runs finds what it needs (a missing import
    inside a verb would only show when the verb runs). Each gets past its local checks and fails
    on the cluster it cannot reach."""
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(kubeconfig_of("http://127.0.0.1:1", {"token": "x"})))
    verbs = (["peer"], ["unpeer"], ["info"], ["offload-namespace", "ns"], ["unoffload-namespace", "ns"], ["pool"])
    for verb in (*verbs, ["network", "status"], ["doctor"]):
        extra = ["--remote-context", "c"] if verb[0] in ("peer", "unpeer") else []
        res = runner.invoke(app, [*verb, "--kubeconfig", str(kc), *extra])
        # a NameError or ImportError in the verb would also exit 1 under CliRunner: the exception tells
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (verb, res.output, res.exception)
        assert "error:" in res.stderr and res.stdout == "", (verb, res.stdout, res.stderr)


def test_a_failed_local_up_says_how_to_complete_or_stop_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no build script and no binaries: `up` fails at once, before it builds or starts anything
    monkeypatch.setattr("gpufed.cli.local._BUILD_SCRIPT", tmp_path / "no-build.sh")
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    state = tmp_path / "state"
    r = runner.invoke(app, ["local", "up", "--state-dir", str(state), "--bin-dir", str(empty_bin)])
    assert r.exit_code == 1, r.output
    said = " ".join(r.output.split())
    assert "missing binaries" in said, r.output
    assert f"gpufed local down --state-dir {state}" in said, r.output
