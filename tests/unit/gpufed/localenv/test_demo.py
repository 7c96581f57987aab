"""`gpufed local demo` without clusters: the step machinery (order, timing, failures, skips, clean-up,
summary, exit status), the command display, the manifests, and the pure pieces of the pod networks."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli import app
from gpufed.localenv.demo import (
    DemoError,
    DemoSettings,
    Narrator,
    Shell,
    Step,
    StepResult,
    StepSkipped,
    app_manifests,
    display,
    exit_code,
    failure_reason,
    failures,
    job_manifest,
    ready_endpoints,
    run_steps,
    summary_table,
)
from gpufed.localenv.podnet import PodNetwork, missing_requirements, service_ruleset
from tests.paths import REPO


class FakeClock:
    """Each step advances it by the seconds its work says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def work(
    clock: FakeClock, seconds: float, log: list[str], name: str, error: Exception | None = None
) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        log.append(name)
        clock.now += seconds
        if error is not None:
            raise error

    return run


async def run(steps: list[Step], clock: FakeClock, network_skip: str | None = None) -> tuple[list[StepResult], str]:
    out = io.StringIO()
    results = await run_steps(steps, Narrator(out), network_skip=network_skip, clock=clock)
    return results, out.getvalue()


async def test_every_step_runs_in_order_with_a_header_and_its_duration() -> None:
    clock, log = FakeClock(), list[str]()
    steps = [
        Step("Start the clusters", "why one", work(clock, 2.5, log, "a")),
        Step("Peer them", "why two\nsecond line", work(clock, 4.0, log, "b")),
        Step("Clean up", "why three", work(clock, 1.0, log, "c"), cleanup=True),
    ]
    results, text = await run(steps, clock)
    assert log == ["a", "b", "c"]
    assert [(r.number, r.outcome, r.seconds) for r in results] == [(1, "ok", 2.5), (2, "ok", 4.0), (3, "ok", 1.0)]
    assert "Step 1/3 · Start the clusters" in text and "why two\nsecond line" in text
    assert "✓ Step 2/3 ok in 4.0 s" in text
    assert exit_code(results) == 0 and failures(results) == []


async def test_a_failed_story_step_stops_the_story_but_every_clean_up_step_runs() -> None:
    clock, log = FakeClock(), list[str]()
    steps = [
        Step("one", "", work(clock, 1, log, "one")),
        Step("two", "", work(clock, 3, log, "two", DemoError("job/train not Complete"))),
        Step("three", "", work(clock, 1, log, "three")),
        Step("undo", "", work(clock, 1, log, "undo", RuntimeError("boom")), cleanup=True),
        Step("check", "", work(clock, 2, log, "check"), cleanup=True),
    ]
    results, text = await run(steps, clock)
    assert log == ["one", "two", "undo", "check"]
    assert [r.outcome for r in results] == ["ok", "failed", "not run", "failed", "ok"]
    assert results[1].seconds == 3 and results[1].detail == "job/train not Complete"
    assert results[2].detail == "step 2 failed" and results[2].seconds == 0
    # an unexpected exception names its type; a DemoError is already a sentence
    assert results[3].detail == "RuntimeError: boom"
    assert "✗ Step 2/5 FAILED after 3.0 s: job/train not Complete" in text
    assert exit_code(results) == 1
    assert failures(results) == [
        "step 2 (two) failed: job/train not Complete",
        "step 4 (undo) failed: RuntimeError: boom",
    ]


async def test_network_steps_are_skipped_loudly_with_the_reason() -> None:
    clock, log = FakeClock(), list[str]()
    steps = [
        Step("peer", "", work(clock, 1, log, "peer")),
        Step("tunnels", "", work(clock, 1, log, "tunnels"), network=True),
        Step("request", "", work(clock, 1, log, "request"), network=True),
        Step("teardown", "", work(clock, 1, log, "teardown"), cleanup=True, network=True),
    ]
    results, text = await run(steps, clock, network_skip="network steps skipped: not root")
    assert log == ["peer"]
    assert [r.outcome for r in results] == ["ok", "skipped", "skipped", "skipped"]
    assert "Step 2/4 (tunnels) skipped: network steps skipped: not root" in text
    assert exit_code(results) == 0  # skipping is not failing


