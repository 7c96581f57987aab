"""The fault drills' shared checker: no pod lost, duplicated or resurrected; recovery time recorded.

Owns:
- `Ledger`: snapshots of the consumer pods of some namespaces (by UID) and of their twins on every
  provider (pods labelled `gpufed.io/origin-cluster-id=<consumer>`, in the namespaces' twin
  namespaces, matched by `gpufed.io/origin-uid`). Every `observe()` also remembers what it saw, so
  a terminal pod seen back in a live phase at any observation is caught, not only at the end.
  `problems()` lists every violation of the drills' invariants against all pods ever observed:
  - lost: a pod once seen is gone, being deleted, or (restartPolicy Always) became terminal —
    unless the test `release()`d it (it deleted or scaled it away itself). A pod with
    restartPolicy Never/OnFailure that became Succeeded/Failed legitimately completed;
  - duplicated: a live pod bound to a virtual node has no twin or more than one (all providers);
  - orphaned: a twin whose consumer pod is gone, or not bound to a virtual node;
  - resurrected: a terminal pod back in Pending/Running, its phase changed, or a twin of it live.
- `Ledger.settle()`: polls until there are no problems (and an optional extra condition holds);
  the timeout is only an upper bound, and on expiry the remaining problems are the assertion.
- `record()`: prints `DRILL <name> recovery_s=<x>` (greppable) and appends a JSON line to
  $GPUFED_DRILL_RESULTS when set (docs/reliability.md is written from such a file).

Does not: inject faults or start anything (the drill modules do).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE, ClusterID
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import cluster_id

TERMINAL = frozenset({"Succeeded", "Failed"})
RESULTS_ENV = "GPUFED_DRILL_RESULTS"


@dataclass(frozen=True)
class PodRecord:
    """One consumer pod as seen at one observation."""

    uid: str
    namespace: str
    name: str
    phase: str
    node: str
    deleting: bool
    restart_policy: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid[:8]})"

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL


@dataclass(frozen=True)
class TwinRecord:
    """One twin at a provider as seen at one observation."""

    provider: str
    namespace: str
    name: str
    origin_uid: str
    phase: str
    deleting: bool

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Snapshot:
    pods: dict[str, PodRecord]
    twins: list[TwinRecord]
    virtual_nodes: frozenset[str]
    at: float


@dataclass
class Ledger:
    """What happened to the pods of `namespaces` (consumer) and their twins (`providers`) across a drill."""

    clusters: Clusters
    namespaces: tuple[str, ...]
    providers: tuple[str, ...] = ("gpu-a", "gpu-b")
    consumer: str = "consumer"
    #: uid -> the first record of every pod ever observed.
    first: dict[str, PodRecord] = field(default_factory=dict)
    #: uid -> the terminal phase a pod was first seen in.
    terminal: dict[str, str] = field(default_factory=dict)
    #: uids the test removed on purpose (not lost when gone).
    released: set[str] = field(default_factory=set)
    #: violations seen in passing (resurrections), kept for every later `problems()`.
    seen_problems: list[str] = field(default_factory=list)
    last: Snapshot | None = None
    _consumer_id: ClusterID | None = None

    @property
    def consumer_id(self) -> ClusterID:
        if self._consumer_id is None:
            self._consumer_id = cluster_id(self.clusters, self.consumer)
        return self._consumer_id

    def twin_namespaces(self) -> set[str]:
        return {f"{ns}-{self.consumer_id}" for ns in self.namespaces}

    # ---- observing

    def snapshot(self, providers: tuple[str, ...] | None = None) -> Snapshot:
        """Consumer first, then the providers (all, or only `providers`, e.g. while one is down): a twin
        is never older than the pod it is compared with."""
        at = time.monotonic()
        pods: dict[str, PodRecord] = {}
        for ns in self.namespaces:
            for p in self.clusters.kubectl_json(self.consumer, "get", "pods", "-n", ns)["items"]:
                meta, spec, status = p["metadata"], p.get("spec") or {}, p.get("status") or {}
                pods[meta["uid"]] = PodRecord(
                    uid=meta["uid"],
                    namespace=meta["namespace"],
                    name=meta["name"],
                    phase=status.get("phase", ""),
                    node=spec.get("nodeName") or "",
                    deleting=bool(meta.get("deletionTimestamp")),
                    restart_policy=spec.get("restartPolicy", "Always"),
                )
        nodes = self.clusters.kubectl_json(self.consumer, "get", "nodes", "-l", f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}")
        virtual = frozenset(n["metadata"]["name"] for n in nodes["items"])
        wanted = self.twin_namespaces()
        twins: list[TwinRecord] = []
        for provider in self.providers if providers is None else providers:
            items = self.clusters.kubectl_json(
                provider, "get", "pods", "-A", "-l", f"{ORIGIN_CLUSTER_LABEL}={self.consumer_id}"
            )["items"]
            for t in items:
                meta = t["metadata"]
                if meta["namespace"] not in wanted:
                    continue
                twins.append(
                    TwinRecord(
                        provider=provider,
                        namespace=meta["namespace"],
                        name=meta["name"],
                        origin_uid=(meta.get("labels") or {}).get(ORIGIN_UID_LABEL, ""),
                        phase=(t.get("status") or {}).get("phase", ""),
                        deleting=bool(meta.get("deletionTimestamp")),
                    )
                )
        return Snapshot(pods=pods, twins=twins, virtual_nodes=virtual, at=at)

    def observe(self, providers: tuple[str, ...] | None = None) -> Snapshot:
        """Take a snapshot and remember every pod and every terminal phase in it."""
        snap = self.snapshot(providers)
        for uid, pod in snap.pods.items():
            self.first.setdefault(uid, pod)
            was = self.terminal.get(uid)
            if was is not None and pod.phase != was:
                self._note(f"resurrected: {pod.key} was {was}, now {pod.phase}")
            elif was is None and pod.terminal:
                self.terminal[uid] = pod.phase
        self.last = snap
        return snap

    def _note(self, problem: str) -> None:
        if problem not in self.seen_problems:
            self.seen_problems.append(problem)

    def release(self, uids: Iterable[str]) -> None:
        """The test deleted these pods itself (or scaled them away): their absence is no loss."""
        self.released.update(uids)

    def uids(self, namespace: str, predicate: Callable[[PodRecord], bool] = lambda _p: True) -> set[str]:
        """UIDs of the pods of `namespace` in the last observation that satisfy `predicate`."""
        snap = self.last or self.observe()
        return {u for u, p in snap.pods.items() if p.namespace == namespace and predicate(p)}

    # ---- judging

    def problems(self, snap: Snapshot | None = None) -> list[str]:
        snap = snap or self.last or self.observe()
        found = list(self.seen_problems)
        by_origin: dict[str, list[TwinRecord]] = {}
        for t in snap.twins:
            by_origin.setdefault(t.origin_uid, []).append(t)
        for uid, first in self.first.items():
            if uid in self.released:
                continue
            pod = snap.pods.get(uid)
            if pod is None:
                found.append(f"lost: {first.key} is gone (was {first.phase or 'new'} on {first.node or 'no node'})")
                continue
            if pod.deleting:
                found.append(f"lost: {pod.key} is being deleted")
                continue
            if pod.terminal and pod.restart_policy == "Always":
                found.append(f"lost: {pod.key} (restartPolicy Always) is {pod.phase}")
        for uid, pod in snap.pods.items():
            twins = by_origin.pop(uid, [])
            names = ", ".join(f"{t.key}={t.phase}{' (deleting)' if t.deleting else ''}" for t in twins)
            if pod.terminal:
                live = [t for t in twins if t.phase not in TERMINAL and not t.deleting]
                if len(twins) > 1 or live:
                    found.append(f"resurrected: {pod.key} is {pod.phase} but has twins {names}")
            elif pod.deleting:
                continue  # in flight: its twin is being stopped
            elif pod.node in snap.virtual_nodes:
                if len(twins) != 1:
                    what = "duplicated" if twins else "missing twin"
                    found.append(f"{what}: {pod.key} on {pod.node} has {len(twins)} twins [{names}]")
            elif twins:
                found.append(f"orphaned: {pod.key} is on {pod.node or 'no node'} but has twins {names}")
        for uid, twins in by_origin.items():
            for t in twins:
                if not t.deleting:
                    found.append(f"orphaned: twin {t.key} ({t.phase}) of pod {uid[:8]} that does not exist")
        return found

    def settle(
        self,
        what: str,
        *,
        timeout: float,
        until: Callable[[Snapshot], bool] = lambda _s: True,
        interval: float = 1.0,
    ) -> Snapshot:
        """Observe until there are no problems and `until` holds; fail with the last problems."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.observe()
            problems = self.problems(snap)
            done = until(snap)
            if (not problems and done) or self.seen_problems:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(interval)
        if problems or not done:
            shown = "\n  ".join(problems[:40]) + (f"\n  ... {len(problems) - 40} more" if len(problems) > 40 else "")
            raise AssertionError(
                f"{what}: not converged after {timeout:.0f}s"
                + ("" if done else " (condition not met)")
                + (f"; {len(problems)} problems:\n  {shown}" if problems else "")
            )
        return snap


def running(
    namespace: str, count: int, *, selector: Callable[[PodRecord], bool] = lambda _p: True
) -> Callable[[Snapshot], bool]:
    """`until` condition: exactly `count` live pods of `namespace` (matching `selector`) are Running."""

    def check(snap: Snapshot) -> bool:
        pods = [p for p in snap.pods.values() if p.namespace == namespace and not p.deleting and selector(p)]
        return len(pods) == count and all(p.phase == "Running" for p in pods)

    return check


def record(name: str, recovery_s: float, **extra: Any) -> None:
    """Print the drill's recovery time in a fixed greppable form; append it to $GPUFED_DRILL_RESULTS."""
    fields = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"\nDRILL {name} recovery_s={recovery_s:.2f}" + (f" {fields}" if fields else ""), flush=True)
    path = os.environ.get(RESULTS_ENV)
    if path:
        line = json.dumps({"drill": name, "recovery_s": round(recovery_s, 2), **extra, "at": time.time()})
        with Path(path).open("a") as f:
            f.write(line + "\n")
