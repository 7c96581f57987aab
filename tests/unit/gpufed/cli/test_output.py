"""What the read verbs print (gpufed.cli.output): data on stdout and nothing else there, every `-o`
format, tables that never cut a value when piped or on a narrow console, an example in every verb's
help, and the `kubectl-gpufed` entry point. The reports are stubbed where the verb imports them, so
no cluster is needed."""

from __future__ import annotations

import copy
import io
import json
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from rich.console import Console
from typer.testing import CliRunner

from gpufed.cli import app
from gpufed.cli.output import table

runner = CliRunner()
REPO = Path(__file__).resolve().parents[4]

#: Longer than any column gets at 80 columns: rich would cut it to `gpufed-gpu-b-…`.
NODE = "gpufed-gpu-b-0123abcd-nvidia-a100-sxm4-40gb-with-a-long-suffix"
PRODUCT = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-and-then-some"

POOL: dict[str, Any] = {
    "pools": [
        {
            "provider": "gpu-b-0123abcd",
            "node": NODE,
            "product": PRODUCT,
            "ready": True,
            "total": 8,
            "granted": 8,
            "inUse": 2,
            "free": 6,
            "largestPlaceable": 4,
            "capacity": "Live",
        }
    ],
    "pending": {"gpus": 3, "pods": 2, "largest": 2, "podNames": ["team-a/x", "team-a/y"]},
    "claims": {},
}

INFO: dict[str, Any] = {
    "clusterId": "consumer-1a2b3c4d",
    "keyFingerprint": "SHA256:abcdef",
    "providers": [
        {
            "clusterId": "gpu-a-3f2c91d0",
            "phase": "Peered",
            "slices": [
                {
                    "name": "gpu-a-3f2c91d0",
                    "requested": {"nvidia.com/gpu": "8"},
                    "granted": {"nvidia.com/gpu": "8"},
                    "used": {"nvidia.com/gpu": "2"},
                    "reason": "Granted",
                }
            ],
        }
    ],
    "consumers": [],
}

CONNECTIONS: list[dict[str, Any]] = [
    {
        "cluster": "gpu-a-3f2c91d0",
        "role": "provider",
        "phase": "Connected",
        "reason": "HandshakeRecent",
        "rttMs": 1.25,
        "driver": "wireguard-go",
        "mtu": 1420,
        "podCidr": "10.244.0.0/16",
        "mappedPodCidr": "10.71.0.0/16",
        "message": "a message long enough to be cut at eighty columns by a table that does not fold",
    }
]