async def test_a_step_may_skip_itself_and_a_slow_one_fails_at_its_timeout() -> None:
    clock, log = FakeClock(), list[str]()

    async def nothing_to_do() -> None:
        raise StepSkipped("namespace team-a does not exist")

    async def hangs() -> None:
        await asyncio.sleep(10)

    steps = [
        Step("stuck", "", hangs, timeout_s=0.05),
        Step("undo", "", nothing_to_do, cleanup=True),
        Step("check", "", work(clock, 1, log, "check"), cleanup=True),
    ]
    results, _ = await run(steps, clock)
    assert [r.outcome for r in results] == ["failed", "skipped", "ok"]
    assert results[0].detail == "did not finish within 0.05 s"
    assert results[1].detail == "namespace team-a does not exist"


def test_summary_table_lists_every_step_with_seconds_and_the_total() -> None:
    results = [
        StepResult(1, "Start the local clusters", "ok", 3.94),
        StepResult(2, "WireGuard tunnels", "skipped", 0.0, "not root"),
        StepResult(3, "kubectl create a GPU Job", "failed", 120.0, "timed out"),
        StepResult(4, "Unpeer", "ok", 8.0, cleanup=True),
        StepResult(5, "Nothing is left behind", "not run", 0.0, cleanup=True),
    ]
    table = summary_table(results).splitlines()
    assert table[0].split() == ["#", "step", "result", "seconds"]
    rows = {line.split()[0]: line for line in table if line.strip() and line.split()[0].isdigit()}
    assert rows["1"].endswith("3.9") and " ok " in rows["1"]
    assert rows["2"].rstrip().endswith("-") and " skipped " in rows["2"]
    assert rows["3"].endswith("120.0") and " failed " in rows["3"]
    # the clean-up steps are set apart, right before the first of them
    assert any("(clean-up)" in line for line in table)
    assert table.index(next(line for line in table if "(clean-up)" in line)) == table.index(rows["4"]) - 1
    assert table[-1].split() == ["total", "131.9"]


def test_commands_are_shown_as_users_type_them() -> None:
    gpufed = ("/venv/bin/python3", "-m", "gpufed.cli")
    repl = [("/state/kubeconfig", "$KUBECONFIG"), ("/bin/dir/kubectl", "kubectl")]
    argv = [*gpufed, "peer", "--remote-kubeconfig", "/state/kubeconfig", "--gpu-product", "A100"]
    assert display(argv, gpufed, repl) == "gpufed peer --remote-kubeconfig $KUBECONFIG --gpu-product A100"
    assert (
        display(["/bin/dir/kubectl", "get", "-o", "jsonpath={.data.clusterId}"], gpufed, repl)
        == "kubectl get -o 'jsonpath={.data.clusterId}'"
    )


def test_the_demo_job_is_the_example_a_user_writes() -> None:
    example = yaml.safe_load((REPO / "deploy" / "examples" / "gpu-job.yaml").read_text())
    assert job_manifest("team-a") == example
    assert job_manifest("other")["metadata"]["namespace"] == "other"


def test_the_deployment_asks_for_gpus_and_its_service_targets_the_server_port() -> None:
    deploy, svc = app_manifests("team-a")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # so it can only run on virtual nodes
    assert svc["spec"]["selector"] == deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["ports"][0]["targetPort"] == container["ports"][0]["containerPort"]
    # nothing gpufed-specific: no toleration, no node selector
    assert "tolerations" not in deploy["spec"]["template"]["spec"]
    assert "nodeSelector" not in deploy["spec"]["template"]["spec"]


def test_ready_endpoints_of_endpoint_slices() -> None:
    slices: list[dict[str, Any]] = [
        {
            "endpoints": [
                {"addresses": ["10.66.1.2"], "conditions": {"ready": True}, "targetRef": {"name": "b"}},
                {"addresses": ["10.64.1.5"], "targetRef": {"name": "a"}},
                {"addresses": ["10.64.1.9"], "conditions": {"ready": False}, "targetRef": {"name": "c"}},
            ]
        },
        {"endpoints": None},
    ]
    assert ready_endpoints(slices) == [("10.64.1.5", "a"), ("10.66.1.2", "b")]


