"""The addresses a provider reports for twins, as the local pods' status sees them.

Owns: each address a twin reports goes through the IP translator and, with `pod_addresses`, must lie
in the provider's pod range as seen here; a refused one is left out of the local pod's status (no
podIP rather than another's address) and reported once per pod and address as a Warning Event
`PodIPRefused` through the bounded `EventRelay`.

Construction takes the collaborators: the IP translator, `pod_addresses` (None: addresses are only
translated) and the relay.

Does not: say which addresses belong to the provider (`pod_addresses` does, `remote.translate`
declares it) or build the rest of the local status (`forge.pods.local_status`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from vkprovider.forge import pods as forge
from vkprovider.remote.events_relay import EventRelay
from vkprovider.remote.translate import IPTranslator, PodAddresses

#: Reason of the Warning Event that reports an address refused as a pod's IP.
POD_IP_REFUSED = "PodIPRefused"
#: Pod addresses remembered as reported (beyond: forgotten; a repeated report is harmless).
MAX_REPORTED = 10_000


class TwinAddresses:
    """Translate and check the addresses of one provider's twins (see the module docstring)."""

    def __init__(
        self,
        provider: str,
        host_ip: str,
        translator: IPTranslator,
        pod_addresses: PodAddresses | None,
        events: EventRelay,
    ) -> None:
        self.provider = provider
        self.host_ip = host_ip
        self.translator = translator
        #: Whether a twin's reported address may become the local pod's (None: any translated one).
        self.pod_addresses = pod_addresses
        self.events = events
        #: (local pod UID, address) refused as its podIP and already reported.
        self._reported: set[tuple[str, str]] = set()
        self._log = structlog.get_logger().bind(remote_cluster=provider)

    def local_status(self, pod: Mapping[str, Any], twin: Mapping[str, Any]) -> dict[str, Any]:
        """The local `pod`'s status from its `twin`'s, with the twin's addresses translated or left out."""

        def to_local_ip(remote_ip: str) -> str | None:
            why = self.pod_addresses.refuse_pod_ip(remote_ip) if self.pod_addresses is not None else None
            if why is None:
                return self.translator.to_local_ip(remote_ip)
            self._report(pod, remote_ip, why)
            return None

        return forge.local_status(twin, pod, host_ip=self.host_ip, to_local_ip=to_local_ip)

    def _report(self, pod: Mapping[str, Any], remote_ip: str, why: str) -> None:
        uid = str(pod["metadata"].get("uid") or "")
        if (uid, remote_ip) in self._reported:
            return
        if len(self._reported) >= MAX_REPORTED:  # bounded: a repeat of an old report is harmless
            self._reported.clear()
        self._reported.add((uid, remote_ip))
        message = (
            f"provider {self.provider} reported address {remote_ip} for this pod's twin: {why}; it is not this pod's IP"
        )
        self._log.warning("twin address refused", namespace=pod["metadata"].get("namespace"), address=remote_ip)
        self.events.offer(pod, type_="Warning", reason=POD_IP_REFUSED, message=message)
