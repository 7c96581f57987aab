"""Status conditions: transition times kept while the status holds, readers, time-free comparison."""

from __future__ import annotations

import datetime as dt

from gpufed.kube import conditions as cond
from gpufed.kube.times import parse_rfc3339

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(hours=1)


def test_status_values() -> None:
    assert [cond.status_value(v) for v in (True, False, None)] == ["True", "False", "Unknown"]


def test_transition_time_is_kept_while_the_status_holds() -> None:
    first = cond.condition("Ready", True, "Created", "ok", [], now=T0)
    assert first == {
        "type": "Ready",
        "status": "True",
        "reason": "Created",
        "message": "ok",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }
    same = cond.condition("Ready", True, "StillCreated", "still ok", [first], now=T1)
    assert same["lastTransitionTime"] == "2026-01-02T03:04:05Z" and same["reason"] == "StillCreated"
    flipped = cond.condition("Ready", False, "Broken", "not ok", [same], now=T1)
    assert flipped["lastTransitionTime"] == "2026-01-02T04:04:05Z"


def test_without_now_the_time_is_the_current_one() -> None:
    stamp = cond.condition("Ready", None, "Pending", "", [])["lastTransitionTime"]
    assert stamp.endswith("Z") and "." not in stamp
    assert abs((dt.datetime.now(dt.UTC) - parse_rfc3339(stamp)).total_seconds()) < 5


def test_mark_replaces_one_type_and_appends_it_last() -> None:
    conds = cond.mark([], "A", True, "Yes", "", now=T0)
    conds = cond.mark(conds, "B", False, "No", "", now=T0)
    conds = cond.mark(conds, "A", True, "Again", "", now=T1)
    assert [(c["type"], c["reason"]) for c in conds] == [("B", "No"), ("A", "Again")]
    assert conds[-1]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert cond.set_condition(conds, {"type": "B", "status": "True"})[-1] == {"type": "B", "status": "True"}


def test_readers() -> None:
    conds = [{"type": "A", "status": "True", "reason": "Yes"}, {"type": "B", "status": "False", "reason": "No"}]
    assert cond.find(conds, "B") == conds[1] and cond.find(conds, "C") is None and cond.find(None, "A") is None
    assert cond.is_true(conds, "A") and not cond.is_true(conds, "B") and not cond.is_true(conds, "C")
    assert cond.reason_of(conds, "B") == "No" and cond.reason_of(conds, "C") == "" and cond.reason_of(None, "A") == ""


def test_without_times_tells_a_change_from_a_rewrite() -> None:
    a = {"phase": "Ready", "conditions": [cond.condition("Ready", True, "R", "m", [], now=T0)]}
    b = {"phase": "Ready", "conditions": [cond.condition("Ready", True, "R", "m", [], now=T1)]}
    assert a != b and cond.without_times(a) == cond.without_times(b)
    assert cond.without_times({"phase": "x"}) == {"phase": "x", "conditions": []}
    assert "lastTransitionTime" in a["conditions"][0], "the input is left alone"


def test_ready_is_true_when_every_required_condition_is() -> None:
    conds = cond.mark(cond.mark([], "A", True, "Yes", "a ok", now=T0), "B", True, "Fine", "b ok", now=T0)
    out = cond.ready(conds, ("A", "B"), 3, now=T1)
    assert [c["type"] for c in out] == ["Ready", "A", "B"], "Ready first, the others in their order"
    assert out[0] == {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "A, B: True",
        "lastTransitionTime": "2026-01-02T04:04:05Z",
        "observedGeneration": 3,
    }
    assert all(c["observedGeneration"] == 3 for c in out)
    again = cond.ready(out, ("A", "B"), 4, now=T1 + dt.timedelta(hours=1))
    assert again[0]["lastTransitionTime"] == out[0]["lastTransitionTime"], "kept while Ready holds"
    assert [c["observedGeneration"] for c in again] == [4, 4, 4]
    assert "observedGeneration" not in conds[0], "the input is left alone"


def test_ready_is_false_with_the_reason_of_the_first_condition_not_true() -> None:
    conds = cond.mark(cond.mark([], "B", False, "Denied", "no room", now=T0), "A", None, "Pending", "wait", now=T0)
    out = cond.ready(conds, ("A", "B"), 1, now=T0)
    assert (out[0]["status"], out[0]["reason"], out[0]["message"]) == ("False", "Pending", "A: wait")
    a_true = cond.mark(out, "A", True, "Yes", "", now=T0)
    out = cond.ready(a_true, ("A", "B"), 1, now=T0)
    assert (out[0]["status"], out[0]["reason"], out[0]["message"]) == ("False", "Denied", "B: no room")
    missing = cond.ready(cond.mark([], "A", True, "Yes", "", now=T0), ("A", "B"), 2, now=T0)
    assert (missing[0]["reason"], missing[0]["message"]) == ("BPending", "B: not reported yet")
    assert cond.ready([], (), 1, now=T0)[0]["status"] == "True"


def test_ready_from_true_to_false_moves_its_transition_time() -> None:
    ok = cond.ready(cond.mark([], "A", True, "Yes", "", now=T0), ("A",), 1, now=T0)
    broken = cond.ready(cond.mark(ok, "A", False, "Lost", "gone", now=T1), ("A",), 2, now=T1)
    assert broken[0]["status"] == "False" and broken[0]["lastTransitionTime"] == "2026-01-02T04:04:05Z"


def test_observed_stamps_every_condition() -> None:
    conds: list[dict[str, object]] = [
        {"type": "A", "status": "True"},
        {"type": "B", "status": "False", "observedGeneration": 1},
    ]
    assert [c["observedGeneration"] for c in cond.observed(conds, 7)] == [7, 7]
    assert cond.observed([], 7) == []
