"""Queued workloads (pure): the node affinity that keeps Kueue from admitting a Job to a gpufed
flavor none of whose provider nodes can hold one of its pods.

Kueue counts a flavor's quota over its whole pool, so on quota alone it may admit a Job of 8-GPU
pods to a pool of 4-GPU nodes; the pods then never start and hold the quota. Kueue does match a
pod template's required node affinity against each flavor's `nodeLabels` (for the keys some
flavor of the ClusterQueue's resource group sets), Kubernetes' operators included. gpufed's
flavors and pool nodes carry `POD_GPUS_LABEL` (the most GPUs one pod can get there), so every GPU
pod template of a queued Job (or JobSet) that asks for more than one GPU gets, ANDed into each of
its own required terms:

    gpufed.io/pod-gpus-max DoesNotExist        (any node or flavor that is not gpufed's)
    OR gpufed.io/pod-gpus-max Gt <GPUs - 1>    (a gpufed pool that holds such a pod)

Owns `template_paths` (where a Job's or JobSet's pod templates are) and `fit_affinity_patch` (the
JSONPatch). A template that already names the key is left as it is (the webhook is re-invoked after
other webhooks change the object); a quantity that does not parse leaves the template unchanged (the
API server refuses it).

Does not: decide which objects are queued (the webhook's object selector does) or read flavors.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.wire import POD_GPUS_LABEL
from peering.grants import pod_requests


def template_paths(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(JSON pointer of the pod spec, the pod spec) of every pod template of a Job or JobSet."""
    kind = obj.get("kind")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    if kind == "Job":
        pod = (spec.get("template") or {}).get("spec")
        if isinstance(pod, Mapping):
            yield "/spec/template/spec", pod
    elif kind == "JobSet":
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            pod = ((((rj or {}).get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
            if isinstance(pod, Mapping):
                yield f"/spec/replicatedJobs/{i}/template/spec/template/spec", pod


def pod_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs one pod of this spec holds (`pod_requests`), each container's requests defaulted from its
    limits as the API server defaults a pod's. Raises ValueError for a quantity that does not parse."""

    def defaulted(c: Any) -> dict[str, Any]:
        res = (c or {}).get("resources") or {}
        return {**c, "resources": {**res, "requests": {**(res.get("limits") or {}), **(res.get("requests") or {})}}}

    pod = {
        "spec": {
            **spec,
            "containers": [defaulted(c) for c in spec.get("containers") or []],
            "initContainers": [defaulted(c) for c in spec.get("initContainers") or []],
        }
    }
    return int(pod_requests(pod).get(GPU_RESOURCE, Decimal(0)))


def _names_key(affinity: Mapping[str, Any]) -> bool:
    required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    return any(
        e.get("key") == POD_GPUS_LABEL
        for t in required.get("nodeSelectorTerms") or []
        for e in (t or {}).get("matchExpressions") or []
    )


def fit_affinity_patch(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSONPatch operations giving each multi-GPU pod template of `obj` the fit affinity (see the
    module docstring); [] when none needs it."""
    ops: list[dict[str, Any]] = []
    for path, spec in template_paths(obj):
        try:
            n = pod_gpus(spec)
        except ValueError:
            continue
        affinity = spec.get("affinity") if isinstance(spec.get("affinity"), Mapping) else {}
        assert isinstance(affinity, Mapping)
        if n <= 1 or _names_key(affinity):
            continue
        new = copy.deepcopy(dict(affinity))
        node_affinity = new.setdefault("nodeAffinity", {})
        required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)] or [{}]
        fit = (
            {"key": POD_GPUS_LABEL, "operator": "DoesNotExist"},
            {"key": POD_GPUS_LABEL, "operator": "Gt", "values": [str(n - 1)]},
        )
        required["nodeSelectorTerms"] = [
            {**t, "matchExpressions": [*(t.get("matchExpressions") or []), e]} for t in terms for e in fit
        ]
        ops.append({"op": "add", "path": f"{path}/affinity", "value": new})
    return ops
