"""`PlacementGate`: whether a GPU pod's twin may be created now, by the provider's capacity estimator.

Owns: asking the estimator (`Placer`, e.g. `remote.capacity.CapacityFeed.can_place`) before the
twin of a GPU pod is created, and what its answer means for the pod: placeable or no answer (an
unreachable estimator lets the pod through: the provider's scheduler still decides) is a go; a
definite no is a retried `ProviderError(reason=WaitingForGPUs)` for `grace_s` (pods finishing at
the provider free GPUs within moments), then `ProviderError(reason=GPUUnplaceable, fail_back=True)`.

Does not: ask anything for pods without GPUs, talk to any API itself, or decide pools.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from gpupool.capacity import Placement
from peering.grants import pod_requests
from vkprovider.node.provider import ProviderError

#: Reason of a pod failed back because no provider node can take it.
UNPLACEABLE = "GPUUnplaceable"
#: Reason while a GPU pod waits (locally, no twin) for the provider to have room.
WAITING_FOR_GPUS = "WaitingForGPUs"

#: (local pod, pool product) -> the estimator's answer, or None when it cannot say.
Placer = Callable[[Mapping[str, Any], str | None], Awaitable[Placement | None]]


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod requests (as the scheduler counts them)."""
    return int(pod_requests(pod).get(GPU_RESOURCE, Decimal(0)))


class PlacementGate:
    """The estimator's verdict on GPU pods of one provider, with the grace before a fail-back."""

    def __init__(self, placer: Placer, provider: str, grace_s: float) -> None:
        self.placer = placer
        self.provider = provider
        self.grace_s = grace_s
        #: Local pod UID -> when the estimator first said it cannot be placed.
        self._unplaceable: dict[str, float] = {}

    async def check(self, pod: Mapping[str, Any], product: str | None) -> None:
        """Return when the twin of `pod` (on a pool of `product`) may be created; else raise the
        waiting `ProviderError`, or after `grace_s` the fail-back one."""
        gpus = pod_gpus(pod)
        if gpus <= 0:
            return
        uid = str(pod["metadata"].get("uid") or "")
        answer = await self.placer(pod, product)
        if answer is None or answer.placeable:
            self._unplaceable.pop(uid, None)
            return
        what = f"{gpus} GPUs" + (f" of {product}" if product else "")
        now = time.monotonic()
        for stale in [u for u, t in self._unplaceable.items() if now - t > 10 * self.grace_s]:
            del self._unplaceable[stale]  # pods deleted while they waited
        waited = now - self._unplaceable.setdefault(uid, now)
        if waited < self.grace_s:
            raise ProviderError(
                f"waiting for {what} to free up at provider {self.provider} "
                f"(failed back after {self.grace_s:g}s): {answer.reason}",
                reason=WAITING_FOR_GPUS,
            )
        self._unplaceable.pop(uid, None)
        raise ProviderError(
            f"provider {self.provider} cannot place this pod ({what}): {answer.reason}",
            reason=UNPLACEABLE,
            fail_back=True,
        )
