"""What `gpufed doctor` is asked to check and the thresholds its verdicts use.

Owns: `DoctorSettings` (the cluster of `--kubeconfig`/`--context`, the one peer to check, each
check's timeout and the thresholds of the certificate, handshake, API and MTU verdicts) and their
defaults, and the flags that the commands a fix names repeat.

Does not: read anything; the CLI validates the flags before it builds the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufed import defaults
from netfabric.controllers.gateway import HANDSHAKE_STALE_S

#: Seconds one check may take (each check has its own budget).
DEFAULT_CHECK_TIMEOUT_S = defaults.DOCTOR_CHECK_TIMEOUT_S
#: A client certificate with less than this fraction of its lifetime left is a WARN (it renews at
#: two thirds of its lifetime, so a third left means the renewal is late).
DEFAULT_EXPIRY_WARNING = 1 / 3
#: A tunnel whose last WireGuard handshake is older than this is a FAIL (WireGuard's REJECT_AFTER_TIME).
DEFAULT_HANDSHAKE_STALE_S = HANDSHAKE_STALE_S
#: A provider API round trip slower than this (ms) is a WARN.
DEFAULT_SLOW_API_MS = defaults.DOCTOR_SLOW_API_MS
#: Underlay MTU assumed when judging a tunnel's MTU (standard Ethernet; jumbo-frame networks say so).
DEFAULT_UNDERLAY_MTU = defaults.DOCTOR_UNDERLAY_MTU


@dataclass(frozen=True)
class DoctorSettings:
    """One `gpufed doctor` run: the cluster to check, the peers to check and the verdicts' thresholds."""

    #: kubeconfig of the cluster to check (usually the consumer).
    kubeconfig: Path
    #: Context in it (None: current context).
    context: str | None = None
    #: Check only this peer (None: every ForeignCluster).
    remote_cluster_id: str | None = None
    #: Seconds each check may take.
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    #: Client certificates with less than this fraction of their lifetime left are a WARN (default 1/3).
    expiry_warning: float = DEFAULT_EXPIRY_WARNING
    #: Seconds after which a tunnel's last handshake is stale (default 180).
    handshake_stale_s: float = DEFAULT_HANDSHAKE_STALE_S
    #: Provider API round trips slower than this many ms are a WARN (default 1000).
    slow_api_ms: float = DEFAULT_SLOW_API_MS
    #: Underlay MTU in bytes the tunnel MTU must leave WireGuard's overhead room in (default 1500).
    underlay_mtu: int = DEFAULT_UNDERLAY_MTU

    @property
    def flags(self) -> str:
        """`--kubeconfig K [--context C]`, for the commands a fix names."""
        return f"--kubeconfig {self.kubeconfig}" + (f" --context {self.context}" if self.context else "")

    @property
    def kubectl(self) -> str:
        """`kubectl` against the cluster checked, for the commands a fix names."""
        return f"kubectl {self.flags}"