def test_service_ruleset_dnats_the_cluster_ip_round_robin_to_every_endpoint() -> None:
    rules = service_ruleset("10.96.0.25", 80, [("10.64.1.5", 8080), ("10.66.1.2", 8080)])
    assert "type nat hook output priority -100" in rules
    assert "ip daddr 10.96.0.25 tcp dport 80 jump service" in rules
    assert "numgen inc mod 2 vmap { 0 : goto endpoint0, 1 : goto endpoint1 }" in rules
    assert "meta l4proto tcp dnat to 10.64.1.5:8080" in rules and "meta l4proto tcp dnat to 10.66.1.2:8080" in rules
    with pytest.raises(ValueError):
        service_ruleset("10.96.0.25", 80, [])
    with pytest.raises(ValueError):
        service_ruleset("not-an-ip", 80, [("10.64.1.5", 8080)])


def test_pod_network_names_fit_the_kernel_limits(tmp_path: Path) -> None:
    net = PodNetwork(wireguard_go=tmp_path / "wg", kubeconfig=tmp_path / "kc", gpufed=["gpufed"], logs=tmp_path)
    assert net.ns("cgw0").startswith("gfdemo") and net.tag in net.ns("cgw0")
    assert net.client == net.ns("cpod")
    names = [net._next_link(net.ns("pgw0"), "pod") for _ in range(3)]
    assert names == ["pod0", "pod1", "pod2"]
    assert net._next_link(net.ns("cpod"), "eth") == "eth0"
    assert all(len(n) <= 15 for n in names)


def test_missing_requirements_name_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("shutil.which", lambda tool: None if tool in ("nft", "ping") else f"/usr/sbin/{tool}")
    why = missing_requirements(tmp_path / "wireguard-go")
    assert any("not root" in w for w in why)
    assert any("`nft`" in w and "nftables" in w for w in why)
    assert any("`ping`" in w and "iputils-ping" in w for w in why)
    assert any("wireguard-go" in w and "make binaries" in w for w in why)
    assert not any("`ip`" in w for w in why)


def test_demo_settings_default_to_the_full_story() -> None:
    s = DemoSettings()
    assert (s.namespace, s.keep, s.network) == ("team-a", False, True)


def test_the_cli_has_the_demo_verb_with_its_options() -> None:
    res = CliRunner().invoke(app, ["local", "demo", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for flag in ("--keep", "--no-network", "--namespace", "--state-dir", "--bin-dir", "--base-port"):
        assert flag in res.output


def shell(out: io.StringIO) -> Shell:
    return Shell(Narrator(out), "/bin/kubectl", ("/venv/python", "-m", "gpufed.cli"), {"PATH": "/usr/bin:/bin"})


async def test_shell_shows_a_command_and_its_output_as_it_comes() -> None:
    out = io.StringIO()
    rc, text = await shell(out).run(["sh", "-c", "echo one; echo two >&2"])
    assert (rc, text) == (0, "one\ntwo")
    assert out.getvalue() == "$ sh -c 'echo one; echo two >&2'\n  │ one\n  │ two\n"


async def test_shell_failures_say_which_command_and_its_last_lines() -> None:
    out = io.StringIO()
    with pytest.raises(DemoError, match=r"`sh -c .*` exited with 3: a / b / c"):
        await shell(out).run(["sh", "-c", "echo x; echo a; echo b; echo c >&2; exit 3"], show=False)
    assert out.getvalue() == ""  # a quiet command prints nothing, even when it fails
    rc, text = await shell(out).run(["sh", "-c", "echo out; echo err >&2; exit 1"], show=False, check=False)
    assert rc == 1 and text == "out\nerr"
    with pytest.raises(DemoError, match=r"did not finish within 0\.2 s"):
        await shell(out).run(["sleep", "5"], timeout_s=0.2)


async def test_shell_feeds_input_to_the_command() -> None:
    rc, text = await shell(io.StringIO()).run(["cat"], input_text="kind: Job\n", show=False)
    assert (rc, text) == (0, "kind: Job")


def test_a_failed_command_is_explained_by_its_own_error_message() -> None:
    wrapped = [
        "• waiting for the twin namespaces …",
        "  ✓ gpu-a: twin ? Refused",
        "error: the providers refused the twin namespaces: gpu-a: Refused (twin namespace ",
        "'team-a-consumer-1' would be longer than 63 characters)",
    ]
    assert failure_reason(wrapped) == (
        "error: the providers refused the twin namespaces: gpu-a: Refused (twin namespace "
        "'team-a-consumer-1' would be longer than 63 characters)"
    )
    assert failure_reason(['Error from server (NotFound): jobs.batch "train" not found']).startswith("Error from")
    assert failure_reason(["a", "", "b", "c", "d"]) == "b / c / d"
    assert failure_reason([]) == "(no output)"
