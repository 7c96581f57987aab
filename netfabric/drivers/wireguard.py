"""WireGuard tunnel drivers behind one Protocol: kernel WireGuard (netlink) where the module exists,
otherwise wireguard-go on a TUN device (configured over its UAPI socket), and a fake for unit tests.

Owns: creating the interface, applying keys/peer/allowed IPs idempotently, reading the peer's
handshake and byte counters, removing the interface. Addresses, MTU and routes belong to
`netfabric.drivers.netns`; what to configure comes from `netfabric.render`.

wireguard-tools' UAPI device cannot configure a peer without an endpoint (a listening server's
case), so the UAPI "set" message is rendered by `netfabric.render.uapi_set` and sent here; reading
uses wireguard-tools. The private key is passed as hex to the device and never logged or put in an
error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pyroute2.netns import popns, pushns
from wireguard_tools import WireguardConfig, WireguardKey, WireguardPeer
from wireguard_tools.wireguard_netlink import WireguardNetlinkDevice
from wireguard_tools.wireguard_uapi import WireguardUAPIDevice

from netfabric.drivers.netns import DataplaneError, Netns, delete_link, link_index
from netfabric.render import uapi_set

UAPI_DIR = Path("/var/run/wireguard")
#: How long wireguard-go may take to bring its interface and socket up.
START_TIMEOUT_S = 10.0
T = TypeVar("T")


@dataclass(frozen=True)
class TunnelConfig:
    private_key: str = field(repr=False)  # base64, as stored in the Secret
    peer_public_key: str
    allowed_ips: tuple[IPv4Network, ...]
    listen_port: int | None = None
    endpoint: tuple[str, int] | None = None
    keepalive_s: int | None = None


@dataclass(frozen=True)
class PeerStats:
    #: Unix time of the latest handshake; None: never.
    latest_handshake: float | None
    rx_bytes: int
    tx_bytes: int


class TunnelDriver(Protocol):
    name: str

    async def available(self, ns: Netns) -> bool: ...

    async def ensure(self, ns: Netns, iface: str, config: TunnelConfig) -> None: ...

    async def stats(self, ns: Netns, iface: str) -> PeerStats | None: ...

    async def remove(self, ns: Netns, iface: str) -> bool: ...


def _hex(key_b64: str) -> str:
    try:
        return WireguardKey(key_b64).hex
    except ValueError as e:
        raise DataplaneError("a WireGuard key is malformed (expected 32 bytes, base64)") from e


def _peer_stats(cfg: WireguardConfig) -> PeerStats | None:
    for peer in cfg.peers.values():
        hs = peer.last_handshake or None
        return PeerStats(float(hs) if hs else None, int(peer.rx_bytes or 0), int(peer.tx_bytes or 0))
    return None


class WireguardGo:
    """Userspace WireGuard: `wireguard-go IFACE` (daemon mode) started inside the namespace; it keeps
    running when the gateway agent restarts, and the next agent adopts it through its socket."""

    name = "wireguard-go"

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    async def available(self, ns: Netns) -> bool:
        return await asyncio.to_thread(lambda: self.binary.is_file() and Path("/dev/net/tun").exists())

    @staticmethod
    def socket(iface: str) -> Path:
        return UAPI_DIR / f"{iface}.sock"

    async def _alive(self, iface: str) -> bool:
        sock = self.socket(iface)
        if not sock.exists():
            return False
        try:
            _reader, writer = await asyncio.open_unix_connection(str(sock))
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def ensure(self, ns: Netns, iface: str, config: TunnelConfig) -> None:
        has_link = await ns.netlink(lambda ipr: link_index(ipr, iface) is not None, f"looking up {iface}")
        if not (has_link and await self._alive(iface)):
            if has_link:  # a link without its daemon (the daemon died): start over
                await ns.netlink(lambda ipr: delete_link(ipr, iface), f"deleting stale {iface}")
            # LOG_LEVEL=error: nothing on a healthy start; the banner about kernel support goes to
            # stderr and is dropped unless the start fails
            await ns.start_daemon([str(self.binary), iface], env={"LOG_LEVEL": "error"})
            deadline = time.monotonic() + START_TIMEOUT_S
            while not await self._alive(iface):
                if time.monotonic() > deadline:
                    raise DataplaneError(
                        f"wireguard-go did not open {self.socket(iface)} within {START_TIMEOUT_S:.0f} s"
                    )
                await asyncio.sleep(0.05)
        message = uapi_set(
            _hex(config.private_key),
            config.listen_port,
            _hex(config.peer_public_key),
            config.endpoint,
            config.keepalive_s,
            list(config.allowed_ips),
            # update the peer in place: recreating it on every pass (replace_peers) cut the tunnel at
            # each resync until the client's next handshake, ~15 s a minute on the server's side
            current_peers=await self._peers(iface),
        )
        # a daemon that exits meanwhile (its link deleted, a slow start replaced) resets the socket:
        # that is a failed pass to retry, not a crash of the agent
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket(iface)))
        except OSError as e:
            raise DataplaneError(f"cannot reach wireguard-go of {iface}: {e}") from e
        try:
            writer.write(message.encode())
            await writer.drain()
            answer = (await reader.readuntil(b"\n\n")).decode()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise DataplaneError(f"wireguard-go of {iface} dropped the configuration: {e}") from e
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if answer.strip() != "errno=0":
            raise DataplaneError(f"wireguard-go refused the configuration of {iface}: {answer.strip()}")

    async def _peers(self, iface: str) -> list[str]:
        """Hex public keys of the device's peers now."""

        def read() -> list[str]:
            dev = WireguardUAPIDevice(self.socket(iface))
            try:
                return [key.hex for key in dev.get_config().peers]
            finally:
                dev.close()

        try:
            return await asyncio.to_thread(read)
        except (OSError, RuntimeError) as e:
            raise DataplaneError(f"cannot read the peers of wireguard-go {iface}: {e}") from e

    async def stats(self, ns: Netns, iface: str) -> PeerStats | None:
        if not await self._alive(iface):
            return None

        def read() -> PeerStats | None:
            dev = WireguardUAPIDevice(self.socket(iface))
            try:
                return _peer_stats(dev.get_config())
            finally:
                dev.close()

        try:
            return await asyncio.to_thread(read)
        except OSError as e:  # the daemon went away between the check and the read
            raise DataplaneError(f"cannot read wireguard-go of {iface}: {e}") from e

    async def remove(self, ns: Netns, iface: str) -> bool:
        # deleting the TUN link ends the daemon, which removes its socket
        return await ns.netlink(lambda ipr: delete_link(ipr, iface), f"deleting {iface}")


