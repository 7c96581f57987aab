"""Gang placement of pod groups (pure): which pods run together, and which GPU pool holds all of them.

Owns:
- `group_of`: the group a pod belongs to, from what the consumer's own API server says about it — a
  Job's pods when the Job runs more than one at once (`min(parallelism, completions)` of them), or
  pods labelled `gpufed.io/pod-group` (size in `gpufed.io/pod-group-size`) or with Kueue's pod-group
  label and total count. A pod or Job carrying Kueue's queue label is Kueue's: Kueue admits the whole
  workload to one flavor, so gpufed's gang path steps aside (None);
- `Offer`: one pool virtual node as its figures describe it (provider, GPU product, the free GPUs per
  provider node after the pods in flight, the grant's headroom);
- `largest_group`: how many of the group's pods a pool takes now (packed largest first onto the
  fullest node that still takes each, as the scheduler would, within the headroom); `ever`: how many
  it could take with every GPU of the product free and the whole grant unused;
- `node_allows`: whether a pod's required node selection lets it onto a pool's node;
- `place`: the pool for a group — one that holds every pod, the one that leaves the fewest GPUs of
  the grant unused after it (best fit, ties by name) — or why none does now (`Decision.reason`, with
  the largest group each pool takes now), and whether none ever could (`never`).

Only GPUs are packed: CPU and memory of a group are left to the pool's allocatable and the provider's
fit check (a GPU node has far more of them per GPU than a pod asks for). A pool whose figures are
static (no estimator) is counted on its headroom alone.

Does not: read or write objects, gate or release pods (`vkprovider.gangs` does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import (
    KUEUE_POD_GROUP_COUNT_ANNOTATION,
    KUEUE_POD_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
)
from gpupool.capacity import Bucket, best_fit

#: The most pods one group may have (a larger size is refused as invalid input).
MAX_GROUP = 1000
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True)
class Group:
    """Pods of `namespace` that run together: `size` of them, named by `name` (unique in the namespace)."""

    namespace: str
    name: str
    size: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def label(self) -> str:
        """A label value naming the group (its names may be longer than a label value may be)."""
        return hashlib.sha256(self.key.encode()).hexdigest()[:16]


class GroupError(ValueError):
    """A group's declaration that cannot be honoured (a size that is no positive integer, or too large)."""


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _size(text: str | None, what: str) -> int:
    try:
        size = int(str(text))
    except ValueError:
        raise GroupError(f"{what} is {text!r}: want a whole number of pods") from None
    if not 1 <= size <= MAX_GROUP:
        raise GroupError(f"{what} is {size}: want 1 to {MAX_GROUP} pods")
    return size


def job_owner(pod: Mapping[str, Any]) -> str | None:
    """The name of the Job controlling `pod` (None: no Job controls it)."""
    meta = pod.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else []:
        if not isinstance(ref, Mapping) or not ref.get("controller") or ref.get("kind") != "Job":
            continue
        if str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("name") or "") or None
    return None