@pytest.fixture
def stubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A kubeconfig (never reached) and the reports the verbs would read from its cluster."""
    import gpufed.ops.pool
    import peering.ops.peer
    from gpufed.cli import network

    async def pool(kubeconfig: Path, context: str | None) -> dict[str, Any]:
        return copy.deepcopy(POOL)

    async def info(ref: Any) -> dict[str, Any]:
        return copy.deepcopy(INFO)

    async def status(kubeconfig: Path, context: str | None) -> list[dict[str, Any]]:
        return copy.deepcopy(CONNECTIONS)

    monkeypatch.setattr(gpufed.ops.pool, "pool", pool)
    monkeypatch.setattr(peering.ops.peer, "info", info)
    monkeypatch.setattr(network, "network_status", status)
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c"}}],
                "current-context": "c",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kc))
    monkeypatch.setenv("COLUMNS", "80")  # what rich assumes for a pipe
    yield kc


VERBS = (["pool"], ["info"], ["network", "status"])


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_json_is_data_alone_on_stdout_with_sorted_keys(stubbed: Path, verb: list[str]) -> None:
    res = runner.invoke(app, [*verb, "-o", "json"])
    assert res.exit_code == 0 and res.stderr == "", res.output
    data = json.loads(res.stdout)
    assert res.stdout.strip() == json.dumps(data, indent=2, sort_keys=True)


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_yaml_is_the_same_data(stubbed: Path, verb: list[str]) -> None:
    as_json = json.loads(runner.invoke(app, [*verb, "-o", "json"]).stdout)
    res = runner.invoke(app, [*verb, "-o", "yaml"])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert yaml.safe_load(res.stdout) == as_json


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
@pytest.mark.parametrize("output", ["table", "wide"])
def test_tables_go_to_stdout_and_never_cut_a_value_when_piped(stubbed: Path, verb: list[str], output: str) -> None:
    res = runner.invoke(app, [*verb, "-o", output])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert "…" not in res.stdout, res.stdout
    lines = res.stdout.splitlines()
    values = {
        "pool": [NODE, PRODUCT, "gpu-b-0123abcd"],
        "info": ["consumer-1a2b3c4d", "gpu-a-3f2c91d0", "Granted"],
        "network": ["10.244.0.0/16", "10.71.0.0/16", "HandshakeRecent"],
    }[verb[0]]
    for value in values:
        assert any(value in line for line in lines), (value, res.stdout)  # whole, on one line


def test_wide_adds_columns(stubbed: Path) -> None:
    narrow = runner.invoke(app, ["pool"]).stdout
    wide = runner.invoke(app, ["pool", "-o", "wide"]).stdout
    assert "Live" not in narrow and "┃ capacity ┃" in wide and "Live" in wide
    narrow = runner.invoke(app, ["network", "status"]).stdout
    wide = runner.invoke(app, ["network", "status", "-o", "wide"]).stdout
    message = str(CONNECTIONS[0]["message"])
    assert message not in narrow and message in wide


def test_info_prints_its_report_on_stdout(stubbed: Path) -> None:
    """`gpufed info` printed its tables on stderr: a pipe got nothing."""
    res = runner.invoke(app, ["info"])
    assert res.exit_code == 0 and res.stderr == ""
    assert "cluster consumer-1a2b3c4d (key SHA256:abcdef)" in res.stdout
    assert "providers (this cluster consumes)" in res.stdout and "connections" in res.stdout


def test_notes_go_to_stderr(stubbed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpufed.ops.pool

    async def empty(kubeconfig: Path, context: str | None) -> dict[str, Any]:
        return {"pools": [], "pending": {"gpus": 0, "pods": 0, "largest": 0}, "claims": {}}

    monkeypatch.setattr(gpufed.ops.pool, "pool", empty)
    res = runner.invoke(app, ["pool"])
    assert res.exit_code == 0 and "no virtual nodes" in res.stderr and "no virtual nodes" not in res.stdout
    assert res.stdout == "pending GPU demand: 0 GPUs in 0 pods\n"


def test_a_table_on_a_narrow_console_folds_instead_of_cutting() -> None:
    """A console of 80 columns that is not a terminal: a value wraps inside its cell, whole."""
    buf = io.StringIO()
    t = table("pool", ("node", "product", "free"), right=("free",))
    t.add_row(NODE, PRODUCT, "6")
    Console(file=buf, width=80).print(t)
    text = buf.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.count("│") == 4)
    assert cells == NODE


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command under `group` (typer's command classes: no `commands` on a leaf)."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


def test_every_verb_shows_an_example_in_its_help() -> None:
    verbs = dict(_commands(typer.main.get_command(app)))
    assert {("pool",), ("info",), ("doctor",), ("network", "status"), ("local", "up")} <= set(verbs)
    for path, cmd in verbs.items():
        assert cmd.epilog and "Examples:" in cmd.epilog and f"gpufed {' '.join(path)}" in cmd.epilog, path
    res = runner.invoke(app, ["pool", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "gpufed pool -o json" in res.stdout and "$KUBECONFIG" in res.stdout


def test_kubectl_gpufed_is_the_same_app(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl gpufed pool` runs the `kubectl-gpufed` script on PATH: the same app, named as kubectl runs it."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpufed"] == "gpufed.cli:kubectl_main" and scripts["gpufed"] == "gpufed.cli:main"
    from gpufed.cli import kubectl_main

    monkeypatch.setattr(sys, "argv", ["kubectl-gpufed", "pool", "--help"])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        kubectl_main()
    assert e.value.code == 0
    assert "Usage: kubectl gpufed pool" in capsys.readouterr().out
