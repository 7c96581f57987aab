"""gpufed.kube.times: the one RFC 3339 formatter and parser."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufed.kube.times import parse_rfc3339, rfc3339, time_or_none


def test_formats_seconds_and_micro_from_unix_seconds_and_datetimes() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00Z"
    assert rfc3339(1.5, micro=True) == "1970-01-01T00:00:01.500000Z"
    plus_one = dt.datetime(2026, 11, 27, 1, 2, 3, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert rfc3339(plus_one) == "2026-11-27T00:02:03Z"


def test_now_is_now() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    stamp = parse_rfc3339(rfc3339())
    assert before <= stamp <= dt.datetime.now(dt.UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T10:00:00Z", dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)),
        ("2026-11-21T11:00:00.5+01:00", dt.datetime(2026, 11, 21, 10, 0, 0, 500000, tzinfo=dt.UTC)),
        ("2026-11-21t10:00:00z", dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)),
    ],
)
def test_parses_what_the_api_server_and_peers_write(text: str, expected: dt.datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-11-21T10:00:00", "2026-11-21", ""])
def test_refuses_what_is_not_rfc3339(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rfc3339(text)


def test_a_time_past_the_utc_range_keeps_its_offset() -> None:
    parsed = parse_rfc3339("9999-12-31T23:59:59-01:00")
    assert parsed.utcoffset() == dt.timedelta(hours=-1)


@given(st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9000, 1, 1)))
def test_round_trips(moment: dt.datetime) -> None:
    aware = moment.replace(tzinfo=dt.UTC)
    assert parse_rfc3339(rfc3339(aware, micro=True)) == aware
    assert parse_rfc3339(rfc3339(aware)) == aware.replace(microsecond=0)


def test_timestamps_of_objects_read_are_rfc3339_or_none() -> None:
    assert time_or_none("2026-11-27T00:24:53Z") == dt.datetime(2026, 11, 27, 0, 24, 53, tzinfo=dt.UTC)
    micro = time_or_none("2026-11-27T00:24:53.123456Z")
    assert micro is not None and micro.microsecond == 123456
    assert time_or_none("2026-11-27T02:24:53+02:00") == dt.datetime(2026, 11, 27, 0, 24, 53, tzinfo=dt.UTC)
    for absent in (None, "", 42, "yesterday", "2026-11-27T00:24:53"):
        assert time_or_none(absent) is None, absent
