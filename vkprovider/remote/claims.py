"""The provider's TwinNamespaces as CLAIMS: which twin namespaces the remote provider follows.

Owns, for one (consumer, provider): the provider's TwinNamespaces of this consumer as last seen (one
per local namespace), and the decision whether each is followed. A namespace counts as offloaded here
only while the consumer's own NamespaceOffloading says it is offloaded to this provider
(`remote.offloaded`) and the twin's name is a valid namespace name; nothing is decided before the
consumer's record has been listed. A claim the consumer did not make is let go (`forget`) and, when
it persists for `claim_grace_s`, reported once as a Warning Event `TwinNamespaceRefused` on that
namespace's NamespaceOffloading (or, without one, on the provider's ForeignCluster).

Construction takes the collaborators: the consumer's record (`OffloadedNamespaces`), the bounded
`EventRelay`, how to report on the ForeignCluster, what to do with a Ready claim that is followed
(`follow`: True when it is newly followed) or one that is not (`forget`), and the running task group
(None: not running; reports wait for it).

Does not: watch TwinNamespaces (the RemoteProvider does, and hands each event to
`on_twin_namespace`), or start or stop anything for a followed namespace (`follow` and `forget` do).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from vkprovider.forge.meta import is_dns_label
from vkprovider.remote.events_relay import EventRelay
from vkprovider.remote.offloaded import OffloadedNamespaces

#: Reason of the Warning Event that reports a claim the consumer did not make.
CLAIM_REFUSED = "TwinNamespaceRefused"
#: Seconds a provider's claim on a namespace may stay unconfirmed by the consumer before it is
#: reported (the offloading controller writes its status just after it asked for the twin).
DEFAULT_CLAIM_GRACE_S = 10.0
#: Claims waiting for their grace at once, and claims remembered as reported (beyond: forgotten; a
#: repeated report of an old claim is harmless, a provider writing claims by the million is not).
MAX_PENDING_CLAIMS = 1_000
MAX_REPORTED = 10_000


class TwinNamespaceClaims:
    """The provider's claims on this consumer's namespaces (see the module docstring)."""

    def __init__(
        self,
        offloaded: OffloadedNamespaces,
        provider: str,
        claim_grace_s: float,
        events: EventRelay,
        on_foreign_cluster: Callable[[str, str, str], None],
        follow: Callable[[str, str, Mapping[str, Any]], bool],
        forget: Callable[[str], None],
        task_group: Callable[[], asyncio.TaskGroup | None],
    ) -> None:
        self.offloaded = offloaded
        self.provider = provider
        self.claim_grace_s = claim_grace_s
        self.events = events
        self._on_foreign_cluster = on_foreign_cluster
        self._follow = follow
        self._forget = forget
        self._task_group = task_group
        #: local namespace -> the provider's TwinNamespace for it, as last seen (a claim).
        self.claims: dict[str, dict[str, Any]] = {}
        #: Claims already reported (local namespace, twin, why), and those waiting for their grace.
        self.reported: set[tuple[str, str, str]] = set()
        self.pending: set[tuple[str, str, str]] = set()
        self._log = structlog.get_logger().bind(remote_cluster=provider)

    def on_twin_namespace(self, kind: str, obj: dict[str, Any]) -> None:
        local = str((obj.get("spec") or {}).get("namespace") or "")
        if kind == "DELETED":
            self.claims.pop(local, None)
        else:
            self.claims[local] = obj
        self.evaluate(local)

    def on_offloading(self, namespace: str) -> None:
        """The consumer's decision about `namespace` changed ("": first listed: all of them)."""
        for local in [namespace] if namespace else list(self.claims):
            self.evaluate(local)

    def refusal(self, local: str, twin: str) -> str:
        """Why the provider's claim of `local` (twin `twin`) is not followed; "" when it is."""
        if not self.offloaded.allows(local):
            return f"namespace {local} is not offloaded to {self.provider}"
        if twin and not is_dns_label(twin):
            return f"{twin!r} is no valid namespace name"
        return ""

    def evaluate(self, local: str) -> None:
        """Follow the provider's TwinNamespace for `local` where the consumer confirms it."""
        if not self.offloaded.synced.is_set():
            return  # claims wait until the consumer's own record has been listed
        obj = self.claims.get(local)
        st = (obj or {}).get("status") or {}
        twin = str(st.get("twin") or "")
        ready = obj is not None and not obj["metadata"].get("deletionTimestamp") and st.get("phase") == "Ready"
        if not ready:
            self._forget(local)
            return
        why = self.refusal(local, twin)
        if why:
            self._forget(local)
            self._refuse(local, twin, why)
            return
        if self._follow(local, twin, obj or {}):
            self.reported = {c for c in self.reported if c[0] != local}

    def _refuse(self, local: str, twin: str, why: str) -> None:
        """Report once, after the grace, a claim that is still refused then."""
        key = (local, twin, why)
        tg = self._task_group()
        if key in self.reported or key in self.pending or tg is None:
            return
        if len(self.pending) >= MAX_PENDING_CLAIMS:
            return  # still refused; only its report is skipped
        self.pending.add(key)

        async def later() -> None:
            try:
                await asyncio.sleep(self.claim_grace_s)
                obj = self.claims.get(local)
                st = (obj or {}).get("status") or {}
                if obj is None or str(st.get("twin") or "") != twin or self.refusal(local, twin) != why:
                    return
                if len(self.reported) >= MAX_REPORTED:
                    self.reported.clear()
                self.reported.add(key)
                message = (
                    f"provider {self.provider} claims twin namespace {twin!r} for {local}, which this "
                    f"cluster did not give it ({why}): nothing of {local} is reflected, copied or run there"
                )
                self._log.warning("twin namespace claim refused", namespace=local, twin=twin, why=why)
                offloading = self.offloaded.offloading(local)
                if offloading is None:
                    self._on_foreign_cluster("Warning", CLAIM_REFUSED, message)
                    return
                self.events.offer(offloading, type_="Warning", reason=CLAIM_REFUSED, message=message)
            finally:
                self.pending.discard(key)

        tg.create_task(later())
