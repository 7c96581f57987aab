"""The network fabric's kinds: NetworkConfig, RemoteNetwork, Gateway and Connection.

Owns: the spec/status shapes of one NetworkConfig per cluster (its pod CIDR, external CIDR,
reserved ranges, remapping pools, gateway endpoint and exposed addresses) and, per peering, one
RemoteNetwork (the peer's address ranges and their remapping), one Gateway (the tunnel's spec) and
one Connection (its health), each with a `Ready` condition in its status (what it means is in
each `conditions` description); their validation (IPv4 networks without host bits, disjoint
ranges, remapped ranges of the real ones' size) and `split_endpoint` for `host[:port]`.

Does not: plan, remap or render the fabric (`netfabric`), or run a tunnel.

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gpufed.apis.meta import AGE_COLUMN, CLUSTER_ID_PATTERN, READY_COLUMN, Condition, Model, conditions_field
from gpufed.apis.wire import MAX_CLUSTER_ID

IPV4_CIDR_PATTERN = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$"
IPV4_PATTERN = r"^([0-9]{1,3}\.){3}[0-9]{1,3}$"
#: The one NetworkConfig of a cluster.
NETWORK_CONFIG = "local"
#: WireGuard's registered port; the provider's gateway listens on it unless configured otherwise.
DEFAULT_GATEWAY_PORT = 51820
DEFAULT_EXTERNAL_CIDR = "10.70.0.0/16"
DEFAULT_POOLS = ["10.64.0.0/10"]


def _cidr(v: str) -> str:
    try:
        net = ipaddress.IPv4Network(v, strict=True)
    except ValueError as e:
        raise ValueError(f"{v!r} is not an IPv4 network in CIDR form with no host bits: {e}") from e
    return str(net)


def _ip(v: str) -> str:
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError as e:
        raise ValueError(f"{v!r} is not an IPv4 address") from e


class ExternalIP(Model):
    address: str = Field(pattern=IPV4_PATTERN, description="A real address of this cluster that is not a pod's.")
    external_address: str = Field(
        pattern=IPV4_PATTERN, description="The address standing for it inside this cluster's external CIDR."
    )

    @field_validator("address", "external_address")
    @classmethod
    def _valid(cls, v: str) -> str:
        return _ip(v)


class NetworkConfigSpec(Model):
    pod_cidr: str = Field(pattern=IPV4_CIDR_PATTERN, description="This cluster's pod CIDR.")
    external_cidr: str = Field(
        default=DEFAULT_EXTERNAL_CIDR,
        pattern=IPV4_CIDR_PATTERN,
        description="Range standing for this cluster's non-pod addresses (Services, API server) as peers reach them.",
    )
    reserved_cidrs: list[str] = Field(
        default_factory=list,
        description="Ranges in use here that remapping must never hand out (service CIDR, node networks).",
    )
    pools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_POOLS),
        min_length=1,
        description="Ranges from which a colliding peer CIDR gets its local stand-in.",
    )
    gateway_endpoint: str = Field(
        default="",
        description="host:port where peers reach this cluster's gateway (the provider side listens there).",
    )
    external_ips: list[ExternalIP] = Field(
        default_factory=list, description="Non-pod addresses exposed to peers through the external CIDR."
    )

    @field_validator("pod_cidr", "external_cidr")
    @classmethod
    def _one(cls, v: str) -> str:
        return _cidr(v)

    @field_validator("reserved_cidrs", "pools")
    @classmethod
    def _many(cls, v: list[str]) -> list[str]:
        return [_cidr(x) for x in v]

    @field_validator("gateway_endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v:
            split_endpoint(v)
        return v

    @model_validator(mode="after")
    def _disjoint(self) -> NetworkConfigSpec:
        pod, ext = ipaddress.IPv4Network(self.pod_cidr), ipaddress.IPv4Network(self.external_cidr)
        if pod.overlaps(ext):
            raise ValueError(f"externalCidr {ext} overlaps podCidr {pod}")
        for e in self.external_ips:
            if ipaddress.IPv4Address(e.external_address) not in ext:
                raise ValueError(f"externalAddress {e.external_address} is outside externalCidr {ext}")
        return self


def split_endpoint(v: str) -> tuple[str, int]:
    """`host:port` (port defaults to 51820) -> (host, port); ValueError with the reason."""
    host, sep, port = v.rpartition(":")
    if not sep:
        host, port = v, str(DEFAULT_GATEWAY_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"gateway endpoint {v!r} must be host[:port] with a port in 1..65535")
    return host, int(port)


class NetworkConfigStatus(Model):
    conditions: list[Condition] = conditions_field(
        detail="Ready: True with reason Accepted once a gateway agent of this cluster (`gpufed gateway`, one per "
        "peering) has read this spec and found it valid (IPv4 networks without host bits, externalCidr disjoint "
        "from podCidr, every externalAddress inside externalCidr, gatewayEndpoint host[:port]); False with reason "
        "Invalid and the error otherwise. The gateway agents write it, so a cluster without a running gateway "
        "has no status yet."
    )


class NetworkConfig(Model):
    kind: ClassVar[str] = "NetworkConfig"
    plural: ClassVar[str] = "networkconfigs"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["netcfg"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Pod CIDR", "string", ".spec.podCidr"),
        ("External CIDR", "string", ".spec.externalCidr"),
        ("Gateway", "string", ".spec.gatewayEndpoint"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    root_validations: ClassVar[list[dict[str, str]]] = [
        {
            "rule": f"self.metadata.name == '{NETWORK_CONFIG}'",
            "message": f"a cluster has one NetworkConfig, named {NETWORK_CONFIG!r}",
        }
    ]
    spec: NetworkConfigSpec
    status: NetworkConfigStatus | None = None


class CIDRPair(Model):
    pod_cidr: str = Field(pattern=IPV4_CIDR_PATTERN)
    external_cidr: str = Field(pattern=IPV4_CIDR_PATTERN)

    @field_validator("pod_cidr", "external_cidr")
    @classmethod
    def _one(cls, v: str) -> str:
        return _cidr(v)


class RemoteNetworkSpec(Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer.")
    real: CIDRPair = Field(description="The peer's own ranges, as it announced them.")
    mapped: CIDRPair = Field(description="How this cluster reaches them: equal to real unless they collided here.")
    peer_view: CIDRPair | None = Field(
        default=None, description="How the peer reaches THIS cluster's ranges (its mapping, copied when connecting)."
    )

    @model_validator(mode="after")
    def _sizes(self) -> RemoteNetworkSpec:
        for what in ("pod_cidr", "external_cidr"):
            a = ipaddress.IPv4Network(getattr(self.real, what))
            b = ipaddress.IPv4Network(getattr(self.mapped, what))
            if a.prefixlen != b.prefixlen:
                raise ValueError(f"mapped {what} {b} must have the size of the real {a}")
        return self


class RemoteNetworkStatus(Model):
    conditions: list[Condition] = conditions_field(
        detail="Ready: True with reason Applied once the gateway agent of this peering has validated this spec "
        "(IPv4 networks without host bits, each mapped range the size of its real one) and applied its "
        "remapping (the prefix-NAT table, and the routes of the mapped ranges into the tunnel); False with "
        "reason Invalid and the error when the spec is invalid, ConfigurationFailed and the error when the "
        "remapping could not be applied (no NetworkConfig, no peer key yet, a data-plane failure), or "
        "GatewayRemoved once the peering's Gateway is deleted and its data plane removed."
    )


class RemoteNetwork(Model):
    kind: ClassVar[str] = "RemoteNetwork"
    plural: ClassVar[str] = "remotenetworks"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["rnet"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Cluster", "string", ".spec.clusterId"),
        ("Pod CIDR", "string", ".spec.real.podCidr"),
        ("Mapped", "string", ".spec.mapped.podCidr"),
        ("External", "string", ".spec.real.externalCidr"),
        ("Mapped External", "string", ".spec.mapped.externalCidr"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: RemoteNetworkSpec
    status: RemoteNetworkStatus | None = None


class GatewaySpec(Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer.")
    role: Literal["Server", "Client"] = Field(description="Server listens (provider side); Client dials it.")
    endpoint: str = Field(default="", description="Client: the server gateway's host:port.")
    listen_port: int = Field(default=DEFAULT_GATEWAY_PORT, ge=1, le=65535, description="Server: UDP port.")
    mtu: int = Field(default=0, ge=0, le=9000, description="Tunnel MTU; 0 = underlay MTU minus WireGuard overhead.")
    masquerade: bool = Field(
        default=False, description="SNAT traffic from the peer to the gateway's address (strict CNIs such as Cilium)."
    )
    driver: Literal["auto", "kernel", "wireguard-go"] = Field(default="auto", description="WireGuard data plane.")
    keepalive_s: int = Field(default=10, ge=0, le=3600, description="Persistent keepalive (0: off).")
    tunnel_address: str = Field(pattern=IPV4_PATTERN, description="This gateway's address inside the tunnel.")
    peer_tunnel_address: str = Field(pattern=IPV4_PATTERN, description="The peer gateway's address in the tunnel.")
    private_key_secret: str = Field(description="Secret (same namespace) holding this gateway's private key.")
    public_key: str = Field(description="This gateway's WireGuard public key (base64).")
    peer_public_key: str = Field(default="", description="The peer gateway's public key (base64); set by connect.")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v:
            split_endpoint(v)
        return v


class GatewayStatus(Model):
    driver: str = Field(default="", description="The data plane in use: kernel or wireguard-go.")
    interface: str = Field(default="", description="The WireGuard interface.")
    mtu: int = Field(default=0, description="The MTU applied.")
    conditions: list[Condition] = conditions_field(
        detail="Ready: True once the gateway agent has applied this spec (interface, NAT table, routes); False "
        "with reason ConfigurationFailed and the error otherwise. The tunnel's health is the Connection's."
    )


class Gateway(Model):
    kind: ClassVar[str] = "Gateway"
    plural: ClassVar[str] = "gateways"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["gfgw"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Cluster", "string", ".spec.clusterId"),
        ("Role", "string", ".spec.role"),
        ("Endpoint", "string", ".spec.endpoint"),
        ("Driver", "string", ".status.driver"),
        ("MTU", "integer", ".status.mtu"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: GatewaySpec
    status: GatewayStatus | None = None


class ConnectionStatus(Model):
    phase: Literal["Pending", "Connected", "Degraded", "Down"] = "Pending"
    reason: str = Field(default="", description="CamelCase reason a program can match on.")
    message: str = Field(default="", description="What a human needs to know.")
    latest_handshake: dt.datetime | None = Field(default=None, description="Last WireGuard handshake.")
    rtt_ms: float | None = Field(default=None, description="Round trip of the last probe across the tunnel.")
    last_probe: dt.datetime | None = None
    last_transition_time: dt.datetime | None = None
    conditions: list[Condition] = conditions_field(
        detail="Ready: True while the tunnel carries traffic (phase Connected or Degraded), False when it is "
        "Down or not probed yet; its reason and message are the phase's."
    )


class ConnectionSpec(Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer.")


class Connection(Model):
    kind: ClassVar[str] = "Connection"
    plural: ClassVar[str] = "connections"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["conn"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Cluster", "string", ".spec.clusterId"),
        ("Status", "string", ".status.phase"),
        ("Reason", "string", ".status.reason"),
        ("RTT ms", "number", ".status.rttMs"),
        ("Handshake", "date", ".status.latestHandshake"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: ConnectionSpec
    status: ConnectionStatus | None = None
