"""Reflection's reports: the Warning Events reflection records on local objects and the status
Events on NamespaceOffloadings, each said once.

Owns:
- what was already reported, per local object UID (or "ns/<namespace>" for namespace-wide reports),
  so a resync or a retrying watch does not repeat an Event; dropped with the object or namespace
  (`forget`, `forget_namespace`);
- the provider's refusals: a write the provider's API server forbids (403: an admission policy such
  as `gpufed-consumer-objects`, Pod Security, a quota, RBAC) becomes a Warning Event
  `ReflectionRefused` on the local object with the API server's message, once per generation of the
  local object and rule (`refusal_rule`, `object_version`; older ones are forgotten);
  `gpufed_reflection_refusals_total{remote_cluster,kind}` counts every one;
- collisions (a remote object of a copy's name that gpufed did not create: `ReflectionCollision`)
  and other once-per-object reports (`report_once`);
- namespace-wide reports on the NamespaceOffloading: a failing watch (`ReflectionFailed`), a
  namespace reaching the bound of objects held (`ReflectionLimit`), and any status Event
  (`status_event`), recorded through the bounded `EventRelay` it is given.

Does not: decide what is reflected, retried or held (`remote.reflection` does, and calls these
when it reconciles, watches and holds), count the objects it did not hold, or run the relay.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import NAMESPACE_OFFLOADING
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from vkprovider.forge.reflection import Kind
from vkprovider.remote.events_relay import EventRelay

#: Reasons of the Warning Events reported here.
REFUSED = "ReflectionRefused"
LIMIT = "ReflectionLimit"
#: The sides of reflection's caches: the consumer's objects, the provider's copies.
LOCAL, REMOTE = "local", "remote"
_POLICY = re.compile(r"ValidatingAdmissionPolicy '([^']+)'|admission webhook \"([^\"]+)\"")

REFUSALS = Counter(
    "gpufed_reflection_refusals_total",
    "Writes of a reflected object that the provider's API server forbade (an admission policy, Pod Security, "
    "a quota, RBAC).",
    ["remote_cluster", "kind"],
)


def refusal_rule(e: KubeError) -> str:
    """The rule a 403 of the provider names: an admission policy or webhook, Pod Security, a quota, or
    (none of those) RBAC."""
    text = str(e)
    found = _POLICY.search(text)
    if found:
        return found.group(1) or found.group(2)
    if "violates PodSecurity" in text:
        return "PodSecurity"
    if "exceeded quota" in text:
        return "ResourceQuota"
    return "RBAC"


def object_version(obj: Mapping[str, Any]) -> str:
    """The local object's generation (kinds without one, ConfigMaps and Secrets: its resourceVersion,
    which only the user's writes change there)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("generation") or meta.get("resourceVersion") or "")


class ReflectionReports:
    def __init__(self, local_api: Any, events_relay: EventRelay, provider: str, max_objects: int, log: Any) -> None:
        self.local = local_api
        #: Status Events on NamespaceOffloadings (bounded, rate-limited); its component is the source.
        self.events = events_relay
        self.provider = provider
        self.max_objects = max_objects
        self._log = log
        self._reported: dict[str, set[str]] = {}

    def forget(self, uid: object) -> None:
        """Drop what was reported on the local object `uid`."""
        self._reported.pop(str(uid), None)

    def forget_namespace(self, local_ns: str) -> None:
        self._reported.pop(f"ns/{local_ns}", None)

    def watch_failed(self, local_ns: str, message: str) -> None:
        seen = self._reported.setdefault(f"ns/{local_ns}", set())
        if message not in seen:  # a failing watch retries every few seconds
            seen.add(message)
            self.status_event(local_ns, "Warning", "ReflectionFailed", message)

    def limit(self, side: str, kind: str, local_ns: str, twin: str) -> None:
        """`local_ns` (LOCAL) or its twin namespace `twin` (REMOTE) reached the bound for `kind`:
        said once per namespace, kind and side."""
        seen = self._reported.setdefault(f"ns/{local_ns}", set())
        token = f"{LIMIT}/{side}/{kind}"
        if token in seen:
            return
        seen.add(token)
        where = f"namespace {local_ns}" if side == LOCAL else f"twin namespace {twin} on {self.provider}"
        self._log.warning("reflection limit reached", namespace=local_ns, kind=kind, side=side)
        consequence = (
            "the ones beyond are not reflected (nor held in memory)"
            if side == LOCAL
            else "labelled as this cluster's copies: reflection no longer watches them, and reads each copy "
            "when it writes it"
        )
        self.status_event(
            local_ns,
            "Warning",
            LIMIT,
            f"{where} holds more than {self.max_objects} {kind} objects {consequence}",
        )

    async def collision(self, kind: Kind, local: Mapping[str, Any], remote: Mapping[str, Any], twin: str) -> None:
        message = (
            f"{kind.kind} {twin}/{remote['metadata']['name']} on {self.provider} was not created "
            "by gpufed: it is left untouched and this object is not reflected"
        )
        await self.report_once(local, "ReflectionCollision", message, str(remote["metadata"].get("uid")))

    async def refusal(self, local: Mapping[str, Any], kind: Kind, e: KubeError) -> str:
        """A 403 of the provider: counted, and reported once per generation of `local` and rule (older
        ones are forgotten). Returns the rule."""
        REFUSALS.labels(self.provider, kind.kind).inc()
        token = f"{object_version(local)}/{refusal_rule(e)}"
        seen = self._reported.setdefault(str(local["metadata"].get("uid")), set())
        stale = {t for t in seen if t.startswith(f"{REFUSED}/") and t != f"{REFUSED}/{token}"}
        seen -= stale
        meta = local["metadata"]
        message = f"{self.provider} refused the copy of {kind.kind} {meta.get('namespace')}/{meta.get('name')}: {e}"
        await self.report_once(local, REFUSED, message, token)
        return refusal_rule(e)

    async def report_once(self, local: Mapping[str, Any], reason: str, message: str, token: str) -> None:
        seen = self._reported.setdefault(str(local["metadata"].get("uid")), set())
        if f"{reason}/{token}" in seen:
            return
        seen.add(f"{reason}/{token}")
        self._log.warning(
            "reflection refused",
            kind=local.get("kind"),
            name=local["metadata"].get("name"),
            namespace=local["metadata"].get("namespace"),
            reason=reason,
        )
        await events.emit(
            self.local, local, type_="Warning", reason=reason, message=message, component=self.events.component
        )

    def status_event(self, local_ns: str, type_: str, reason: str, message: str) -> None:
        """A status Event on `local_ns`'s NamespaceOffloading (its UID read when the relay records it)."""
        meta: dict[str, Any] = {"namespace": local_ns, "name": NAMESPACE_OFFLOADING}
        obj = {"apiVersion": API_VERSION, "kind": "NamespaceOffloading", "metadata": meta}

        async def resolve() -> Mapping[str, Any]:
            try:
                got = await rest.get(
                    self.local, rest.path(API_VERSION, "namespaceoffloadings", NAMESPACE_OFFLOADING, namespace=local_ns)
                )
            except KubeError:
                got = None
            if got is not None:
                meta["uid"] = got["metadata"].get("uid")
            return obj

        self.events.offer(obj, type_=type_, reason=reason, message=message, resolve=resolve)
