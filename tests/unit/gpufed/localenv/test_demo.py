"""`gpufed local demo` without clusters: its settings, its steps, its CLI verb."""

from __future__ import annotations

import io
from pathlib import Path

from typer.testing import CliRunner

from gpufed.cli import app
from gpufed.localenv.demo import Demo, DemoSettings
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.steps import Narrator
from gpufed.localenv.topology import default_topology


def test_demo_settings_default_to_the_full_story() -> None:
    s = DemoSettings()
    assert (s.namespace, s.keep, s.network) == ("team-a", False, True)


def test_the_cli_has_the_demo_verb_with_its_options() -> None:
    res = CliRunner().invoke(app, ["local", "demo", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for flag in ("--keep", "--no-network", "--namespace", "--state-dir", "--bin-dir", "--base-port"):
        assert flag in res.output


def _demo(tmp_path: Path, settings: DemoSettings) -> Demo:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology())
    return Demo(env, settings, Narrator(io.StringIO()))


def test_the_story_has_seventeen_steps_five_of_them_clean_up(tmp_path: Path) -> None:
    steps = _demo(tmp_path, DemoSettings(namespace="team-b")).steps()
    assert len(steps) == 17
    assert [s.cleanup for s in steps] == [False] * 12 + [True] * 5
    assert [s.title for s in steps if s.network] == [
        "WireGuard tunnels between the clusters",
        "A request through the Service reaches an offloaded pod",
        "Stop the gateways and remove the simulated pod networks",
    ]
    assert "Offload namespace team-b" in [s.title for s in steps]
    assert steps[-1].title == "Nothing is left behind"


def test_keep_runs_the_story_and_only_tears_the_pod_networks_down(tmp_path: Path) -> None:
    steps = _demo(tmp_path, DemoSettings(keep=True)).steps()
    assert len(steps) == 13 and [s.title for s in steps if s.cleanup] == [
        "Stop the gateways and remove the simulated pod networks"
    ]


async def test_the_hook_before_clean_up_runs_first_in_the_first_clean_up_step(tmp_path: Path) -> None:
    calls: list[str] = []

    async def hook() -> None:
        calls.append("hook")

    demo = _demo(tmp_path, DemoSettings(before_cleanup=hook))

    async def deleted() -> None:
        calls.append("delete")

    demo.story.delete_workloads = deleted  # type: ignore[method-assign]
    first_cleanup = next(s for s in demo.steps() if s.cleanup)
    await first_cleanup.run()
    assert calls == ["hook", "delete"]
