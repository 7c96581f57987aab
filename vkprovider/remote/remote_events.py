"""`RemoteEvents`: the provider's Events about twins, mirrored onto the local pods they stand for.

Owns, for one (consumer, provider):
- per twin namespace, a watch on the provider's Events about pods (`involvedObject.kind=Pod`: the
  Events of other objects are not even listed);
- mapping each new one (ADDED or MODIFIED: not the history a relist replays) whose involved object
  is a twin the provider view knows onto its local pod (the twin's local namespace and name, the UID
  from its origin-uid label), and what of it is kept: `Scheduled` is skipped (the consumer's
  scheduler already reported the placement), a reason that is no CamelCase word reads `Remote`, a
  type other than Warning `Normal`, the message is followed by "(on <provider>)";
- offering that Event to the bounded `EventRelay`, never a task per provider Event.

Construction takes the collaborators: the provider's API client, the relay, and the provider view's
lookups: the local namespace of a twin namespace (None: not followed) and the twin of a local pod
(None: none known).

Does not: decide which twin namespaces are watched or when (the RemoteProvider runs `watch` beside
its watch of the twins there and cancels both), keep the twins (the RemoteProvider does), or limit,
combine or record Events (the relay does).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from gpufed.apis.wire import ORIGIN_UID_LABEL
from gpufed.kube import rest
from gpufed.kube.watch import watch
from vkprovider.remote.events_relay import EventRelay

#: Events of remote twins not mirrored (the consumer's own components already report these).
SKIPPED_EVENT_REASONS = frozenset({"Scheduled"})
#: The reason of a mirrored Event whose own reason is no CamelCase word.
REMOTE_REASON = "Remote"
#: What a relayed Event's reason must look like (a CamelCase word, as Kubernetes components write them).
_REASON = re.compile(r"[A-Za-z][A-Za-z0-9]{0,127}")


class RemoteEvents:
    """Mirror one provider's Events about twins onto the local pods (see the module docstring)."""

    def __init__(
        self,
        remote_api: Any,
        provider: str,
        events: EventRelay,
        local_namespace: Callable[[str], str | None],
        twin: Callable[[str, str], Mapping[str, Any] | None],
    ) -> None:
        self.remote = remote_api
        self.provider = provider
        self.events = events
        self._local_namespace = local_namespace
        self._twin = twin

    async def watch(self, twin_ns: str) -> None:
        """Mirror the Events of twin namespace `twin_ns` until cancelled (KubeError: the watch failed)."""
        await watch(
            self.remote,
            rest.path("v1", "events", namespace=twin_ns),
            self.on_event,
            what="events",
            params={"fieldSelector": "involvedObject.kind=Pod"},
        )

    def on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event about a provider's Event: offered to the relay when it is new and about a twin."""
        if kind != "ADDED" and kind != "MODIFIED":
            return  # SYNC replays history after every (re)list; only new events are mirrored
        inv = obj.get("involvedObject") or {}
        if inv.get("kind") != "Pod" or obj.get("reason") in SKIPPED_EVENT_REASONS:
            return
        local_ns = self._local_namespace(str(inv.get("namespace") or ""))
        twin = self._twin(local_ns or "", str(inv.get("name") or ""))
        if local_ns is None or twin is None:
            return
        labels = twin["metadata"].get("labels") or {}
        local_pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": local_ns, "name": inv.get("name"), "uid": labels.get(ORIGIN_UID_LABEL)},
        }
        message = f"{obj.get('message') or ''} (on {self.provider})"
        reason = str(obj.get("reason") or "")
        self.events.offer(
            local_pod,
            type_="Warning" if obj.get("type") == "Warning" else "Normal",
            reason=reason if _REASON.fullmatch(reason) else REMOTE_REASON,
            message=message,
        )
