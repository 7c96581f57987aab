"""netfabric.drivers.netns: commands in this process's own namespace (no root needed), and the
DataplaneError each way they fail."""

from __future__ import annotations

import pytest

from netfabric.drivers.netns import DataplaneError, Netns


async def test_run_returns_stdout_and_feeds_stdin_and_env() -> None:
    out = await Netns().run(["sh", "-c", 'cat; echo "$GPUFED_X"'], stdin="in\n", env={"GPUFED_X": "x"})
    assert out == "in\nx\n"


async def test_a_failing_command_names_itself_its_namespace_status_and_stderr() -> None:
    with pytest.raises(
        DataplaneError, match=r"^`sh -c echo no >&2; exit 3` in this network namespace failed \(3\): no$"
    ):
        await Netns().run(["sh", "-c", "echo no >&2; exit 3"])


async def test_a_missing_tool_says_it_is_not_installed() -> None:
    with pytest.raises(DataplaneError, match="gpufed-no-such-tool is not installed"):
        await Netns().run(["gpufed-no-such-tool"])


async def test_a_hung_command_is_killed_after_its_timeout() -> None:
    with pytest.raises(DataplaneError, match=r"`sleep 30` in this network namespace did not finish within 0.2 s"):
        await Netns().run(["sleep", "30"], timeout_s=0.2)


def test_a_named_namespace_runs_through_ip_netns_exec() -> None:
    assert Netns("gw-a").argv(["nft", "-f", "-"]) == ["ip", "netns", "exec", "gw-a", "nft", "-f", "-"]
    assert Netns("gw-a").describe() == "netns gw-a"
