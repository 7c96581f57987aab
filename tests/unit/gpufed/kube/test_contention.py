"""`retry_contended`: a write that lost an optimistic-concurrency race in the API server is sent
again; AlreadyExists and every other refusal are not."""

from __future__ import annotations

import pytest

from gpufed.kube import contention
from gpufed.kube.client import KubeError

QUOTA_CONFLICT = KubeError(
    'create pods: 409 Operation cannot be fulfilled on resourcequotas "gpufed-grant": the object has been '
    "modified; please apply your changes to the latest version and try again",
    status=409,
    reason="Conflict",
)


class Writes:
    def __init__(self, *outcomes: KubeError | str) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, KubeError):
            raise outcome
        return outcome


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contention, "PAUSE_S", 0.0)


async def test_a_contended_write_is_sent_again_until_it_lands() -> None:
    write = Writes(QUOTA_CONFLICT, QUOTA_CONFLICT, "created")
    assert await contention.retry_contended(write) == "created"
    assert write.calls == 3


async def test_it_gives_up_after_its_attempts_with_the_last_error() -> None:
    write = Writes(*([QUOTA_CONFLICT] * 5))
    with pytest.raises(KubeError) as e:
        await contention.retry_contended(write, attempts=4)
    assert e.value is QUOTA_CONFLICT
    assert write.calls == 4


@pytest.mark.parametrize(
    "error",
    [
        KubeError('create pods: 409 pods "p" already exists', status=409, reason="AlreadyExists"),
        KubeError("create pods: 403 forbidden", status=403, reason="Forbidden"),
        KubeError("create pods: cannot reach the API server"),
    ],
)
async def test_other_refusals_are_not_retried(error: KubeError) -> None:
    write = Writes(error, "created")
    with pytest.raises(KubeError) as e:
        await contention.retry_contended(write)
    assert e.value is error
    assert write.calls == 1
    assert not contention.contended(error)