def group_of(pod: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> Group | None:
    """The group `pod` belongs to (None: it runs on its own, or Kueue admits it). `job`: the Job that
    controls it, when there is one (`job_owner`). Raises `GroupError` for a group label with a size
    that is no whole number of pods in 1..MAX_GROUP."""
    labels, annotations = _labels(pod), _annotations(pod)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    if KUEUE_QUEUE_LABEL in labels or KUEUE_QUEUE_LABEL in _labels(job):
        return None
    if POD_GROUP_LABEL in labels:
        size = _size(annotations.get(POD_GROUP_SIZE_ANNOTATION), f"annotation {POD_GROUP_SIZE_ANNOTATION}")
        return Group(namespace, f"group-{labels[POD_GROUP_LABEL]}", size) if size > 1 else None
    if KUEUE_POD_GROUP_LABEL in labels:
        count = annotations.get(KUEUE_POD_GROUP_COUNT_ANNOTATION)
        size = _size(count, f"annotation {KUEUE_POD_GROUP_COUNT_ANNOTATION}")
        return Group(namespace, f"group-{labels[KUEUE_POD_GROUP_LABEL]}", size) if size > 1 else None
    if job is not None:
        spec = job.get("spec") or {}
        raw = spec.get("parallelism")
        parallelism = 1 if raw is None else int(raw)
        completions = spec.get("completions")
        size = min(parallelism, int(completions)) if completions is not None else parallelism
        uid = str((job.get("metadata") or {}).get("uid") or "")
        name = str((job.get("metadata") or {}).get("name") or "")
        if size > 1:
            return Group(namespace, f"job-{name}-{uid[:8]}" if uid else f"job-{name}", min(size, MAX_GROUP))
    return None


@dataclass(frozen=True)
class Offer:
    """One pool virtual node: `node` stands for `provider`'s GPUs of `product`."""

    node: str
    provider: str
    product: str
    #: GPUs of the grant the consumer's pods leave unused (shared by the provider's pools).
    headroom: int
    #: Free GPUs per provider node after the pods in flight; None: static figures (no estimator).
    free_nodes: tuple[Bucket, ...] | None
    #: GPUs of the product at the provider, healthy or not (None: not known).
    total: int | None = None
    #: The grant's GPUs (the whole grant of the provider).
    granted: int = 0


def largest_group(offer: Offer, gpus: Sequence[int]) -> int:
    """How many of the pods (GPUs each; the largest are placed first) the pool takes now."""
    wanted = sorted(gpus, reverse=True)
    budget = offer.headroom
    taken = 0
    for i in range(1, len(wanted) + 1):
        part = wanted[:i]
        if sum(part) > budget:
            break
        if offer.free_nodes is not None and best_fit(offer.free_nodes, part)[1]:
            break
        taken = i
    return taken


def ever(offer: Offer, gpus: Sequence[int]) -> bool:
    """Whether the pool could hold all the pods at best: the grant and the product's GPUs all free.
    Per provider node it cannot be known without the node sizes, so only the totals count."""
    need = sum(gpus)
    if need > offer.granted:
        return False
    return offer.total is None or need <= offer.total


@dataclass(frozen=True)
class Decision:
    #: The chosen pool's node, or None.
    node: str | None
    #: A sentence for the user: where the group goes, or what it needs and what each pool takes now.
    reason: str
    #: No pool could ever hold the group (larger than any grant or product): a refusal, not a wait.
    never: bool = False


def _need(gpus: Sequence[int]) -> str:
    sizes = sorted(set(gpus))
    each = (
        f"{sizes[0]} GPU{'s' if sizes[0] != 1 else ''} each" if len(sizes) == 1 else "GPUs " + "+".join(map(str, gpus))
    )
    return f"{len(gpus)} pods ({each}, {sum(gpus)} in all) on one provider and GPU product"


def place(gpus: Sequence[int], offers: Sequence[Offer], product: str | None = None) -> Decision:
    """The pool for a group whose pods need `gpus` GPUs each (`product`: only pools of that GPU
    product qualify)."""
    candidates = [o for o in offers if product is None or o.product == product]
    if not candidates:
        where = f" of product {product}" if product else ""
        return Decision(None, f"the group needs {_need(gpus)}: no GPU pool{where} is peered", never=True)
    fits = [o for o in candidates if largest_group(o, gpus) == len(gpus)]
    if fits:
        best = min(fits, key=lambda o: (o.headroom - sum(gpus), o.node))
        return Decision(best.node, f"the whole group of {len(gpus)} pods fits on {best.node} ({best.provider})")
    never = not any(ever(o, gpus) for o in candidates)
    now = ", ".join(f"{o.node}: {largest_group(o, gpus)}" for o in sorted(candidates, key=lambda o: o.node))
    if never:
        return Decision(
            None, f"the group needs {_need(gpus)}, more than any provider grants or has: {now} now", never=True
        )
    return Decision(None, f"the group needs {_need(gpus)}; the largest group each pool takes now: {now}")


def _requirement_holds(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = str(req.get("key") or ""), str(req.get("operator") or "")
    values = [str(v) for v in req.get("values") or []]
    have = labels.get(key)
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(values) == 1:
        try:
            return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
        except ValueError:
            return False
    return False


def node_allows(pod: Mapping[str, Any], node: str, labels: Mapping[str, str]) -> bool:
    """Whether the pod's required node selection (nodeSelector, required node affinity: terms ORed,
    expressions ANDed, `matchFields` on `metadata.name`) lets it onto the node `node` with `labels`."""
    spec = pod.get("spec") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(_REQUIRED)) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": node}
    return any(
        all(_requirement_holds(e, labels) for e in t.get("matchExpressions") or [])
        and all(_requirement_holds(e, fields) for e in t.get("matchFields") or [])
        for t in terms
    )
