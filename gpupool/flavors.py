"""Kueue's view of the federated GPU pool (pure): one ResourceFlavor per pool virtual node, and GPU
quotas that never promise more than the providers granted.

Owns:
- `flavor`: the ResourceFlavor of a pool node — named after the node, its `nodeLabels` pinning an
  admitted workload to that node (`kubernetes.io/hostname`) and saying the most GPUs one pod can get
  there (`POD_GPUS_LABEL`, which the node affinity the webhook gives queued GPU Jobs is matched
  against: Kueue then never admits a Job to a flavor none of whose provider nodes can hold one of
  its pods), and its `tolerations` letting it onto a virtual node; labelled as gpufed's
  (`app.kubernetes.io/managed-by`) and with its provider;
- `caps`: how many GPUs each flavor may be promised in all (the pool's GPUs of its product at the
  provider, at most the grant) and each provider across its flavors (the grant: a provider's pools
  share one grant);
- `clamp`: the nominal GPU quotas the ClusterQueues may hold, from those they ask for: within every
  flavor's cap and every provider's grant summed over all ClusterQueues (Kueue lets each ClusterQueue
  use its nominal quota without borrowing, so only the sum keeps the promise), shared in proportion
  to what each asks (largest remainders, ties by name), never more than asked.

GPUs only: CPU and memory of a flavor are the provider's to refuse (its quota) and are not clamped.

Does not: read or write objects (`vkprovider.kueue` does), or decide admission (Kueue does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POD_GPUS_LABEL,
    REMOTE_CLUSTER_LABEL,
    VIRTUAL_NODE_TAINT_KEY,
)

#: Kueue's API group, and the versions whose ResourceFlavor and ClusterQueue gpufed reads and writes, in
#: order of preference: v1beta2 (Kueue >= 0.15; its storage version, v1beta1 deprecated there) and
#: v1beta1 (older Kueue). The fields gpufed touches (a flavor's `nodeLabels` and `tolerations`, a
#: ClusterQueue's `resourceGroups`) have the same shape in both.
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
KUEUE_VERSION = KUEUE_VERSIONS[0]
HOSTNAME_LABEL = "kubernetes.io/hostname"

#: (ClusterQueue, flavor) -> GPUs
Quotas = dict[tuple[str, str], int]


@dataclass(frozen=True)
class Pool:
    """One pool virtual node as Kueue sees it: a flavor of `provider`'s GPUs."""

    node: str
    provider: str
    #: GPUs of the product at the provider (None: not known); the flavor's cap is at most the grant.
    total: int | None
    #: The provider's whole grant in GPUs (shared by its pools).
    granted: int
    #: The most GPUs one pod can get on the pool (its node's `POD_GPUS_LABEL`; None: not known).
    pod_gpus: int | None = None


def flavor(pool: Pool, version: str = KUEUE_VERSION) -> dict[str, Any]:
    """The ResourceFlavor object of `pool` (in Kueue's API `version`)."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{version}",
        "kind": "ResourceFlavor",
        "metadata": {
            "name": pool.node,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, REMOTE_CLUSTER_LABEL: pool.provider},
        },
        "spec": {
            "nodeLabels": {
                HOSTNAME_LABEL: pool.node,
                **({POD_GPUS_LABEL: str(pool.pod_gpus)} if pool.pod_gpus else {}),
            },
            "tolerations": [{"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}],
        },
    }


def caps(pools: Mapping[str, Pool]) -> tuple[dict[str, int], dict[str, int]]:
    """(GPUs per flavor, GPUs per provider) that may be promised in all."""
    per_flavor = {name: min(p.granted, p.total) if p.total is not None else p.granted for name, p in pools.items()}
    per_provider: dict[str, int] = {}
    for p in pools.values():
        per_provider[p.provider] = max(per_provider.get(p.provider, 0), p.granted)
    return per_flavor, per_provider


def _share(asked: Mapping[tuple[str, str], int], limit: int) -> Quotas:
    """`asked` scaled down to sum to at most `limit`, in proportion, largest remainders first."""
    total = sum(asked.values())
    if total <= limit:
        return dict(asked)
    base = {k: v * limit // total for k, v in asked.items()}
    left = limit - sum(base.values())
    order = sorted(asked, key=lambda k: (-(asked[k] * limit % total), k))
    for k in order[:left]:
        base[k] += 1
    return base


def clamp(asked: Mapping[tuple[str, str], int], pools: Mapping[str, Pool]) -> Quotas:
    """The nominal GPU quota each (ClusterQueue, flavor) may hold, from what it asks (see module doc).
    Entries for flavors that are not gpufed's pools are left as asked."""
    per_flavor, per_provider = caps(pools)
    out: Quotas = {k: v for k, v in asked.items() if k[1] not in pools}
    ours = {k: max(0, v) for k, v in asked.items() if k[1] in pools}
    by_flavor: dict[str, dict[tuple[str, str], int]] = {}
    for k, v in ours.items():
        by_flavor.setdefault(k[1], {})[k] = v
    within: Quotas = {}
    for name, entries in by_flavor.items():
        within.update(_share(entries, per_flavor[name]))
    by_provider: dict[str, dict[tuple[str, str], int]] = {}
    for k, v in within.items():
        by_provider.setdefault(pools[k[1]].provider, {})[k] = v
    for provider, entries in by_provider.items():
        out.update(_share(entries, per_provider[provider]))
    return out


def gpu_quotas(cluster_queue: Mapping[str, Any]) -> dict[str, int]:
    """flavor -> nominal GPU quota of one ClusterQueue (flavors without a GPU quota are left out)."""
    out: dict[str, int] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for fl in group.get("flavors") or []:
            for r in fl.get("resources") or []:
                if r.get("name") == GPU_RESOURCE:
                    try:
                        out[str(fl.get("name"))] = int(str(r.get("nominalQuota")))
                    except ValueError:
                        continue
    return out


def with_gpu_quotas(cluster_queue: Mapping[str, Any], quotas: Mapping[str, int]) -> list[dict[str, Any]]:
    """The ClusterQueue's `spec.resourceGroups` with the GPU nominal quota of each flavor in `quotas`."""
    groups = []
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        flavors = []
        for fl in group.get("flavors") or []:
            resources = []
            for r in fl.get("resources") or []:
                if r.get("name") == GPU_RESOURCE and str(fl.get("name")) in quotas:
                    r = {**r, "nominalQuota": str(quotas[str(fl.get("name"))])}
                resources.append(dict(r))
            flavors.append({**fl, "resources": resources})
        groups.append({**group, "flavors": flavors})
    return groups
