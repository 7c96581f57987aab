"""Commands as the demo runs and shows them: display, output streaming, failures, input, timeouts."""

from __future__ import annotations

import io

import pytest

from gpufed.localenv.shell import Shell, display, eventually, failure_reason
from gpufed.localenv.steps import Narrator, StepError


def test_commands_are_shown_as_users_type_them() -> None:
    gpufed = ("/venv/bin/python3", "-m", "gpufed.cli")
    repl = [("/state/kubeconfig", "$KUBECONFIG"), ("/bin/dir/kubectl", "kubectl")]
    argv = [*gpufed, "peer", "--remote-kubeconfig", "/state/kubeconfig", "--gpu-product", "A100"]
    assert display(argv, gpufed, repl) == "gpufed peer --remote-kubeconfig $KUBECONFIG --gpu-product A100"
    assert (
        display(["/bin/dir/kubectl", "get", "-o", "jsonpath={.data.clusterId}"], gpufed, repl)
        == "kubectl get -o 'jsonpath={.data.clusterId}'"
    )


def shell(out: io.StringIO) -> Shell:
    return Shell(Narrator(out), "/bin/kubectl", ("/venv/python", "-m", "gpufed.cli"), {"PATH": "/usr/bin:/bin"})


async def test_shell_shows_a_command_and_its_output_as_it_comes() -> None:
    out = io.StringIO()
    rc, text = await shell(out).run(["sh", "-c", "echo one; echo two >&2"])
    assert (rc, text) == (0, "one\ntwo")
    assert out.getvalue() == "$ sh -c 'echo one; echo two >&2'\n  │ one\n  │ two\n"


async def test_shell_failures_say_which_command_and_its_last_lines() -> None:
    out = io.StringIO()
    with pytest.raises(StepError, match=r"`sh -c .*` exited with 3: a / b / c"):
        await shell(out).run(["sh", "-c", "echo x; echo a; echo b; echo c >&2; exit 3"], show=False)
    assert out.getvalue() == ""  # a quiet command prints nothing, even when it fails
    rc, text = await shell(out).run(["sh", "-c", "echo out; echo err >&2; exit 1"], show=False, check=False)
    assert rc == 1 and text == "out\nerr"
    with pytest.raises(StepError, match=r"did not finish within 0\.2 s"):
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


async def test_eventually_returns_the_first_truthy_answer_or_names_what_it_waited_for() -> None:
    answers = iter([None, 0, "ready"])

    async def probe() -> str | int | None:
        return next(answers)

    assert await eventually("the thing", probe, timeout_s=5, interval_s=0.01) == "ready"

    async def never() -> bool:
        return False

    with pytest.raises(StepError, match=r"timed out after 0\.05 s waiting for the thing \(last: False\)"):
        await eventually("the thing", never, timeout_s=0.05, interval_s=0.01)
