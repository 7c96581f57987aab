"""Leader election on a `coordination.k8s.io/v1` Lease, for components that run as HA replicas.

Owns: one Lease (`namespace/name`) and the rules client-go's leaderelection package follows, so that
a gpufed controller and a Go controller would agree on who leads:
- a candidate takes the Lease when it is free (no holder) or expired (`renewTime` +
  `leaseDurationSeconds` in the past, measured on this process's clock from the moment it last saw
  the Lease change — never comparing clocks across machines), or when it already holds it;
- writes are optimistic (PUT with the read `resourceVersion`), so of two candidates racing for an
  expired Lease exactly one wins; `leaseTransitions` counts changes of holder;
- the leader renews every `retry_period_s`; when it has not renewed for `renew_deadline_s` it has
  lost leadership and `hold` raises `LostLeadershipError` (the process then exits and restarts as a
  candidate: state built while leading is never trusted after a gap);
- `release` on a clean stop empties the holder so a standby takes over at once instead of after
  `lease_duration_s`.

Does not: decide what runs while leading (the caller's TaskGroup does), or create the namespace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import rfc3339

#: client-go's defaults for controllers (kube-controller-manager uses 15 s / 10 s / 2 s).
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


class LostLeadershipError(GpufedError):
    """This process led and could not renew its Lease in time: another replica may lead now."""


@dataclass(frozen=True)
class LeaderSettings:
    #: Namespace and name of the Lease.
    namespace: str
    name: str
    #: This candidate's identity (e.g. the pod name); unique among the replicas.
    identity: str
    #: Seconds a Lease stays valid after its last renewal (other candidates wait this long).
    lease_duration_s: float = LEASE_DURATION_S
    #: Seconds the leader may go without a successful renewal before it gives up.
    renew_deadline_s: float = RENEW_DEADLINE_S
    #: Seconds between attempts to acquire or renew.
    retry_period_s: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration "
                f"(got {self.retry_period_s}, {self.renew_deadline_s}, {self.lease_duration_s})"
            )


class LeaderElector:
    def __init__(self, api: Any, settings: LeaderSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self._url = rest.path("coordination.k8s.io/v1", "leases", settings.name, namespace=settings.namespace)
        #: (holder, renewTime string, resourceVersion) last seen, and when (local clock) it was seen.
        self._observed: tuple[str, str, str] | None = None
        self._observed_at = 0.0
        self._last_renewed: float | None = None
        self.is_leader = False
        self._log = structlog.get_logger().bind(
            component="leader-election", lease=f"{settings.namespace}/{settings.name}"
        )

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        announced = False
        while True:
            try:
                if await self.try_acquire_or_renew():
                    self._log.info("became leader", identity=self.settings.identity)
                    return
                if not announced and self._observed is not None:
                    self._log.info("waiting for leadership", leader=self._observed[0] or "none")
                    announced = True
            except KubeError as e:
                self._log.warning("leader election failed; retrying", error=str(e))
            await asyncio.sleep(self.settings.retry_period_s)

    async def hold(self) -> None:
        """Renew the Lease until cancelled; `LostLeadershipError` when it could not for `renew_deadline_s`."""
        while True:
            await asyncio.sleep(self.settings.retry_period_s)
            try:
                if await self.try_acquire_or_renew():
                    continue
                self.is_leader = False
                leader = self._observed[0] if self._observed else "?"
                raise LostLeadershipError(f"Lease {self.settings.namespace}/{self.settings.name} is held by {leader}")
            except KubeError as e:
                self._log.warning("lease not renewed", error=str(e))
            if self._last_renewed is None or self.clock() - self._last_renewed >= self.settings.renew_deadline_s:
                self.is_leader = False
                raise LostLeadershipError(
                    f"Lease {self.settings.namespace}/{self.settings.name} not renewed for "
                    f"{self.settings.renew_deadline_s:g} s: stepping down"
                )

    async def release(self) -> None:
        """Hand the Lease back (empty holder) if this candidate holds it; errors are logged only."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await rest.get(self.api, self._url)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.settings.identity:
                return
            lease["spec"] = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
            await rest.request(self.api, "PUT", self._url, body=lease, what="release leader lease")
            self._log.info("leadership released")
        except KubeError as e:
            self._log.warning("leadership not released; others take over when the lease expires", error=str(e))

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards.

        A write conflict (another writer between our read and our write) is answered by reading
        again, a few times: the lease we saw is stale, so it says nothing about who holds it now."""
        for _ in range(3):
            won = await self._attempt()
            if won is not None:
                return won
        return False

    async def _attempt(self) -> bool | None:
        """Read and, when free or ours, write the Lease; None on a write conflict."""
        s = self.settings
        now = self.clock()
        wall = time.time()
        lease = await rest.get(self.api, self._url)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": self._spec(wall, acquired=True, transitions=0),
            }
            try:
                created = await rest.create(
                    self.api, rest.path("coordination.k8s.io/v1", "leases", namespace=s.namespace), body
                )
            except KubeError as e:
                if e.status == 409:  # another candidate created it first
                    return None
                raise
            return self._won(created, now)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        seen = (holder, str(spec.get("renewTime") or ""), str(lease["metadata"].get("resourceVersion", "")))
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration_s)
        mine = holder == s.identity
        if holder and not mine and now - self._observed_at < duration:
            self.is_leader = False
            return False  # held by another candidate and not expired on our clock
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = {
            **spec,
            **self._spec(wall, acquired=not mine, transitions=transitions),
        }
        if mine:
            lease["spec"]["acquireTime"] = spec.get("acquireTime") or rfc3339(wall, micro=True)
        try:
            updated = await rest.request(self.api, "PUT", self._url, body=lease, what="renew leader lease")
        except KubeError as e:
            if e.status == 409:  # someone else wrote it since we read it
                return None
            raise
        return self._won(updated, now)

    def _spec(self, wall: float, *, acquired: bool, transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.settings.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration_s)),
            "renewTime": rfc3339(wall, micro=True),
            "leaseTransitions": transitions,
        }
        if acquired:
            spec["acquireTime"] = rfc3339(wall, micro=True)
        return spec

    def _won(self, lease: dict[str, Any], now: float) -> bool:
        spec = lease.get("spec") or {}
        self._observed = (
            str(spec.get("holderIdentity") or ""),
            str(spec.get("renewTime") or ""),
            str(lease.get("metadata", {}).get("resourceVersion", "")),
        )
        self._observed_at = now
        self._last_renewed = now
        self.is_leader = True
        return True
