"""The `gpufed local` CLI: clear errors and machine-readable status without running clusters."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from vkprovider.cli import app

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
