"""Gang placement of pod groups (pure): which pods run together, and which GPU pool holds all of them.

Owns:
- `group_of`: the group a pod belongs to, from what the consumer's own API server says about it — a
  Job's pods when the Job runs more than one at once (`min(parallelism, completions)` of them), a
  JobSet's pods (`jobset_size`), or pods labelled `gpufed.io/pod-group` (size in
  `gpufed.io/pod-group-size`) or with Kueue's pod-group label and total count. A pod, Job or JobSet
  carrying Kueue's queue label is Kueue's: Kueue admits the whole workload to one flavor, so gpufed's
  gang path steps aside (None);
- `jobset_owner`: the JobSet a pod's labels name (its Job's pods carry them), checked as untrusted
  text; `jobset_size`: the pods of a JobSet that start together — every replicatedJob's
  `replicas × min(parallelism, completions)` when all start at once; a JobSet whose replicatedJobs
  start one after another (`startupPolicy` InOrder, or `dependsOn`) is one group per replicatedJob that
  waits for another (the first ones together), since a later one's pods are created only once an
  earlier one runs, and holding them all would wait for ever;
- `Offer`: one pool virtual node as its figures describe it (provider, GPU product, the free GPUs per
  provider node after the pods in flight, the grant's headroom);
- `largest_group`: how many of the group's pods a pool takes now (packed largest first onto the
  fullest node that still takes each, as the scheduler would, within the headroom); `ever`: how many
  it could take with every GPU of the product free and the whole grant unused;
- `node_allows`: whether a pod's required node selection lets it onto a pool's node;
- `place`: the pool for a group — one that holds every pod, the one that leaves the fewest GPUs of
  the grant unused after it (best fit, ties by name) — or why none does now (`Decision.reason`, with
  the largest group each pool takes now), and whether none ever could (`never`);
- `reservations`: which waiting groups have GPUs held back for them, and on which pool — the
  longest-waiting group first, each on the pool it may use that could ever hold it and takes the
  most of it now, one group per pool (a group that waits for whole provider nodes is not starved
  by pods that take each GPU as it frees).

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
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    JOBSET_RESTART_LABEL,
    JOBSET_UID_LABEL,
    KUEUE_POD_GROUP_COUNT_ANNOTATION,
    KUEUE_POD_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
)
from gpufed.kube.selectors import terms_select
from gpupool.capacity import Bucket, best_fit

#: The most pods one group may have (a larger size is refused as invalid input).
MAX_GROUP = 1000
#: The kind a JobSet read from the API server carries (`group_of` tells it from a Job by it).
JOBSET_KIND = "JobSet"
#: Longest JobSet or replicatedJob name taken from a pod's labels (a label value's limit).
_MAX_NAME = 63
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


@dataclass(frozen=True)
class JobSetRef:
    """What a JobSet's pod says of its JobSet: its name and UID, its replicatedJob, its restart attempt."""

    name: str
    uid: str
    replicated_job: str
    attempt: int


def _label_text(labels: Mapping[str, str], key: str, *, required: bool = True) -> str:
    value = labels.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME:
        raise GroupError(f"label {key} is {str(value)[:80]!r}: want a name of 1 to {_MAX_NAME} characters")
    return value


def jobset_owner(pod: Mapping[str, Any]) -> JobSetRef | None:
    """The JobSet `pod` belongs to, from the labels JobSet's controller puts on its pods (None: no
    JobSet label). Raises `GroupError` when the labels are not what that controller writes."""
    labels = _labels(pod)
    if JOBSET_NAME_LABEL not in labels:
        return None
    name = _label_text(labels, JOBSET_NAME_LABEL)
    uid = _label_text(labels, JOBSET_UID_LABEL, required=False)
    rjob = _label_text(labels, JOBSET_REPLICATED_JOB_LABEL)
    raw = labels.get(JOBSET_RESTART_LABEL, "0")
    if not isinstance(raw, str) or not raw.isdigit() or len(raw) > 9:
        raise GroupError(f"label {JOBSET_RESTART_LABEL} is {str(raw)[:80]!r}: want a restart count")
    return JobSetRef(name, uid, rjob, int(raw))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GroupError(f"{what} is {str(value)[:80]!r}: want a whole number")
    return value


