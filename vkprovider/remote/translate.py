"""The IP-translation Protocols the remote provider declares.

Owns: `IPTranslator` — how a provider's pod IP is shown locally and back; `PodAddresses` — whether
an address a provider reports for a twin may become the local pod's IP at all (the provider
controls its pods' status, so a twin could claim any address, e.g. one of a consumer pod behind a
Service). The virtual kubelet uses the fabric's `netfabric.controllers.translator.LiveRemapper`
for the first and `gpufed.app.virtual_kubelet`'s adapter over it for the second (they know the
peering's ranges; vkprovider does not import netfabric); `Identity` is for tests and peerings whose
addresses need no translation.
"""

from __future__ import annotations

from typing import Protocol


class IPTranslator(Protocol):
    def to_local_ip(self, ip: str) -> str: ...

    def to_remote_ip(self, ip: str) -> str: ...


class PodAddresses(Protocol):
    def refuse_pod_ip(self, remote_ip: str) -> str | None:
        """Why `remote_ip`, reported by the provider for a twin, must not become the local pod's IP
        (e.g. "not in the provider's pod range 10.244.0.0/16"); None when it may."""
        ...


class Identity:
    """No remapping: addresses are the same on both sides, and no range is known to check against."""

    def to_local_ip(self, ip: str) -> str:
        return ip

    def to_remote_ip(self, ip: str) -> str:
        return ip

    def refuse_pod_ip(self, remote_ip: str) -> str | None:
        return None
