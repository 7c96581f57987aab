"""Twins of a group at the provider start together (pure).

A group's pods (label `GANG_LABEL`, size `GANG_SIZE_ANNOTATION`, both set by the offloading webhook
on the consumer) are released by the gang controller onto one pool node, and its virtual kubelet
creates their twins one by one. Created as they come, the first twins would start while the last
ones are still being created, and any pod bound meanwhile could take the GPUs the last ones need:
part of the group would run and the rest wait. So each twin of a group is created with the
scheduling gate `TWIN_GROUP_GATE`, and the gate is removed from all of them together once

- every twin of the group exists (as many as the group's size), and
- the provider's free GPUs of the pool's product hold all of them, after the twins of this consumer
  that are already on their way there (`holds`: the same best-fit packing the pool figures use);
  without a capacity snapshot the provider's scheduler alone decides.

A twin of a group that already started (a Job's replacement pod, or the next completion of an
Indexed Job: finished twins count as started) is created without the gate and joins it. A group
that cannot start within the pod's unplaced timeout is failed back whole (the pod controller does
that: gated twins are unplaced).

The members of a group are read from the twins' labels as the provider shows them. A provider could
change those labels, but all it could achieve is to hold back or start early pods that it schedules
anyway: nothing of the consumer's changes with them.

Owns: `size_of` and `group_of` (a local pod's group size, and its group), `gated` (the index of the gate in a twin),
`add_gate`, `ungate_patch`, `members` and `started` (a group's twins, and whether it started),
`to_start` (which gated twins of a group to release now), `holds`.

Does not: create or patch anything, or decide which pods form a group (`gpupool.gang`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpufed.apis.wire import GANG_LABEL, GANG_SIZE_ANNOTATION, TWIN_GROUP_GATE
from gpupool.capacity import Bucket, best_fit, free_after


def size_of(pod: Mapping[str, Any]) -> int:
    """The group size the offloading webhook wrote on a pod (0: none readable)."""
    try:
        return max(0, int(((pod.get("metadata") or {}).get("annotations") or {}).get(GANG_SIZE_ANNOTATION) or 0))
    except ValueError:
        return 0


def group_of(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """(group label, size) of a local group pod of more than one pod; None otherwise."""
    label = ((pod.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL)
    size = size_of(pod)
    if not label or size < 2:
        return None
    return str(label), size


def gated(twin: Mapping[str, Any]) -> int | None:
    """Index of the group gate among the twin's scheduling gates (None: not gated)."""
    gates = (twin.get("spec") or {}).get("schedulingGates") or []
    for i, g in enumerate(gates):
        if isinstance(g, Mapping) and g.get("name") == TWIN_GROUP_GATE:
            return i
    return None


def add_gate(spec: dict[str, Any]) -> None:
    """Give a twin's pod spec (being built) the group gate."""
    spec["schedulingGates"] = [*(spec.get("schedulingGates") or []), {"name": TWIN_GROUP_GATE}]


def ungate_patch(twin: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that removes the group gate (failing, thanks to its `test`, if the gates
    changed meanwhile); [] when the twin is not gated."""
    i = gated(twin)
    if i is None:
        return []
    path = f"/spec/schedulingGates/{i}"
    return [{"op": "test", "path": f"{path}/name", "value": TWIN_GROUP_GATE}, {"op": "remove", "path": path}]


def members(twins: Sequence[Mapping[str, Any]], group: str) -> list[Mapping[str, Any]]:
    """The twins of `group` not being deleted, finished ones included (an Indexed Job's next pod
    joins a group whose first pods have finished)."""
    return [
        t
        for t in twins
        if ((t.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL) == group
        and not (t.get("metadata") or {}).get("deletionTimestamp")
    ]


def started(group: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some twin of the group has started (is not gated: running, or finished)."""
    return any(gated(t) is None for t in group)


#: Whether the provider holds these gated twins now (None: nobody can say).
Fits = Callable[[Sequence[Mapping[str, Any]]], bool | None]


def to_start(group: Sequence[Mapping[str, Any]], size: int, fits: Fits) -> list[Mapping[str, Any]]:
    """The gated twins of `group` (its `members`) to release now: all of them once the group
    started (they join it), or once all `size` twins exist and `fits` of them is not False (asked
    only then); none otherwise."""
    waiting = [t for t in group if gated(t) is not None]
    if not waiting:
        return []
    if started(group):
        return waiting
    if len(group) < size or fits(waiting) is False:
        return []
    return waiting


def holds(histogram: Sequence[Bucket], before: Sequence[int], group: Sequence[int]) -> bool:
    """Whether nodes with these free GPUs hold every pod of `group` (GPUs per pod) once the pods
    `before` it (GPUs per pod, on their way there) are placed, as a bin-packing scheduler would."""
    _, unplaced = best_fit(free_after(histogram, before), group)
    return not unplaced
