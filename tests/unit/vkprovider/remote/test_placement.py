"""The estimator's gate before a GPU pod's twin: no GPUs or no answer let the pod through, a no waits
for the grace and then fails the pod back."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from gpupool.capacity import Placement
from vkprovider.node.provider import ProviderError
from vkprovider.remote.placement import UNPLACEABLE, WAITING_FOR_GPUS, PlacementGate, pod_gpus


def pod(gpus: int, uid: str = "u-1") -> dict[str, Any]:
    resources = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"namespace": "team", "name": "train", "uid": uid},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
    }


class Estimator:
    def __init__(self, answer: Placement | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str | None]] = []

    async def __call__(self, pod: Mapping[str, Any], product: str | None) -> Placement | None:
        self.asked.append((pod["metadata"]["name"], product))
        return self.answer


def test_pod_gpus_counts_what_the_scheduler_counts() -> None:
    assert pod_gpus(pod(0)) == 0
    assert pod_gpus(pod(4)) == 4


async def test_a_pod_without_gpus_is_not_asked_about() -> None:
    estimator = Estimator(Placement(False, "no room", 0))
    await PlacementGate(estimator, "gpu-a", 30.0).check(pod(0), None)
    assert estimator.asked == []


@pytest.mark.parametrize("answer", [None, Placement(True, "fits on 2 nodes", 2)])
async def test_no_answer_or_a_yes_lets_the_pod_through(answer: Placement | None) -> None:
    estimator = Estimator(answer)
    await PlacementGate(estimator, "gpu-a", 30.0).check(pod(2), "H100")
    assert estimator.asked == [("train", "H100")]


async def test_a_no_waits_for_the_grace_then_fails_back() -> None:
    estimator = Estimator(Placement(False, "no node has 8 free GPUs", 0))
    waiting = PlacementGate(estimator, "gpu-a", 30.0)
    with pytest.raises(ProviderError) as e:
        await waiting.check(pod(8), "H100")
    assert (e.value.reason, e.value.retry, e.value.fail_back) == (WAITING_FOR_GPUS, True, False)
    assert "8 GPUs of H100" in str(e.value) and "no node has 8 free GPUs" in str(e.value)
    no_grace = PlacementGate(estimator, "gpu-a", 0.0)
    with pytest.raises(ProviderError) as e:
        await no_grace.check(pod(8), None)
    assert (e.value.reason, e.value.retry, e.value.fail_back) == (UNPLACEABLE, False, True)
    assert str(e.value) == "provider gpu-a cannot place this pod (8 GPUs): no node has 8 free GPUs"


async def test_a_yes_after_a_no_starts_the_grace_anew() -> None:
    estimator = Estimator(Placement(False, "full", 0))
    gate = PlacementGate(estimator, "gpu-a", 0.05)
    with pytest.raises(ProviderError) as e:
        await gate.check(pod(1), None)
    assert e.value.reason == WAITING_FOR_GPUS
    await asyncio.sleep(0.06)
    estimator.answer = Placement(True, "fits", 1)
    await gate.check(pod(1), None)
    estimator.answer = Placement(False, "full again", 0)
    with pytest.raises(ProviderError) as e:
        await gate.check(pod(1), None)
    assert e.value.reason == WAITING_FOR_GPUS  # not failed back: the earlier wait ended with the yes
