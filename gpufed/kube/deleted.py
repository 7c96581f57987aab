"""`RecentlyDeleted`: UIDs of objects a controller deleted whose DELETED watch event has not come yet.

Owns: a bounded, oldest-first set of UIDs (`add` when a delete succeeded, `discard` on the DELETED
event, `in` to tell an event that was under way at the delete from the object being back), so a
watch event written before a delete and delivered after it does not start the same delete again.
Beyond `limit` the oldest UID is forgotten: such a late event then costs one more delete, answered 404.

Does not: watch or delete anything.
"""

from __future__ import annotations

#: UIDs remembered at most.
LIMIT = 10_000


class RecentlyDeleted:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._uids: dict[str, None] = {}

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        if len(self._uids) > self.limit:
            del self._uids[next(iter(self._uids))]

    def discard(self, uid: str) -> None:
        self._uids.pop(uid, None)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)
