"""Where a gateway's data plane lives: the process's own network namespace (in a cluster, the gateway
pod's) or a named one (`ip netns`, used by the local environment and the data-plane tests, where the
agent stays in the root namespace to reach the API servers on loopback).

Owns: running a command inside the namespace, and links, addresses, routes and policy rules through
pyroute2 (blocking netlink calls run in a worker thread). Errors become `DataplaneError` naming the
command or operation and the kernel's answer.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any, TypeVar

from pyroute2 import IPRoute
from pyroute2.netns import popns, pushns

from gpufed import process
from gpufed.errors import GpufedError

T = TypeVar("T")

#: Seconds a data-plane command (ip, nft, sysctl, ping, wg) may take before it is killed.
COMMAND_TIMEOUT_S = 60.0


class DataplaneError(GpufedError, RuntimeError):
    """A kernel or tool refused what the gateway asked; the message says what and why."""


@dataclass(frozen=True)
class Netns:
    """A network namespace by name; None: the calling process's own."""

    name: str | None = None

    def describe(self) -> str:
        return f"netns {self.name}" if self.name else "this network namespace"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv] if self.name else list(argv)

    async def run(
        self,
        argv: Sequence[str],
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> str:
        """Run `argv` in this namespace to its end (killed after `timeout_s`); its stdout."""
        full = self.argv(argv)
        try:
            done = await process.run(full, timeout_s=timeout_s, stdin=stdin, env={**os.environ, **(env or {})})
        except process.CommandTimeoutError as e:
            raise DataplaneError(
                f"`{' '.join(argv[:3])}` in {self.describe()} did not finish within {timeout_s:g} s"
            ) from e
        except process.CommandError as e:
            if e.returncode is None:  # could not start
                raise DataplaneError(f"{full[0]} is not installed: {e}") from e
            raise DataplaneError(
                f"`{' '.join(argv[:3])}` in {self.describe()} failed ({e.returncode}): {e.output}"
            ) from e
        return done.stdout

    async def start_daemon(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        """Run a program that daemonises (forks and exits once ready): its output must not hold our
        pipes open, so stdout is discarded and stderr kept in a file, read when it fails."""
        full = self.argv(argv)
        with tempfile.TemporaryFile() as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *full,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,
                    env={**os.environ, **(env or {})},
                    start_new_session=True,
                )
            except FileNotFoundError as e:
                raise DataplaneError(f"{full[0]} is not installed: {e}") from e
            if await proc.wait() != 0:
                err.seek(0)
                msg = err.read().decode(errors="replace").strip()
                raise DataplaneError(f"`{' '.join(argv[:2])}` in {self.describe()} failed ({proc.returncode}): {msg}")

    async def netlink(self, fn: Callable[[Any], T], what: str) -> T:
        """Run `fn(ipr)` with an IPRoute bound to this namespace, in a worker thread."""

        # Not pyroute2's NetNS: it forks a helper process, and a forked child of an asyncio process
        # shares the loop's signal wakeup fd, so the helper's SIGTERM at close() reaches our loop as
        # if we had been asked to stop. setns() on the worker thread instead (it is per thread).
        def call() -> T:
            if self.name:
                pushns(self.name)
            try:
                ipr: Any = IPRoute()
                try:
                    return fn(ipr)
                finally:
                    ipr.close()
            except Exception as e:  # pyroute2 raises NetlinkError and OSError subclasses
                raise DataplaneError(f"{what} in {self.describe()}: {e}") from e
            finally:
                if self.name:
                    popns()

        return await asyncio.to_thread(call)


def link_index(ipr: Any, ifname: str) -> int | None:
    found = ipr.link_lookup(ifname=ifname)
    return int(found[0]) if found else None


def link_mtu(ipr: Any, ifname: str) -> int:
    idx = link_index(ipr, ifname)
    if idx is None:
        raise DataplaneError(f"no interface {ifname}")
    return int(ipr.get_links(idx)[0].get_attr("IFLA_MTU"))


def route_device(ipr: Any, dst: IPv4Address) -> str | None:
    """The interface the main table routes `dst` through, if any."""
    try:
        routes = ipr.route("get", dst=str(dst))
    except Exception:  # unreachable: netlink says so with an error
        return None
    for r in routes:
        oif = r.get_attr("RTA_OIF")
        if oif:
            return str(ipr.get_links(oif)[0].get_attr("IFLA_IFNAME"))
    return None


def set_link(ipr: Any, ifname: str, address: IPv4Address, peer: IPv4Address, mtu: int) -> None:
    """Point-to-point address, MTU and up; idempotent."""
    idx = link_index(ipr, ifname)
    if idx is None:
        raise DataplaneError(f"no interface {ifname}")
    have = {(a.get_attr("IFA_LOCAL"), a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr(index=idx, family=2)}
    if (str(address), str(peer)) not in have:
        for local, _ in have:
            ipr.addr("del", index=idx, address=local, prefixlen=32)
        ipr.addr("add", index=idx, local=str(address), address=str(peer), prefixlen=32)
    ipr.link("set", index=idx, mtu=mtu, state="up")


def set_routes(ipr: Any, ifname: str, table: int, mark: int, main_routes: Sequence[IPv4Network]) -> None:
    """Policy routing for the tunnel: packets carrying `mark` use `table`, whose default route is the
    tunnel; `main_routes` (the remapped ranges) also route into it from the main table. Idempotent."""
    idx = link_index(ipr, ifname)
    if idx is None:
        raise DataplaneError(f"no interface {ifname}")
    ipr.route("replace", dst="0.0.0.0/0", oif=idx, table=table)
    for net in main_routes:
        ipr.route("replace", dst=str(net), oif=idx)
    rules = [r for r in ipr.get_rules(family=2) if r.get_attr("FRA_FWMARK") == mark]
    if not any(r.get_attr("FRA_TABLE") == table for r in rules):
        ipr.rule("add", fwmark=mark, table=table, priority=table % 30000 + 1000)


def clear_routes(ipr: Any, table: int, mark: int) -> None:
    for r in ipr.get_rules(family=2):
        if r.get_attr("FRA_FWMARK") == mark:
            ipr.rule("del", fwmark=mark, table=r.get_attr("FRA_TABLE"), priority=r.get_attr("FRA_PRIORITY"))
    try:
        ipr.flush_routes(table=table)
    except Exception:  # an empty table is fine
        return


def delete_link(ipr: Any, ifname: str) -> bool:
    idx = link_index(ipr, ifname)
    if idx is None:
        return False
    ipr.link("del", index=idx)
    return True
