"""The IP-translation Protocol the remote provider declares (DESIGN.md §3, §7).

Owns: `IPTranslator` — how a provider's pod IP is shown locally and back. The virtual kubelet uses
the fabric's `netfabric.controllers.translator.LiveRemapper` (a `netfabric.remap.Remapper` kept
current); `Identity` is for tests and peerings whose addresses need no translation.
"""

from __future__ import annotations

from typing import Protocol


class IPTranslator(Protocol):
    def to_local_ip(self, ip: str) -> str: ...

    def to_remote_ip(self, ip: str) -> str: ...


class Identity:
    """No remapping: addresses are the same on both sides."""

    def to_local_ip(self, ip: str) -> str:
        return ip

    def to_remote_ip(self, ip: str) -> str:
        return ip
