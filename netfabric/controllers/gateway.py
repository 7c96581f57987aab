"""The gateway agent: one per peering per side (`gpufed gateway --name <peer-cluster-id>`).

Owns: turning this cluster's Gateway, RemoteNetwork, NetworkConfig and private-key Secret for one
peer into a running data plane — the WireGuard interface (kernel or wireguard-go, chosen per
`spec.driver`), its tunnel address and MTU, the nftables prefix-NAT table, the policy routing that
carries marked packets into the tunnel, the tunnel filter that drops whatever the peer sends outside
the pods of the peering and the addresses this cluster exposes (and whatever would leave into the
tunnel for anything else) — and keeping it so: it watches the three CRs (the Secret is read on each
pass) and the peering's member pods (`netfabric.controllers.members`: the consumer's twin pods on a
provider, the pods offloaded to the peer on a consumer; the filter's sets are refilled alone, within
`members_debounce_s`, when only they change), re-applies on any change and every `resync_s`
(repairing drift such as a flushed table), probes the peer across
the tunnel and publishes the Connection status (Connected / Degraded / Down with a reason, and a
`Ready` condition: True while the tunnel carries traffic, Connected or Degraded). The Gateway's
status says what runs (driver, interface, MTU) and, in its `Ready` condition, whether its spec is
applied (False with `ConfigurationFailed` and the error otherwise). After every pass it also writes
the `Ready` condition of the two objects it reads: the NetworkConfig's (`Accepted` when its spec is
valid, `Invalid` otherwise; every agent of the cluster concludes the same, and none rewrites an
unchanged condition) and its peering's RemoteNetwork's (`Applied` once the spec is valid and its
remapping is in the data plane, `Invalid` or `ConfigurationFailed` otherwise, `GatewayRemoved` on
teardown). The conditions carry the observedGeneration of the object they describe (a Connection's
is the one its last status write returned). Recovery after an underlay cut needs no action:
WireGuard's keepalive re-handshakes and the status follows the probe. When the Gateway is deleted
it removes everything it created and returns.

Metrics (label `remote_cluster` = the peer): `gpufed_tunnel_up` (1 while the Connection is
Connected or Degraded, 0 when Down), `gpufed_tunnel_rtt_seconds` (last successful probe) and
`gpufed_tunnel_last_handshake_timestamp_seconds` (Unix time of the latest WireGuard handshake),
updated after every probe; `gpufed_gateway_dropped_packets_total` (label `direction`: `from_peer`,
`to_peer`), the tunnel filter's drops, read from the table's named nftables counters after every
probe (a rebuilt table restarts them at zero; the metric keeps counting up); dropped on teardown.

Does not: allocate ranges or keys (netfabric.ops does, through the peering), render rules
(netfabric.render), or touch tables, links and rules it did not create. It never logs keys.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Counter, Gauge
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.network import (
    NETWORK_CONFIG,
    GatewaySpec,
    NetworkConfigSpec,
    RemoteNetworkSpec,
    split_endpoint,
)
from gpufed.apis.wire import SYSTEM_NAMESPACE
from gpufed.kube import conditions as cond
from gpufed.kube import meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import rfc3339
from gpufed.kube.watch import watch
from netfabric import plan as plans
from netfabric.controllers.members import Members, Role
from netfabric.drivers import nft
from netfabric.drivers.netns import DataplaneError, Netns, clear_routes, link_mtu, route_device, set_link, set_routes
from netfabric.drivers.wireguard import KernelWireGuard, PeerStats, TunnelConfig, TunnelDriver, WireguardGo
from netfabric.ipam import DEFAULT_MTU, IPAMError, mtu_for
from netfabric.render import (
    DROP_COUNTERS,
    GatewayPlan,
    RenderError,
    allowed_ips,
    filter_sets,
    interface_name,
    mark_for,
    nft_ruleset,
    nft_sets,
    nft_update,
    table_name,
)

log = structlog.get_logger()

#: Key of the private key in the gateway's Secret (base64 WireGuard key).
PRIVATE_KEY_FIELD = "privateKey"
#: Consecutive failed probes after which the connection is Down (Degraded before).
DOWN_AFTER = 3
#: WireGuard rejects a session this old without a handshake (REJECT_AFTER_TIME).
HANDSHAKE_STALE_S = 180.0
_RTT = re.compile(r"time[=<]([0-9.]+) ?ms")

TUNNEL_UP = Gauge(
    "gpufed_tunnel_up",
    "Whether the tunnel to a peer carries traffic (Connected or Degraded: 1; Down: 0).",
    ["remote_cluster"],
)
TUNNEL_RTT = Gauge(
    "gpufed_tunnel_rtt_seconds", "Round-trip time of the last successful probe across the tunnel.", ["remote_cluster"]
)
TUNNEL_HANDSHAKE = Gauge(
    "gpufed_tunnel_last_handshake_timestamp_seconds",
    "Unix time of the latest WireGuard handshake with the peer (0: none yet).",
    ["remote_cluster"],
)
GATEWAY_DROPPED = Counter(
    "gpufed_gateway_dropped_packets",
    "Packets the tunnel filter dropped: from the peer (direction=from_peer) but from or to anything else "
    "than the peering's pods and our exposed addresses, or into the tunnel (direction=to_peer) from or "
    "to anything else than the peering's pods and the peer's external range.",
    ["remote_cluster", "direction"],
)
#: `direction` label of GATEWAY_DROPPED -> the named nftables counter it is read from.
DROP_DIRECTIONS = {name.removeprefix("dropped_"): name for name in DROP_COUNTERS}


@dataclass(frozen=True)
class GatewaySettings:
    #: The Gateway object (= the peer's cluster id) in `namespace`.
    name: str
    namespace: str = SYSTEM_NAMESPACE
    #: Named network namespace of the data plane; None: this process's own (a gateway pod).
    netns: str | None = None
    #: wireguard-go binary, used when kernel WireGuard is missing or `spec.driver` asks for it.
    wireguard_go: Path = Path("wireguard-go")
    #: Seconds between probes across the tunnel.
    probe_interval_s: float = 2.0
    #: Seconds one probe waits for its answer.
    probe_timeout_s: float = 1.0
    #: Seconds between full re-applies of the data plane (drift repair).
    resync_s: float = 60.0
    #: Seconds after which an unchanged Connection status is written again (RTT, handshake age).
    status_refresh_s: float = 30.0
    #: Seconds a change of the member pods waits for more before the filter's sets are refilled.
    members_debounce_s: float = 0.1


@dataclass
class Inputs:
    gateway: GatewaySpec
    network: NetworkConfigSpec
    remote: RemoteNetworkSpec
    private_key: str = field(repr=False)


@dataclass
class Health:
    failures: int = 0
    rtt_ms: float | None = None
    stats: PeerStats | None = None


class GatewayDeletedError(LookupError):
    """The Gateway object was deleted: tear down."""


def judge(health: Health, error: str | None, now: float) -> tuple[str, str, str]:
    """(phase, reason, message) of a Connection from the latest probes; pure."""
    if error:
        return "Down", "ConfigurationFailed", error
    if health.stats is None:
        return "Down", "InterfaceMissing", "the WireGuard interface is not there"
    hs = health.stats.latest_handshake
    age = None if hs is None else max(0.0, now - hs)
    if health.failures == 0:
        return "Connected", "ProbeSucceeded", f"peer answers across the tunnel in {health.rtt_ms or 0:.2f} ms"
    if health.failures < DOWN_AFTER:
        return "Degraded", "ProbeLoss", f"{health.failures} probe(s) in a row lost"
    if age is None:
        return "Down", "NoHandshake", "no WireGuard handshake with the peer yet (is its gateway running and reachable?)"
    if age > HANDSHAKE_STALE_S:
        return "Down", "HandshakeStale", f"last WireGuard handshake {age:.0f} s ago; the underlay may be cut"
    return "Down", "ProbeFailing", f"{health.failures} probes in a row lost (last handshake {age:.0f} s ago)"


def _spec(obj: dict[str, Any] | None, model: Any, what: str) -> Any:
    if obj is None:
        raise LookupError(f"{what} not found")
    try:
        return model.model_validate(obj.get("spec") or {})
    except ValidationError as e:
        raise ValueError(f"{what} is invalid: {e.errors()[0]['msg']}") from e


class GatewayAgent:
    def __init__(
        self,
        api: Any,
        settings: GatewaySettings,
        drivers: list[TunnelDriver] | None = None,
        clock: Callable[[], float] = time.time,
        members: Callable[[Role, Callable[[], None]], Members] | None = None,
    ) -> None:
        self.api = api
        self.s = settings
        self.ns = Netns(settings.netns)
        self.drivers = drivers or [KernelWireGuard(), WireguardGo(settings.wireguard_go)]
        self.clock = clock
        self.dirty = asyncio.Event()
        self.gone = asyncio.Event()
        self.ready = asyncio.Event()
        self.driver: TunnelDriver | None = None
        self.inputs: Inputs | None = None
        self.error: str | None = None
        self.health = Health()
        self._written: tuple[str, str] | None = None
        self._written_at = 0.0
        self._since: str | None = None
        #: The Gateway status last written (without times), its Ready condition, and the Gateway's
        #: metadata.generation as last read (None before the first read).
        self._gateway_status: dict[str, Any] | None = None
        self._gateway_ready: dict[str, Any] | None = None
        self._gateway_generation: int | None = None
        #: The NetworkConfig and the RemoteNetwork as the last pass read them (absent: not there, or
        #: the pass failed before reading them), whose Ready conditions that pass writes.
        self._fabric: dict[str, dict[str, Any]] = {}
        #: The Connection's Ready condition last written, and its generation as the last write returned.
        self._connection_ready: dict[str, Any] | None = None
        self._connection_generation = 1
        #: The drop counters' packets as last read (a smaller value: the table was rebuilt).
        self._drops_seen: dict[str, int] = {}
        self.log = log.bind(remote_cluster=settings.name, kind="Gateway")
        self._new_members = members or (lambda role, changed: Members(api, settings.name, role, changed))
        self.members: Members | None = None
        self.members_changed = asyncio.Event()
        self._members_task: asyncio.Task[None] | None = None
        #: The plan last applied (its sets are what the filter holds), under `_plane`.
        self.plan: GatewayPlan | None = None
        self._plane = asyncio.Lock()

    def _path(self, plural: str, name: str, sub: str = "") -> str:
        return rest.path(API_VERSION, plural, name, namespace=self.s.namespace, sub=sub)

    # ---- inputs

    async def read(self) -> Inputs:
        self._fabric = {}
        gw = await rest.get(self.api, self._path("gateways", self.s.name))
        if gw is None:
            raise GatewayDeletedError(f"Gateway.gpufed.io {self.s.namespace}/{self.s.name} not found")
        self._gateway_generation = meta.generation(gw)
        if self._gateway_ready is None:  # a restarted agent keeps the transition time
            found = cond.find((gw.get("status") or {}).get("conditions"), cond.READY)
            self._gateway_ready = dict(found) if found else None
        network_obj = await rest.get(self.api, self._path("networkconfigs", NETWORK_CONFIG))
        remote_obj = await rest.get(self.api, self._path("remotenetworks", self.s.name))
        self._fabric = {
            plural: obj
            for plural, obj in (("networkconfigs", network_obj), ("remotenetworks", remote_obj))
            if obj is not None
        }
        spec: GatewaySpec = _spec(gw, GatewaySpec, f"Gateway.gpufed.io {self.s.namespace}/{self.s.name}")
        network: NetworkConfigSpec = _spec(network_obj, NetworkConfigSpec, self._what("networkconfigs"))
        remote: RemoteNetworkSpec = _spec(remote_obj, RemoteNetworkSpec, self._what("remotenetworks"))
        secret = await rest.get(
            self.api, rest.path("v1", "secrets", spec.private_key_secret, namespace=self.s.namespace)
        )
        raw = ((secret or {}).get("data") or {}).get(PRIVATE_KEY_FIELD)
        if not raw:
            raise LookupError(f"Secret {self.s.namespace}/{spec.private_key_secret} has no {PRIVATE_KEY_FIELD}")
        return Inputs(spec, network, remote, base64.b64decode(raw).decode().strip())

    def _what(self, plural: str) -> str:
        """How messages name the NetworkConfig (`networkconfigs`) or the RemoteNetwork (`remotenetworks`)."""
        if plural == "networkconfigs":
            return f"NetworkConfig {self.s.namespace}/{NETWORK_CONFIG}"
        return f"RemoteNetwork {self.s.namespace}/{self.s.name}"

    # ---- data plane

    async def _choose_driver(self, wanted: str) -> TunnelDriver:
        for d in self.drivers:
            if wanted in ("auto", d.name) and await d.available(self.ns):
                return d
        names = ", ".join(d.name for d in self.drivers if wanted in ("auto", d.name)) or wanted
        raise DataplaneError(
            f"no WireGuard data plane for driver {wanted!r} in {self.ns.describe()} (tried {names}): "
            "load the wireguard kernel module, or provide wireguard-go and /dev/net/tun"
        )

    async def _mtu(self, spec: GatewaySpec) -> int:
        if spec.mtu:
            return spec.mtu
        target: IPv4Address | None = None
        if spec.endpoint:
            with contextlib.suppress(ValueError):
                target = IPv4Address(split_endpoint(spec.endpoint)[0])

        def underlay(ipr: Any) -> int | None:
            dev = route_device(ipr, target) if target else None
            return link_mtu(ipr, dev) if dev else None

        under = await self.ns.netlink(underlay, "reading the underlay MTU")
        # the peer's underlay family is not known here: leave room for IPv6 (80 B) to be safe
        return mtu_for(under, ipv6_underlay=True) if under else DEFAULT_MTU

    async def apply(self, inp: Inputs) -> None:
        spec = inp.gateway
        if not spec.peer_public_key:
            raise DataplaneError("the peer's public key is not known yet (run `gpufed network connect`)")
        if spec.role == "Client" and not spec.endpoint:
            raise DataplaneError("a client gateway needs spec.endpoint, the server gateway's host:port")
        local_ip, peer_ip = IPv4Address(spec.tunnel_address), IPv4Address(spec.peer_tunnel_address)
        gp = self._plan(inp)
        driver = self.driver
        if driver is None or spec.driver not in ("auto", driver.name):
            driver = await self._choose_driver(spec.driver)
        cfg = TunnelConfig(
            private_key=inp.private_key,
            peer_public_key=spec.peer_public_key,
            allowed_ips=tuple(allowed_ips(gp, peer_ip)),
            listen_port=spec.listen_port if spec.role == "Server" else None,
            endpoint=await _resolve(split_endpoint(spec.endpoint)) if spec.role == "Client" else None,
            keepalive_s=spec.keepalive_s or None,
        )
        await driver.ensure(self.ns, gp.interface, cfg)
        self.driver = driver
        mtu = await self._mtu(spec)
        await self.ns.netlink(lambda ipr: set_link(ipr, gp.interface, local_ip, peer_ip, mtu), "configuring the tunnel")
        # in place: the drop counters and the allowed sets are updated, never recreated, on a re-apply
        await nft.apply_in_place(self.ns, nft_update(gp), nft_ruleset(gp))
        self.plan = gp
        mapped = [gp.peer_pod.mapped] + ([gp.peer_external.mapped] if gp.peer_external else [])
        await self.ns.netlink(
            lambda ipr: set_routes(ipr, gp.interface, gp.mark, gp.mark, mapped), "routing into the tunnel"
        )
        # forwarding is per namespace; a gateway pod's is usually on already and /proc/sys may be
        # read-only there, so write it only when it is off
        if (await self.ns.run(["sysctl", "-n", "net.ipv4.ip_forward"])).strip() != "1":
            await self.ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        await self._status_gateway(driver.name, gp.interface, mtu)

    def _plan(self, inp: Inputs) -> GatewayPlan:
        """The plan for `inp` and the member pods now (none before the members' first listing)."""
        spec = inp.gateway
        tunnel = (IPv4Address(spec.tunnel_address), IPv4Address(spec.peer_tunnel_address))
        members = self.members.addresses() if self.members is not None else frozenset()
        server = spec.role == "Server"
        return plans.gateway_plan(
            inp.network,
            inp.remote,
            spec.masquerade,
            tunnel,
            local_members=members if server else None,
            peer_members_mapped=None if server else members,
        )

    async def refresh_members(self) -> None:
        """Refill the filter's sets to the member pods now, when they differ from what was applied."""
        async with self._plane:
            if self.plan is None or self.inputs is None:
                return
            try:
                gp = self._plan(self.inputs)
            except (RenderError, IPAMError, ValueError) as e:
                self.log.warning("tunnel filter members not applied", error=str(e))
                return
            if filter_sets(gp) == filter_sets(self.plan):
                return
            try:
                await nft.apply(self.ns, nft_sets(gp))
            except DataplaneError as e:
                self.log.info("tunnel filter sets not refilled; re-applying the table", error=str(e)[:200])
                self.dirty.set()
                return
            self.plan = gp

    def _ensure_members(self, role: Role, tg: asyncio.TaskGroup | None) -> None:
        """Watch the member pods for `role` (again, if the role changed)."""
        if self.members is not None and self.members.role == role:
            return
        if self._members_task is not None:
            self._members_task.cancel()
        self.members = self._new_members(role, self.members_changed.set)
        if tg is not None:
            self._members_task = tg.create_task(self.members.run())

    async def teardown(self) -> None:
        gp_iface, table, mark = _names(self.s.name)
        for d in self.drivers:
            with contextlib.suppress(DataplaneError):
                await d.remove(self.ns, gp_iface)
        with contextlib.suppress(DataplaneError):
            await nft.delete_table(self.ns, table)
        with contextlib.suppress(DataplaneError):
            await self.ns.netlink(lambda ipr: clear_routes(ipr, mark, mark), "removing policy routing")
        for gauge in (TUNNEL_UP, TUNNEL_RTT, TUNNEL_HANDSHAKE):
            with contextlib.suppress(KeyError):  # never exported (prometheus-client < 0.21 raises then)
                gauge.remove(self.s.name)
        for direction in DROP_DIRECTIONS:
            with contextlib.suppress(KeyError):
                GATEWAY_DROPPED.remove(self.s.name, direction)
        self.log.info("gateway removed", interface=gp_iface)
        with contextlib.suppress(KubeError):  # a RemoteNetwork deleted with its Gateway needs no status
            remote = await rest.get(self.api, self._path("remotenetworks", self.s.name))
            if remote is not None:
                message = "the Gateway was deleted and the remapping removed from the data plane"
                await self._write_ready("remotenetworks", remote, False, "GatewayRemoved", message)

    # ---- status

    async def _status_gateway(self, driver: str, iface: str, mtu: int) -> None:
        """What runs, and Ready: this spec is applied."""
        ready = self._gateway_condition(True, "Applied", f"{driver} interface {iface} configured, MTU {mtu}")
        await self._write_gateway_status({"driver": driver, "interface": iface, "mtu": mtu, "conditions": [ready]})

    async def _status_failed(self, error: str) -> None:
        """Ready False: this spec is not applied (what runs stays as last written)."""
        if self._gateway_generation is None:
            return  # the Gateway was never read: there is nothing to write the status on
        await self._write_gateway_status(
            {"conditions": [self._gateway_condition(False, "ConfigurationFailed", error[:500])]}
        )

    def _gateway_condition(self, ok: bool, reason: str, message: str) -> dict[str, Any]:
        prev = [self._gateway_ready] if self._gateway_ready else []
        ready = cond.condition(cond.READY, ok, reason, message, prev, now=self.clock())
        return {**ready, "observedGeneration": self._gateway_generation or 1}

    async def _write_gateway_status(self, status: dict[str, Any]) -> None:
        """A merge patch of the Gateway's status, sent when it changes (not on every re-apply)."""
        key = cond.without_times(status)
        if self._gateway_status is not None and {**self._gateway_status, **key} == self._gateway_status:
            return
        try:
            await rest.merge_patch(self.api, self._path("gateways", self.s.name, "status"), {"status": status})
        except KubeError as e:
            self.log.warning("cannot write the gateway status", error=str(e))
            return
        self._gateway_status = {**(self._gateway_status or {}), **key}
        self._gateway_ready = status["conditions"][0]

    async def _status_fabric(self) -> None:
        """Ready on the NetworkConfig and the RemoteNetwork this pass read: the NetworkConfig's spec
        is accepted when it is valid; the RemoteNetwork's remapping is in place when its spec is valid
        and this pass applied the data plane (`self.error` is None)."""
        network = self._fabric.get("networkconfigs")
        if network is not None:
            try:
                spec: NetworkConfigSpec = _spec(network, NetworkConfigSpec, self._what("networkconfigs"))
            except ValueError as e:
                await self._write_ready("networkconfigs", network, False, "Invalid", str(e))
            else:
                message = f"pod CIDR {spec.pod_cidr}, external CIDR {spec.external_cidr}"
                await self._write_ready("networkconfigs", network, True, "Accepted", message)
        remote = self._fabric.get("remotenetworks")
        if remote is not None:
            try:
                peer: RemoteNetworkSpec = _spec(remote, RemoteNetworkSpec, self._what("remotenetworks"))
            except ValueError as e:
                await self._write_ready("remotenetworks", remote, False, "Invalid", str(e))
                return
            if self.error is not None:
                await self._write_ready("remotenetworks", remote, False, "ConfigurationFailed", self.error[:500])
                return
            real, mapped = peer.real, peer.mapped
            message = (
                f"the peer's pods {real.pod_cidr} are reached as {mapped.pod_cidr}, "
                f"its external range {real.external_cidr} as {mapped.external_cidr}"
            )
            await self._write_ready("remotenetworks", remote, True, "Applied", message)

    async def _write_ready(self, plural: str, obj: dict[str, Any], ok: bool, reason: str, message: str) -> None:
        """A merge patch of `obj`'s status with this Ready condition, observed at its generation; not
        sent when the object already carries it (times aside), so several agents writing the same
        NetworkConfig's agree instead of rewriting it in turn."""
        old = (obj.get("status") or {}).get("conditions") or []
        ready = cond.condition(cond.READY, ok, reason, message, old, now=self.clock())
        status = {"conditions": cond.observed([ready], meta.generation(obj))}
        if cond.without_times(status) == cond.without_times({"conditions": old}):
            return
        try:
            await rest.merge_patch(self.api, self._path(plural, meta.name(obj), "status"), {"status": status})
        except KubeError as e:
            self.log.warning("cannot write the status", object=self._what(plural), error=str(e))

    async def probe(self) -> None:
        if self.inputs is None or self.driver is None:
            self.health = Health(failures=self.health.failures + 1)
            return
        gp_iface = _names(self.s.name)[0]
        try:
            stats = await self.driver.stats(self.ns, gp_iface)
        except DataplaneError:
            stats = None
        peer = self.inputs.gateway.peer_tunnel_address
        timeout = max(1, round(self.s.probe_timeout_s))
        try:
            out = await self.ns.run(["ping", "-n", "-q", "-c", "1", "-W", str(timeout), peer])
            m = _RTT.search(out) or re.search(r"= [0-9.]+/([0-9.]+)/", out)
            self.health = Health(0, float(m.group(1)) if m else None, stats)
        except DataplaneError:
            self.health = Health(self.health.failures + 1, None, stats)
        await self.count_drops()

    async def count_drops(self) -> None:
        """Add what the tunnel filter dropped since the last reading to GATEWAY_DROPPED (and log it)."""
        try:
            now = await nft.counters(self.ns, _names(self.s.name)[1])
        except DataplaneError as e:
            self.log.debug("cannot read the tunnel filter's counters", error=str(e))
            return
        for direction, counter in DROP_DIRECTIONS.items():
            packets = now.get(counter)
            if packets is None:
                continue
            seen = self._drops_seen.get(counter, 0)
            new = packets - seen if packets >= seen else packets  # a rebuilt table starts again at zero
            self._drops_seen[counter] = packets
            GATEWAY_DROPPED.labels(self.s.name, direction).inc(new)
            if new:
                self.log.warning(
                    "tunnel filter dropped packets outside the allowed ranges", direction=direction, packets=new
                )

    def _export(self, phase: str) -> None:
        peer = self.s.name
        TUNNEL_UP.labels(peer).set(0 if phase == "Down" else 1)
        if self.health.rtt_ms is not None:
            TUNNEL_RTT.labels(peer).set(self.health.rtt_ms / 1000)
        hs = self.health.stats.latest_handshake if self.health.stats else None
        TUNNEL_HANDSHAKE.labels(peer).set(hs or 0)

    async def publish(self, force: bool = False) -> None:
        phase, reason, message = judge(self.health, self.error, self.clock())
        self._export(phase)
        now = self.clock()
        changed = self._written != (phase, reason)
        if not (changed or force or now - self._written_at >= self.s.status_refresh_s):
            return
        stamp = rfc3339(now)
        if changed or self._since is None:
            self._since = stamp
        hs = self.health.stats.latest_handshake if self.health.stats else None
        prev = [self._connection_ready] if self._connection_ready else []
        ready = cond.condition(cond.READY, phase in ("Connected", "Degraded"), reason, message, prev, now=now)
        ready["observedGeneration"] = self._connection_generation
        status = {
            "phase": phase,
            "reason": reason,
            "message": message,
            "rttMs": self.health.rtt_ms,
            "latestHandshake": rfc3339(hs) if hs else None,
            "lastProbe": stamp,
            "lastTransitionTime": self._since,
            "conditions": [ready],
        }
        # the Connection is created (owned by the Gateway) by `gpufed network connect`, never here:
        # an agent racing a disconnect must not resurrect it
        try:
            written = await rest.merge_patch(
                self.api, self._path("connections", self.s.name, "status"), {"status": status}
            )
        except KubeError as e:
            self.log.warning("cannot write the connection status", error=str(e))
            return
        if changed:
            self.log.info("connection", phase=phase, reason=reason, message=message)
        self._written, self._written_at = (phase, reason), now
        self._connection_ready = ready
        generation = meta.generation(written)
        if generation != self._connection_generation:  # the next probe writes the right one
            self._connection_generation, self._written_at = generation, 0.0

    # ---- loops

    async def reconcile(self, tg: asyncio.TaskGroup | None = None) -> None:
        try:
            inputs = await self.read()
            self._ensure_members(inputs.gateway.role, tg)
            async with self._plane:
                self.inputs = inputs
                await self.apply(inputs)
            self.error = None
        except GatewayDeletedError:
            self.gone.set()
            return
        except (LookupError, ValueError, DataplaneError, IPAMError, RenderError, KubeError) as e:
            self.error = str(e)
        if self.error:
            self.log.warning("gateway not applied", error=self.error)
            await self._status_failed(self.error)
        await self._status_fabric()
        self.ready.set()

    async def _watch(self, plural: str, name: str) -> None:
        def on_event(t: str, obj: dict[str, Any]) -> None:
            self.dirty.set()
            if plural == "gateways" and t == "DELETED":
                self.gone.set()

        path = rest.path(API_VERSION, plural, namespace=self.s.namespace)
        await watch(
            self.api,
            path,
            on_event,
            what=f"{plural}/{name}",
            params={"fieldSelector": f"metadata.name={name}"},
        )

    async def _members_loop(self) -> None:
        while not self.gone.is_set():
            await self.members_changed.wait()
            await asyncio.sleep(self.s.members_debounce_s)
            self.members_changed.clear()
            await self.refresh_members()

    async def _reconcile_loop(self, tg: asyncio.TaskGroup) -> None:
        last = 0.0
        while not self.gone.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.1, self.s.resync_s - (time.monotonic() - last))):
                    await self.dirty.wait()  # asyncio.timeout: 3.11's wait_for may swallow a cancellation
            self.dirty.clear()
            last = time.monotonic()
            await self.reconcile(tg)
            await self.probe()  # so the status written next describes the tunnel just applied
            await self.publish(force=True)

    async def _probe_loop(self) -> None:
        await self.ready.wait()
        while not self.gone.is_set():
            await self.probe()
            await self.publish()
            await asyncio.sleep(self.s.probe_interval_s)

    async def run(self) -> None:
        """Run until the Gateway is deleted (then tear down and return) or cancelled (the data plane
        stays up: a restarted agent adopts it)."""
        # the key Secret is read (GET by name) on every reconcile, not watched: the gateway's RBAC
        # names that one Secret, and list/watch cannot be narrowed to a name
        watched: list[tuple[str, str]] = [
            ("gateways", self.s.name),
            ("remotenetworks", self.s.name),
            ("networkconfigs", NETWORK_CONFIG),
        ]
        self.dirty.set()
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._watch(p, n)) for p, n in watched]
            tasks.append(tg.create_task(self._reconcile_loop(tg)))
            tasks.append(tg.create_task(self._probe_loop()))
            tasks.append(tg.create_task(self._members_loop()))
            await self.gone.wait()
            for t in tasks:
                t.cancel()
            if self._members_task is not None:
                self._members_task.cancel()
        await asyncio.shield(self.teardown())


async def _resolve(endpoint: tuple[str, int]) -> tuple[str, int]:
    """A host name in the endpoint becomes an IPv4 address (WireGuard takes addresses only); it is
    resolved again on every pass, so a moved LoadBalancer name is followed."""
    host, port = endpoint
    try:
        return str(IPv4Address(host)), port
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM)
    except OSError as e:
        raise DataplaneError(f"cannot resolve the gateway endpoint {host!r}: {e}") from e
    return str(infos[0][4][0]), port


def _names(remote_id: str) -> tuple[str, str, int]:
    return interface_name(remote_id), table_name(remote_id), mark_for(remote_id)
