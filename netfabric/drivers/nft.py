"""nftables through the `nft` tool: a ruleset text rendered by `netfabric.render` is applied atomically
with `nft -f -` (one transaction: the table is updated or replaced, never half-written), the named
drop counters of our table are read, and our table is deleted on teardown. Other tables (kube-proxy's,
the CNI's) are never read or touched.

No maintained Python binding for libnftables installs from PyPI (python3-nftables is a Debian package
tied to the system interpreter), and pyroute2's nftables support cannot express prefix NAT; the
`nft` tool is the interface nftables documents for programs.
"""

from __future__ import annotations

import json
from typing import Any

import structlog

from netfabric.drivers.netns import DataplaneError, Netns

log = structlog.get_logger()


async def apply(ns: Netns, ruleset: str) -> None:
    await ns.run(["nft", "-f", "-"], stdin=ruleset)


async def apply_in_place(ns: Netns, update: str, replace: str) -> bool:
    """Apply `update` (an in-place update of our table); when nftables refuses it (a chain of ours
    exists with another hook, say from an older layout), apply `replace` (which deletes and rebuilds
    the table) instead. True when the table was replaced."""
    try:
        await apply(ns, update)
    except DataplaneError as e:
        log.info("nftables table rebuilt", reason=str(e).splitlines()[0][:200])
        await apply(ns, replace)
        return True
    return False


async def table_exists(ns: Netns, table: str) -> bool:
    try:
        await ns.run(["nft", "list", "table", "ip", table])
    except DataplaneError as e:
        if "No such file" in str(e):
            return False
        raise
    return True


def parse_counters(text: str) -> dict[str, int]:
    """Packets per named counter from `nft -j list counters table ...` (DataplaneError when unreadable)."""
    try:
        doc: Any = json.loads(text)
        items = doc["nftables"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataplaneError(f"nft printed no readable counters: {text[:120]!r}") from e
    if not isinstance(items, list):
        raise DataplaneError(f"nft printed no readable counters: {text[:120]!r}")
    out: dict[str, int] = {}
    for item in items:
        counter = item.get("counter") if isinstance(item, dict) else None
        if isinstance(counter, dict) and isinstance(counter.get("name"), str):
            out[counter["name"]] = int(counter.get("packets", 0))
    return out


async def counters(ns: Netns, table: str) -> dict[str, int]:
    """Packets per named counter of our table; {} when the table is not there."""
    try:
        text = await ns.run(["nft", "-j", "list", "counters", "table", "ip", table])
    except DataplaneError as e:
        if "No such file" in str(e):
            return {}
        raise
    return parse_counters(text)


async def delete_table(ns: Netns, table: str) -> bool:
    """Delete our table; False when it was not there."""
    if not await table_exists(ns, table):
        return False
    await ns.run(["nft", "delete", "table", "ip", table])
    return True
