"""The values a `gpufed doctor` run yields: a `Check` per thing checked, the `Report` of them all.

Owns: the statuses (OK / WARN / FAIL and their order), `Check` (a verdict with its finding and
fix), `Peer` (a peering and the role the peer plays for this cluster) and `Report` with its JSON
shape (`Report.to_dict`, what `gpufed doctor -o json` prints).

Pure: values only; deciding a verdict is `verdicts`, reading the cluster `probes`, running the
checks `report`, and showing them the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
#: How bad each status is: a report is as bad as its worst check.
RANK: dict[Status, int] = {OK: 0, WARN: 1, FAIL: 2}
#: Name of a check that concerns this cluster rather than one peer.
THIS_CLUSTER = ""


@dataclass(frozen=True)
class Check:
    """One verdict: what was found and, unless OK, how to fix it."""

    #: What was checked, e.g. `credentials`.
    name: str
    status: Status
    #: One line: what was found.
    finding: str
    #: Unless OK: a command to run or what to change.
    fix: str = ""
    #: The peer's ClusterID the check is about; "" for this cluster.
    peer: str = THIS_CLUSTER


@dataclass(frozen=True)
class Peer:
    """A peering that was checked."""

    cluster_id: str
    #: What the peer is to this cluster: `provider`, `consumer` or `provider+consumer`.
    role: str


@dataclass(frozen=True)
class Report:
    """Every check of one cluster, in the order they are shown: this cluster's first, then each peer's."""

    cluster_id: str
    api_server: str
    peers: tuple[Peer, ...]
    checks: tuple[Check, ...]

    @property
    def status(self) -> Status:
        return max((c.status for c in self.checks), key=RANK.__getitem__, default=OK)

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, Any]:
        """The report as `gpufed doctor -o json` prints it."""
        return {
            "clusterId": self.cluster_id,
            "apiServer": self.api_server,
            "status": self.status,
            "peers": [{"clusterId": p.cluster_id, "role": p.role} for p in self.peers],
            "checks": [
                {"peer": c.peer, "name": c.name, "status": c.status, "finding": c.finding, "fix": c.fix}
                for c in self.checks
            ],
        }
