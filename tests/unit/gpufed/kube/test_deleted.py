"""`RecentlyDeleted`: deleted UIDs until their DELETED event, the oldest forgotten beyond the limit."""

from __future__ import annotations

from gpufed.kube.deleted import RecentlyDeleted


def test_a_uid_is_held_from_its_delete_to_its_deleted_event() -> None:
    gone = RecentlyDeleted()
    gone.add("a")
    assert "a" in gone and "b" not in gone
    gone.discard("a")
    gone.discard("never-added")
    assert "a" not in gone and len(gone) == 0


def test_beyond_the_limit_the_oldest_is_forgotten() -> None:
    gone = RecentlyDeleted(limit=2)
    for uid in ("a", "b", "c"):
        gone.add(uid)
    assert "a" not in gone and "b" in gone and "c" in gone
    assert len(gone) == 2