def _replicated_pods(rjob: Mapping[str, Any]) -> int:
    """Pods a replicatedJob runs at once: its replicas × its Job's `min(parallelism, completions)`."""
    name = rjob.get("name")
    spec = _mapping(_mapping(rjob.get("template")).get("spec"))
    replicas = _count(rjob.get("replicas"), f"replicatedJob {name}: replicas", 1)
    parallelism = _count(spec.get("parallelism"), f"replicatedJob {name}: parallelism", 1)
    completions = spec.get("completions")
    if completions is not None:
        parallelism = min(parallelism, _count(completions, f"replicatedJob {name}: completions", 1))
    return replicas * parallelism


def jobset_size(jobset: Mapping[str, Any], replicated_job: str) -> tuple[str, int]:
    """The part of `jobset` the pods of `replicated_job` start with — `""` for the whole JobSet, else
    the name of the part's first replicatedJob — and how many pods that part runs at once. Raises
    `GroupError` for a replicatedJob the JobSet does not have, or a size beyond MAX_GROUP."""
    spec = _mapping(jobset.get("spec"))
    rjobs = [r for r in spec.get("replicatedJobs") or [] if isinstance(r, Mapping)]
    names = [str(r.get("name") or "") for r in rjobs]
    if replicated_job not in names:
        raise GroupError(f"the JobSet has no replicatedJob {replicated_job[:_MAX_NAME]!r}")
    startup = _mapping(spec.get("startupPolicy"))
    # The replicatedJobs created at once: the first alone when they start in order, else those that
    # wait for no other.
    if startup.get("startupPolicyOrder") == "InOrder":
        together = rjobs[:1]
    else:
        together = [r for r in rjobs if not r.get("dependsOn")]
    own = rjobs[names.index(replicated_job)]
    if len(together) == len(rjobs):
        part, members = "", rjobs
    elif any(r is own for r in together):
        part, members = names[rjobs.index(together[0])], together
    else:
        part, members = replicated_job, [own]
    size = sum(_replicated_pods(r) for r in members)
    if size > MAX_GROUP:
        raise GroupError(f"the JobSet runs {size} pods at once: a group may have at most {MAX_GROUP}")
    return part, size


def group_of(pod: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> Group | None:
    """The group `pod` belongs to (None: it runs on its own, or Kueue admits it). `job`: the workload
    that controls it, when there is one — its Job (`job_owner`), or for a JobSet's pod the JobSet
    (`jobset_owner`; told apart by `kind`). Raises `GroupError` for a group label with a size that is
    no whole number of pods in 1..MAX_GROUP, or a JobSet's pod whose labels or JobSet are not what
    JobSet's controller writes."""
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
    if job is not None and job.get("kind") == JOBSET_KIND:
        ref = jobset_owner(pod)
        meta = job.get("metadata") or {}
        if ref is None or ref.name != meta.get("name"):
            raise GroupError("the pod's JobSet labels do not name the JobSet it was judged with")
        part, size = jobset_size(job, ref.replicated_job)
        uid = str(meta.get("uid") or "")[:8]
        name = "-".join(x for x in ("jobset", ref.name, uid, part, f"r{ref.attempt}") if x)
        return Group(namespace, name, size) if size > 1 else None
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
    #: The GPUs the grant's slices ask for: what the grant grows back to when the provider's own load
    #: ends (the grant follows the provider's live capacity).
    requested: int = 0


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
    """Whether the pool could hold all the pods at best: the grant as asked for and the product's GPUs
    all free. Per provider node it cannot be known without the node sizes, so only the totals count."""
    need = sum(gpus)
    if need > max(offer.granted, offer.requested):
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
    return terms_select(terms, labels, node)


@dataclass(frozen=True)
class Waiting:
    """A complete group that no pool holds now."""

    #: (namespace, group label)
    key: tuple[str, str]
    #: When its first pod was created (RFC 3339: sorts in time order).
    since: str
    #: GPUs per pod.
    gpus: tuple[int, ...]
    #: The pool nodes every one of its pods may go to.
    pools: frozenset[str]


def reservations(waiting: Sequence[Waiting], offers: Sequence[Offer]) -> dict[tuple[str, str], str]:
    """The pool each reserving group has GPUs held back on (see the module doc)."""
    by_node = {o.node: o for o in offers}
    taken: set[str] = set()
    out: dict[tuple[str, str], str] = {}
    for w in sorted(waiting, key=lambda w: (w.since, w.key)):
        candidates = [
            by_node[n] for n in sorted(w.pools) if n in by_node and n not in taken and ever(by_node[n], w.gpus)
        ]
        if not candidates:
            continue
        best = max(
            candidates,
            key=lambda o: (largest_group(o, w.gpus), sum(b.free_gpus * b.nodes for b in o.free_nodes or ())),
        )
        taken.add(best.node)
        out[w.key] = best.node
    return out
