"""The nftables driver against a fake namespace: in-place update with a rebuild as the way out, and
reading the named drop counters."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from netfabric.drivers import nft
from netfabric.drivers.netns import COMMAND_TIMEOUT_S, DataplaneError, Netns


class ScriptedNs(Netns):
    """Answers each command with the next scripted answer (a string, or an error to raise)."""

    def __init__(self, *answers: str | DataplaneError) -> None:
        super().__init__(None)
        self.answers = list(answers)
        self.runs: list[tuple[list[str], str | None]] = []

    async def run(
        self,
        argv: Sequence[str],
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> str:
        self.runs.append((list(argv), stdin))
        answer = self.answers.pop(0)
        if isinstance(answer, DataplaneError):
            raise answer
        return answer


async def test_apply_in_place_updates_and_does_not_rebuild() -> None:
    ns = ScriptedNs("")
    assert await nft.apply_in_place(ns, "UPDATE", "REPLACE") is False
    assert ns.runs == [(["nft", "-f", "-"], "UPDATE")]


async def test_apply_in_place_rebuilds_when_the_update_is_refused() -> None:
    ns = ScriptedNs(DataplaneError("Error: Could not process rule: Operation not supported"), "")
    assert await nft.apply_in_place(ns, "UPDATE", "REPLACE") is True
    assert ns.runs == [(["nft", "-f", "-"], "UPDATE"), (["nft", "-f", "-"], "REPLACE")]


async def test_apply_in_place_raises_when_the_rebuild_fails_too() -> None:
    ns = ScriptedNs(DataplaneError("nft is not installed"), DataplaneError("nft is not installed"))
    with pytest.raises(DataplaneError, match="not installed"):
        await nft.apply_in_place(ns, "UPDATE", "REPLACE")


async def test_counters_reads_the_packets_of_each_named_counter() -> None:
    doc = {
        "nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"counter": {"family": "ip", "name": "dropped_from_peer", "table": "t", "packets": 12, "bytes": 900}},
            {"counter": {"family": "ip", "name": "dropped_to_peer", "table": "t", "packets": 0, "bytes": 0}},
        ]
    }
    ns = ScriptedNs(json.dumps(doc))
    assert await nft.counters(ns, "t") == {"dropped_from_peer": 12, "dropped_to_peer": 0}
    assert ns.runs == [(["nft", "-j", "list", "counters", "table", "ip", "t"], None)]


async def test_counters_of_a_missing_table_are_empty() -> None:
    ns = ScriptedNs(DataplaneError("Error: No such file or directory"))
    assert await nft.counters(ns, "t") == {}


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"nftables": 3}', "not json"])
def test_unreadable_counters_are_an_error(text: str) -> None:
    with pytest.raises(DataplaneError, match="no readable counters"):
        nft.parse_counters(text)
