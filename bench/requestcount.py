"""Requests per pod, per side, per actor and per verb, counted from the API servers' audit logs.

Owns: a window on the consumer's and the provider's audit logs (`Window.open` / `Window.close`) and the
pure count of what each API server received in it, per actor (gpufed's identities, kwok, the bench's
own client, the control plane), per verb and resource, divided by the pods of the burst; and the
one-line summary a report prints ("gpufed: consumer 1.0 create pods/status …").

Counted: every request received in the window (a watch once, when it starts), whatever its answer;
writes (what etcd stores) and the rest apart. The actor of a request is its user:
`gpufed:*` is gpufed (the consumer's controller and virtual kubelet, the provider's controller and the
consumer's identity there), a user naming kwok is kwok, other `system:*` users are the control plane
(kube-scheduler, kube-controller-manager, the API server itself), anyone else is the bench's client.

gpufed's requests are also split in two: *pod* requests, on a pod or on what belongs to it (the pod
and its status, its token and token Secret, the ConfigMaps and Secrets it references, its Events:
`POD_RESOURCES`), counted per pod; and *background* requests (node status, leases, health probes,
quota and slice status), which follow time, not pods, counted per second of the window.

Does not: parse audit lines (`bench.audit`), run bursts, or judge targets.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.audit import AuditEvent, AuditMark, count_window, mark, parse_lines, read_since

GPUFED = "gpufed"
KWOK = "kwok"
CONTROL_PLANE = "control-plane"
CLIENT = "client"
ACTORS = (GPUFED, KWOK, CONTROL_PLANE, CLIENT)
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: Creates the API server answers without storing anything (a token signed, a review decided).
NOT_STORED = frozenset(
    {
        "serviceaccounts/token",
        "tokenreviews.authentication.k8s.io",
        "subjectaccessreviews.authorization.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "localsubjectaccessreviews.authorization.k8s.io",
    }
)


#: Resources whose requests a pod causes (see the module docstring); the rest is background.
POD_RESOURCES = frozenset(
    {
        "pods",
        "pods/status",
        "pods/binding",
        "pods/eviction",
        "serviceaccounts/token",
        "secrets",
        "configmaps",
        "events",
        "events.events.k8s.io",
    }
)


def stored(verb_resource: str) -> bool:
    """Whether a request ("create pods") writes to etcd."""
    verb, _, resource = verb_resource.partition(" ")
    return verb in WRITES and resource not in NOT_STORED


def actor(user: str) -> str:
    if user.startswith("gpufed:"):
        return GPUFED
    if "kwok" in user:
        return KWOK
    if user.startswith("system:"):
        return CONTROL_PLANE
    return CLIENT


def per_pod(requests: Iterable[AuditEvent], pods: int, seconds: float | None = None) -> dict[str, Any]:
    """What the requests cost per pod: per actor, `writes` (what etcd stores) and `reads` (everything
    else: gets, lists, watches, token requests, reviews) per pod, and `by_verb` ("create pods": n per
    pod), largest first; with the window's `seconds`, `pod` (requests on `POD_RESOURCES` per pod) and
    `background_per_s` (the others per second)."""
    by: dict[str, Counter[str]] = {a: Counter() for a in ACTORS}
    for e in requests:
        by[actor(e.user)][f"{e.verb} {e.resource}"] += 1
    n = max(pods, 1)
    out: dict[str, Any] = {}
    for a, counts in by.items():
        writes = sum(c for k, c in counts.items() if stored(k))
        out[a] = {
            "writes": round(writes / n, 2),
            "reads": round((sum(counts.values()) - writes) / n, 2),
            "by_verb": {k: round(c / n, 2) for k, c in counts.most_common() if c / n >= 0.01},
        }
        if seconds:
            pod = sum(c for k, c in counts.items() if k.partition(" ")[2] in POD_RESOURCES)
            out[a]["pod"] = round(pod / n, 2)
            out[a]["background_per_s"] = round((sum(counts.values()) - pod) / seconds, 2)
    return out


@dataclass
class Window:
    """A window opened on several audit logs (side name -> file)."""

    marks: dict[str, AuditMark]
    t0: float

    @classmethod
    def open(cls, logs: Mapping[str, Path]) -> Window:
        return cls({side: mark(path) for side, path in logs.items()}, time.time())

    def close(self, pods: int) -> dict[str, Any]:
        """Per side, what was received since `open`, per pod (see `per_pod`)."""
        t1 = time.time()
        return {
            side: per_pod(count_window(parse_lines(read_since(m)), self.t0, t1).requests, pods, t1 - self.t0)
            for side, m in self.marks.items()
        }


def summary(counts: Mapping[str, Any], who: str = GPUFED) -> str:
    """`who`'s requests per pod on each side, e.g. "consumer: 1 write (patch pods/status 1), 0.1 read"."""
    parts = []
    for side, actors in counts.items():
        a = actors.get(who) or {}
        writes = ", ".join(f"{k} {v:g}" for k, v in (a.get("by_verb") or {}).items() if k.split(" ", 1)[0] in WRITES)
        parts.append(f"{side}: {a.get('writes', 0):g} writes ({writes or 'none'}), {a.get('reads', 0):g} reads")
    return "; ".join(parts)
