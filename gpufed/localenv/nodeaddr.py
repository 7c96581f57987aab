"""The address the local environment's virtual nodes publish and their kubelet APIs listen on.

In a real cluster a virtual kubelet runs in a pod and its node's InternalIP is that pod's IP: the API
server reaches its kubelet API there, through `nodes/proxy` among others. The API server never
proxies to a loopback address ("address not allowed"), so a local virtual node that published
127.0.0.1 could not be reached that way. The local environment therefore gives its virtual nodes
`DEFAULT_NODE_ADDRESS`, an address of the benchmarking range 198.18.0.0/15 (RFC 2544: never routed
on the Internet), added as a /32 to this machine's loopback interface `lo`. An address on `lo` is
reachable only from this machine, as 127.0.0.1 is, so every listener still stays on this machine.
One address serves every local environment: their ports differ.

Owns: checking whether an address is local and may be proxied to (`proxyable`), adding it to `lo`
(`ensure`, which needs root: CAP_NET_ADMIN), and the address a local environment uses (`choose`).
Without root, or without `ip`, `ensure` says why, and `choose` falls back to 127.0.0.1 with a
warning: everything but the API server's proxy to the virtual kubelets works then.

Does not: remove the address (other environments may use it, and it costs nothing: `ip addr del
198.18.0.1/32 dev lo` removes it by hand), or choose the ports.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess

from gpufed import defaults

#: The address local virtual nodes publish (their InternalIP) and listen on.
DEFAULT_NODE_ADDRESS = defaults.LOCAL_NODE_ADDRESS
#: What they fall back to where the address cannot be added.
LOOPBACK = "127.0.0.1"
INTERFACE = "lo"


def proxyable(address: str) -> bool:
    """Whether the API server's proxy would dial `address` (not loopback, link-local or unspecified,
    as the API server checks)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def is_local(address: str) -> bool:
    """Whether a socket can bind `address` here (it is one of this machine's addresses)."""
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def ensure(address: str) -> str | None:
    """Make `address` one of this machine's addresses (a /32 or /128 on `lo`) unless it is already;
    None when it is, or was added, else why it could not be."""
    if is_local(address):
        return None
    if os.geteuid() != 0:
        return f"adding {address} to {INTERFACE} needs root"
    ip_cmd = shutil.which("ip")
    if ip_cmd is None:
        return f"adding {address} to {INTERFACE} needs `ip` (Debian package iproute2)"
    prefix = 32 if ipaddress.ip_address(address).version == 4 else 128
    p = subprocess.run(
        [ip_cmd, "addr", "add", f"{address}/{prefix}", "dev", INTERFACE],
        capture_output=True,
        text=True,
        check=False,
    )
    if p.returncode != 0 and not is_local(address):
        return f"`ip addr add {address}/{prefix} dev {INTERFACE}` failed: {p.stderr.strip() or p.returncode}"
    return None


def choose(wanted: str) -> tuple[str, str | None]:
    """The address the virtual nodes publish: `wanted`, made one of this machine's addresses where the
    API server may proxy to it; else 127.0.0.1 with a warning that says what that costs."""
    why = ensure(wanted) if proxyable(wanted) else None
    if why is None:
        return wanted, None
    return LOOPBACK, (
        f"warning: virtual nodes publish {LOOPBACK}, not {wanted}: {why}; the API server cannot proxy to "
        "their kubelet APIs then (`kubectl get --raw /api/v1/nodes/<node>/proxy/pods`)"
    )