class KernelWireGuard:
    """Kernel WireGuard: a `wireguard` link configured over generic netlink (wireguard-tools). The
    netlink socket is opened inside the namespace from a worker thread that has entered it."""

    name = "kernel"

    async def available(self, ns: Netns) -> bool:
        probe = "gfprobe0"

        def try_add(ipr: Any) -> bool:
            try:
                ipr.link("add", ifname=probe, kind="wireguard")
            except Exception:  # EOPNOTSUPP and friends: no module
                return False
            delete_link(ipr, probe)
            return True

        return await ns.netlink(try_add, "probing kernel WireGuard")

    async def ensure(self, ns: Netns, iface: str, config: TunnelConfig) -> None:
        if not await ns.netlink(lambda ipr: link_index(ipr, iface) is not None, f"looking up {iface}"):
            await ns.netlink(lambda ipr: ipr.link("add", ifname=iface, kind="wireguard"), f"creating {iface}")
        peer = WireguardPeer(
            public_key=config.peer_public_key,
            endpoint_host=config.endpoint[0] if config.endpoint else None,
            endpoint_port=config.endpoint[1] if config.endpoint else None,
            persistent_keepalive=config.keepalive_s or None,
            allowed_ips=[str(n) for n in config.allowed_ips],
        )
        wg = WireguardConfig(private_key=WireguardKey(config.private_key), listen_port=config.listen_port)
        wg.add_peer(peer)
        await _in_netns(ns, lambda: _netlink_device(iface).set_config(wg))

    async def stats(self, ns: Netns, iface: str) -> PeerStats | None:
        if not await ns.netlink(lambda ipr: link_index(ipr, iface) is not None, f"looking up {iface}"):
            return None
        return await _in_netns(ns, lambda: _peer_stats(_netlink_device(iface).get_config()))

    async def remove(self, ns: Netns, iface: str) -> bool:
        return await ns.netlink(lambda ipr: delete_link(ipr, iface), f"deleting {iface}")


def _netlink_device(iface: str) -> WireguardNetlinkDevice:
    return WireguardNetlinkDevice(iface)


async def _in_netns(ns: Netns, fn: Callable[[], T]) -> T:
    """Run `fn` in a worker thread that has entered the namespace (setns is per thread)."""

    def call() -> T:
        if ns.name:
            pushns(ns.name)
        try:
            return fn()
        except Exception as e:
            raise DataplaneError(f"WireGuard netlink in {ns.describe()}: {e}") from e
        finally:
            if ns.name:
                popns()

    return await asyncio.to_thread(call)
