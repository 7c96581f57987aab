"""The PodProvider conformance suite against `FakeProvider`, and proof that the suite catches
providers that break the contract (each mutant fails the check written for its fault)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from tests.unit import provider_conformance as conf
from tests.unit.fakes import FakeProvider, until
from vkprovider.node.provider import Twin

NS = "team"


def make_pod(namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"nodeName": "vk", "containers": [{"name": "main", "image": "img"}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def harness(provider: FakeProvider, timeout: float = 1.0) -> conf.ConformanceHarness:
    async def set_phase(namespace: str, name: str, phase: str) -> None:
        provider.set_phase(namespace, name, phase)

    async def vanish(namespace: str, name: str) -> None:
        provider.vanish(namespace, name)

    async def wait_for(predicate: Callable[[], bool]) -> None:
        await until(predicate, timeout=timeout)

    return conf.ConformanceHarness(provider, NS, make_pod, set_phase, vanish, wait_for)


@pytest.mark.parametrize("check", conf.CHECKS, ids=[c.__name__ for c in conf.CHECKS])
async def test_fake_provider_conforms(check: Callable[[conf.ConformanceHarness], Awaitable[None]]) -> None:
    await check(harness(FakeProvider()))


# ---------------------------------------------------------------------------------------- mutants


class NotifiesRemoteKey(FakeProvider):
    def _changed(self, namespace: str, name: str) -> None:
        super()._changed(f"{namespace}-twin", name)


class RecreatesOnCreate(FakeProvider):
    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        self.pods.pop((meta["namespace"], meta["name"]), None)
        await super().create_pod(pod)


class DeletesAnyUid(FakeProvider):
    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None:
        self.vanish(namespace, name)


class ReportsNothingTerminal(FakeProvider):
    def _twin(self, key: tuple[str, str], pod: Mapping[str, Any]) -> Twin:
        twin = super()._twin(key, pod)
        return Twin(twin.namespace, twin.name, twin.origin_uid, False, twin.deleting, twin.raw)


class StatusWithoutEnvelope(FakeProvider):
    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        out: dict[str, Any] = super().pod_status(pod, twin)["status"]
        return out


class NeverReady(FakeProvider):
    async def run(self) -> None:
        await until(lambda: False, timeout=5)


class NotifiesOnlyTheFirstSubscriber(FakeProvider):
    def subscribe(self, notify: Callable[[str, str], None]) -> None:
        if not self.subscribers:
            super().subscribe(notify)


@pytest.mark.parametrize(
    ("mutant", "check"),
    [
        (NotifiesRemoteKey, conf.check_notify_uses_the_local_key),
        (RecreatesOnCreate, conf.check_create_is_idempotent),
        (DeletesAnyUid, conf.check_twin_of_another_uid_keeps_its_uid),
        (ReportsNothingTerminal, conf.check_terminal_twins),
        (StatusWithoutEnvelope, conf.check_pod_status_is_a_status_patch_with_the_phase),
        (NeverReady, conf.check_ready_after_run),
        (NotifiesOnlyTheFirstSubscriber, conf.check_every_subscriber_is_notified),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
async def test_the_suite_catches_a_broken_provider(
    mutant: type[FakeProvider], check: Callable[[conf.ConformanceHarness], Awaitable[None]]
) -> None:
    with pytest.raises(AssertionError):
        await check(harness(mutant(), timeout=0.2))
