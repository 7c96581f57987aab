"""gpufed.ops.doctor.checks: a report is as bad as its worst check, and its JSON shape."""

from __future__ import annotations

from gpufed.ops.doctor.checks import FAIL, OK, THIS_CLUSTER, WARN, Check, Peer, Report, Status


def test_a_report_is_as_bad_as_its_worst_check() -> None:
    def report(*statuses: Status) -> Report:
        checks = tuple(Check(f"c{i}", s, "found") for i, s in enumerate(statuses))
        return Report("consumer-1", "https://api", (), checks)

    assert report().status == OK and not report().failed, "nothing checked is nothing wrong"
    assert report(OK, WARN, OK).status == WARN and not report(OK, WARN).failed
    assert report(WARN, FAIL, OK).status == FAIL and report(FAIL).failed


def test_to_dict_is_the_json_of_gpufed_doctor() -> None:
    r = Report(
        "consumer-1",
        "https://api",
        (Peer("gpu-a-1", "provider"),),
        (Check("install", OK, "installed"), Check("api", FAIL, "down", "fix it", "gpu-a-1")),
    )
    assert r.to_dict() == {
        "clusterId": "consumer-1",
        "apiServer": "https://api",
        "status": "FAIL",
        "peers": [{"clusterId": "gpu-a-1", "role": "provider"}],
        "checks": [
            {"peer": THIS_CLUSTER, "name": "install", "status": "OK", "finding": "installed", "fix": ""},
            {"peer": "gpu-a-1", "name": "api", "status": "FAIL", "finding": "down", "fix": "fix it"},
        ],
    }
