"""nftables through the `nft` tool: a ruleset text rendered by `netfabric.render` is applied atomically
with `nft -f -` (one transaction: the table is replaced, never half-written), and our table is deleted
on teardown. Other tables (kube-proxy's, the CNI's) are never read or touched.

No maintained Python binding for libnftables installs from PyPI (python3-nftables is a Debian package
tied to the system interpreter), and pyroute2's nftables support cannot express prefix NAT; the
`nft` tool is the interface nftables documents for programs.
"""

from __future__ import annotations

from netfabric.drivers.netns import DataplaneError, Netns


async def apply(ns: Netns, ruleset: str) -> None:
    await ns.run(["nft", "-f", "-"], stdin=ruleset)


async def table_exists(ns: Netns, table: str) -> bool:
    try:
        await ns.run(["nft", "list", "table", "ip", table])
    except DataplaneError as e:
        if "No such file" in str(e):
            return False
        raise
    return True


async def delete_table(ns: Netns, table: str) -> bool:
    """Delete our table; False when it was not there."""
    if not await table_exists(ns, table):
        return False
    await ns.run(["nft", "delete", "table", "ip", table])
    return True
