"""`TwinStore`: one provider's twins as last seen, keyed by their LOCAL (namespace, name).

Owns the twins the `RemoteProvider` watches (or has just created or adopted), and the indexes the
group start reads on every change of a group's twin and on every capacity snapshot, so that none of
those walks every twin:
- the twins of each group (`group`: by local namespace and the `GANG_LABEL` value),
- the gated twins (`gated`: those carrying the group gate),
- per pool node, the ungated twins the provider has not placed yet (`on_the_way`).

Each index holds keys only; a key's entries are recomputed from the twin whenever it is stored or
removed.

Does not: watch, create or delete anything (the RemoteProvider does), or decide what a group does
(`forge.groups`, `remote.groups`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpufed.apis.wire import GANG_LABEL
from vkprovider.forge import groups
from vkprovider.forge.pods import origin_node, unplaced

Key = tuple[str, str]


def _group_key(key: Key, twin: Mapping[str, Any]) -> tuple[str, str] | None:
    label = ((twin.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL)
    return (key[0], str(label)) if label else None


class TwinStore:
    def __init__(self) -> None:
        self._twins: dict[Key, dict[str, Any]] = {}
        #: (local namespace, group label) -> keys of that group's twins.
        self._groups: dict[tuple[str, str], set[Key]] = {}
        self._gated: set[Key] = set()
        #: origin node ("" for twins that name none) -> keys of its ungated, unplaced twins.
        self._on_the_way: dict[str, set[Key]] = {}

    def __len__(self) -> int:
        return len(self._twins)

    def __contains__(self, key: object) -> bool:
        return key in self._twins

    def get(self, key: Key) -> dict[str, Any] | None:
        return self._twins.get(key)

    def items(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        """A snapshot of the (key, twin) pairs: the store may change while the caller iterates."""
        return iter(list(self._twins.items()))

    # ---- changes

    def put(self, key: Key, twin: dict[str, Any]) -> None:
        self._unindex(key)
        self._twins[key] = twin
        self._index(key, twin)

    def setdefault(self, key: Key, twin: dict[str, Any]) -> dict[str, Any]:
        current = self._twins.get(key)
        if current is not None:
            return current
        self.put(key, twin)
        return twin

    def pop(self, key: Key, uid: str | None = None) -> dict[str, Any] | None:
        """Remove the twin under `key` (only when its UID is `uid`, if given); the removed twin."""
        current = self._twins.get(key)
        if current is None or (uid is not None and (current.get("metadata") or {}).get("uid") != uid):
            return None
        self._unindex(key)
        del self._twins[key]
        return current

    def _index(self, key: Key, twin: Mapping[str, Any]) -> None:
        group = _group_key(key, twin)
        if group is not None:
            self._groups.setdefault(group, set()).add(key)
        if groups.gated(twin) is not None:
            self._gated.add(key)
        elif unplaced(twin):
            self._on_the_way.setdefault(origin_node(twin, ""), set()).add(key)

    def _unindex(self, key: Key) -> None:
        twin = self._twins.get(key)
        if twin is None:
            return
        group = _group_key(key, twin)
        if group is not None:
            _discard(self._groups, group, key)
        self._gated.discard(key)
        _discard(self._on_the_way, origin_node(twin, ""), key)

    # ---- indexes

    def group(self, local_ns: str, label: str) -> list[Mapping[str, Any]]:
        """The twins labelled with this group in `local_ns` (by key order)."""
        return [self._twins[k] for k in sorted(self._groups.get((local_ns, label), ()))]

    def gated(self) -> list[Key]:
        """Keys of the twins that carry the group gate."""
        return sorted(self._gated)

    def on_the_way(self, node: str) -> list[Mapping[str, Any]]:
        """The ungated twins of pool node `node` that the provider has not placed yet."""
        return [self._twins[k] for k in self._on_the_way.get(node, ())]


def _discard(index: dict[Any, set[Key]], at: Any, key: Key) -> None:
    keys = index.get(at)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[at]
