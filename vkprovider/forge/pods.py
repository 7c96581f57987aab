"""Pod forge: a consumer's local pod <-> its remote twin on a provider, as plain API dicts.

Owns: what a remote twin pod looks like (the shared twin metadata of `forge.meta` plus the origin
node, and the spec with everything that only makes sense on the consumer removed), the status patch
that mirrors the twin's status onto the local pod, the terminal status reported when a pod is
deleted, which ConfigMaps and Secrets a pod needs (their copies are `forge.reflection`'s), and
which of the names a pod uses to address other objects are no valid Kubernetes names
(`invalid_names`: such a pod is refused before anything is read or written for it).

Invariants: a remote twin always carries the origin labels (consumer ClusterID, local UID, and for
pods the virtual node); nothing bound to the consumer cluster (service-account names, the
service-account tokens the consumer's kubelet would mount, service-account-token Secrets, priority
classes, custom schedulers, node names, virtual-node-only scheduling terms) reaches the provider;
GPU scheduling intent (requests/limits, GPU product selectors, GPU taint tolerations) always does;
a status patch never touches `qosClass` or `nominatedNodeName`; the twin always runs with
`automountServiceAccountToken: false` (the provider never gives it a token of its own).

Identity: `remote_pod(local, target, identity)` with a `tokens.PodIdentity` mounts the pod's
projected token volumes from the consumer-issued token Secret of that identity at the same paths and
points every container at the consumer's API server (see `vkprovider.forge.tokens`); without one the
projected service-account token volumes (and their mounts) are dropped and the twin has no identity.

Does not: talk to any API server, decide when to create/update/delete, translate IPs itself (the
caller hands in `to_local_ip`, which may refuse an address), request tokens (vkprovider.remote.tokens
does), or test ownership (`forge.meta.owned_by`).

Pure: no I/O, no client imports; inputs are the dicts the API server returns and are never mutated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import (
    ORIGIN_NODE_LABEL,
    VIRTUAL_NODE_TAINT_KEY,
    VIRTUAL_NODE_TYPE_LABELS,
)
from vkprovider.forge import tokens
from vkprovider.forge.meta import GPUFED_PREFIX, Target, is_dns_subdomain, origin_labels, twin_metadata

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Name prefix of the projected service-account volume the ServiceAccount admission plugin adds.
SA_VOLUME_PREFIX = "kube-api-access-"
#: Tolerations the DefaultTolerationSeconds admission plugin adds (the provider's adds its own).
DEFAULT_TOLERATION_KEYS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
DEFAULT_TOLERATION_SECONDS = 300
#: The only field a nodeSelectorTerm's matchFields may use; it names consumer nodes.
NODE_NAME_FIELD = "metadata.name"
KILLED_EXIT_CODE = 137
#: Reason of the Ready/ContainersReady conditions of a pod being deleted.
DELETED_REASON = "PodDeleted"
#: strategic-merge directive that replaces a merge-keyed list instead of merging into it.
_REPLACE = {"$patch": "replace"}


@dataclass(frozen=True, order=True)
class Reference:
    """A ConfigMap or Secret a pod needs in its namespace."""

    kind: str
    name: str
    optional: bool


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Whether the pod reached a phase it never leaves."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


# ---------------------------------------------------------------- pod spec


def _is_token_volume(volume: Mapping[str, Any]) -> bool:
    """The projected service-account token volume(s): bound to the consumer's API server."""
    if str(volume.get("name", "")).startswith(SA_VOLUME_PREFIX):
        return True
    sources = (volume.get("projected") or {}).get("sources") or []
    return any("serviceAccountToken" in source for source in sources)


def _virtual_only_key(key: str) -> bool:
    """A node label only virtual nodes carry: satisfied by the virtual node, absent on provider nodes."""
    return key.startswith(GPUFED_PREFIX) or key in VIRTUAL_NODE_TYPE_LABELS or key == HOSTNAME_LABEL


def _filter_term(term: Mapping[str, Any]) -> dict[str, Any]:
    """A nodeSelectorTerm without its virtual-node-only requirements (may come back empty)."""
    out = {k: v for k, v in term.items() if k not in ("matchExpressions", "matchFields")}
    expressions = [e for e in term.get("matchExpressions") or [] if not _virtual_only_key(str(e.get("key", "")))]
    # matchFields can only name nodes (metadata.name), and node names are the consumer's.
    fields = [f for f in term.get("matchFields") or [] if f.get("key") != NODE_NAME_FIELD]
    if expressions:
        out["matchExpressions"] = expressions
    if fields:
        out["matchFields"] = fields
    return out


def _node_affinity(affinity: dict[str, Any]) -> dict[str, Any]:
    required_key = "requiredDuringSchedulingIgnoredDuringExecution"
    preferred_key = "preferredDuringSchedulingIgnoredDuringExecution"
    out = dict(affinity)
    required = affinity.get(required_key)
    if required is not None:
        terms = required.get("nodeSelectorTerms") or []
        filtered = [_filter_term(t) for t in terms]
        # Terms are ORed, and an EMPTY term matches no node at all. A term that became empty was
        # made only of virtual-node requirements, i.e. the virtual node itself satisfied the whole
        # OR: remotely there is nothing left to require. (A term that was empty to begin with stays:
        # it did not become satisfiable by being filtered.)
        if any(f == {} and t != {} for t, f in zip(terms, filtered, strict=True)):
            del out[required_key]
        else:
            out[required_key] = {**required, "nodeSelectorTerms": filtered}
    preferred = affinity.get(preferred_key)
    if preferred is not None:
        kept = []
        for item in preferred:
            preference = _filter_term(item.get("preference") or {})
            # An empty preference only adds a constant weight to every node: drop it.
            if preference:
                kept.append({**item, "preference": preference})
        if kept:
            out[preferred_key] = kept
        else:
            del out[preferred_key]
    return out


def _is_default_toleration(toleration: Mapping[str, Any]) -> bool:
    # Only the exact shape the admission plugin adds; a user-tuned not-ready toleration is intent.
    return (
        toleration.get("key") in DEFAULT_TOLERATION_KEYS
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") == "NoExecute"
        and toleration.get("tolerationSeconds") == DEFAULT_TOLERATION_SECONDS
    )


def remote_scheduling(pod: Mapping[str, Any]) -> dict[str, Any]:
    """`pod` with the node selection its twin gets: what only virtual nodes satisfy (the virtual-node
    type, gpufed's labels, a hostname pin such as a placed group's) left out, so a fit check against
    the provider's nodes asks what the twin will ask."""
    spec = dict(pod.get("spec") or {})
    _scheduling(spec)
    return {**pod, "spec": spec}


def _scheduling(spec: dict[str, Any]) -> None:
    selector = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if not _virtual_only_key(k)}
    # Virtual-node keys were satisfied by the virtual node; provider nodes do not carry them, so
    # keeping them would leave the twin Pending forever. GPU keys (nvidia.com/gpu.product, ...) stay:
    # they pick the product on the provider.
    if selector:
        spec["nodeSelector"] = selector
    else:
        spec.pop("nodeSelector", None)

    affinity = spec.get("affinity")
    if affinity is not None:
        affinity = dict(affinity)
        if "nodeAffinity" in affinity:
            node_affinity = _node_affinity(affinity["nodeAffinity"])
            if node_affinity:
                affinity["nodeAffinity"] = node_affinity
            else:
                del affinity["nodeAffinity"]
        if affinity:
            spec["affinity"] = affinity
        else:
            del spec["affinity"]

    tolerations = [
        t
        for t in spec.get("tolerations") or []
        # The virtual node's taint does not exist remotely; the default not-ready/unreachable
        # tolerations are re-added by the provider's admission with the provider's own defaults.
        # Everything else stays: GPU taints on provider nodes must still be tolerated.
        if t.get("key") != VIRTUAL_NODE_TAINT_KEY and not _is_default_toleration(t)
    ]
    if tolerations:
        spec["tolerations"] = tolerations
    else:
        spec.pop("tolerations", None)


def _remote_spec(local_spec: Mapping[str, Any], identity: tokens.PodIdentity | None) -> dict[str, Any]:
    spec = copy.deepcopy(dict(local_spec))
    # The provider's scheduler places the twin; the consumer's node name is the virtual node.
    spec.pop("nodeName", None)
    # The priority class may not exist remotely, and the Priority admission plugin rejects a pod
    # with a priority value but no (existing) class; the provider applies its own default.
    for key in ("priority", "priorityClassName", "preemptionPolicy"):
        spec.pop(key, None)
    # Custom schedulers of the consumer do not run on the provider: the twin would stay Pending.
    spec.pop("schedulerName", None)
    # Ephemeral containers can only be added through the subresource, never on create.
    spec.pop("ephemeralContainers", None)
    # The RuntimeClass admission plugin fills overhead from the class and rejects a pod whose
    # overhead differs from the provider's class: let the provider fill its own.
    spec.pop("overhead", None)
    # Readiness gates name conditions that consumer-side controllers set on the local pod; nobody
    # sets them on the twin, which would never become Ready. local_status folds them back in.
    spec.pop("readinessGates", None)
    # The consumer's service account does not exist on the provider, and the provider must not
    # mount a token of its own: with an identity the token volumes are served from the
    # consumer-issued token Secret instead, without one they are dropped (see the module docstring).
    spec.pop("serviceAccountName", None)
    spec.pop("serviceAccount", None)
    spec["automountServiceAccountToken"] = False
    kept: set[Any] = set()
    if identity is not None:
        kept = {v.get("name") for v in spec.get("volumes") or [] if tokens.is_token_projection(v)}
        tokens.rewrite_spec(spec, identity)
    dropped = {v.get("name") for v in spec.get("volumes") or [] if _is_token_volume(v)} - kept
    if dropped:
        volumes = [v for v in spec["volumes"] if v.get("name") not in dropped]
        if volumes:
            spec["volumes"] = volumes
        else:
            del spec["volumes"]
        for kind in ("containers", "initContainers"):
            for container in spec.get(kind) or []:
                mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") not in dropped]
                if mounts:
                    container["volumeMounts"] = mounts
                else:
                    container.pop("volumeMounts", None)
    _scheduling(spec)
    return spec


def _pin_product(spec: dict[str, Any], product: str) -> None:
    """Keep the twin on the pool's GPU product (the pool's capacity was counted on those nodes)."""
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), GPU_PRODUCT_LABEL: product}


def remote_pod(local: Mapping[str, Any], target: Target, identity: tokens.PodIdentity | None = None) -> dict[str, Any]:
    """The twin of `local` to create on the provider (never a `status`).

    With `identity` its projected service-account token volumes are served from the token Secret
    `identity.secret_name` and its containers reach the consumer's API server; without one they are
    dropped.
    """
    meta = local.get("metadata") or {}
    labels = {**origin_labels(meta, target), ORIGIN_NODE_LABEL: target.node}
    spec = _remote_spec(local.get("spec") or {}, identity)
    if target.gpu_product:
        _pin_product(spec, target.gpu_product)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": twin_metadata(local, target, labels),
        "spec": spec,
    }


def origin_node(twin: Mapping[str, Any], default: str) -> str:
    """The pool node a twin belongs to (twins from before pools carry none: the default node)."""
    return str(((twin.get("metadata") or {}).get("labels") or {}).get(ORIGIN_NODE_LABEL) or default)


def unplaced(twin: Mapping[str, Any]) -> bool:
    """Whether the provider has not placed the twin yet (Pending, on no node)."""
    return (twin.get("status") or {}).get("phase", "Pending") == "Pending" and not (twin.get("spec") or {}).get(
        "nodeName"
    )


# ---------------------------------------------------------------- status


def _readiness_gate_problem(local: Mapping[str, Any]) -> str | None:
    """Why the local pod's readiness gates are not all True (None when they are)."""
    conditions = {c.get("type"): c for c in (local.get("status") or {}).get("conditions") or []}
    for gate in (local.get("spec") or {}).get("readinessGates") or []:
        kind = gate.get("conditionType")
        condition = conditions.get(kind)
        if condition is None:
            return f'corresponding condition of pod readiness gate "{kind}" does not exist.'
        if condition.get("status") != "True":
            return f'the status of pod readiness gate "{kind}" is not "True", but {condition.get("status")}'
    return None


def local_status(
    remote: Mapping[str, Any],
    local: Mapping[str, Any],
    *,
    host_ip: str,
    to_local_ip: Callable[[str], str | None] = lambda ip: ip,
) -> dict[str, Any]:
    """Body of a strategic-merge patch of the local pod's `status` subresource mirroring `remote`.

    podIPs/hostIPs are merge-keyed lists in the API: they carry a `$patch: replace` element so that
    a new remote IP replaces the old one (merging would keep both and fail validation). Conditions
    merge by type, so conditions only the consumer sets (readiness gates, DisruptionTarget) stay.
    `qosClass` and `nominatedNodeName` are never touched (the API server owns the first, the
    consumer's scheduler the second). An address `to_local_ip` maps to None is refused: it is left
    out, and without any address the local pod has no podIP.
    """
    rstatus = remote.get("status") or {}
    status: dict[str, Any] = {
        "phase": rstatus.get("phase"),
        "reason": rstatus.get("reason"),
        "message": rstatus.get("message"),
    }
    conditions = copy.deepcopy(list(rstatus.get("conditions") or []))
    problem = _readiness_gate_problem(local)
    if problem is not None:
        # What the kubelet does: Ready also needs every readiness gate condition True locally.
        for condition in conditions:
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                condition.update(status="False", reason="ReadinessGatesNotReady", message=problem)
    if conditions:
        status["conditions"] = conditions
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in rstatus:
            status[key] = _exclusive_states(rstatus[key])
    if rstatus.get("startTime"):
        status["startTime"] = rstatus["startTime"]
    ips = [ip for ip in (to_local_ip(str(remote_ip)) for remote_ip in remote_pod_ips(remote)) if ip]
    status["podIP"] = ips[0] if ips else None
    status["podIPs"] = [_REPLACE, *({"ip": ip} for ip in ips)] if ips else None
    status["hostIP"] = host_ip or None
    status["hostIPs"] = [_REPLACE, {"ip": host_ip}] if host_ip else None
    return {"status": status}


def remote_pod_ips(remote: Mapping[str, Any]) -> list[str]:
    """The addresses a twin reports in its status (`podIPs`, else `podIP`), as the provider wrote them."""
    rstatus = remote.get("status") or {}
    ips = [str(item["ip"]) for item in rstatus.get("podIPs") or [] if isinstance(item, Mapping) and item.get("ip")]
    if not ips and rstatus.get("podIP"):
        ips = [str(rstatus["podIP"])]
    return ips


CONTAINER_STATES = ("waiting", "running", "terminated")


def _exclusive_states(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Container statuses whose `state`/`lastState` name the states they are NOT in as null.

    A strategic merge merges these structs key by key: without the nulls a container that went
    from waiting to running would show both states (and a deleted one running and terminated).
    """
    out = []
    for entry in entries:
        e = copy.deepcopy(dict(entry))
        for key in ("state", "lastState"):
            if key in e and isinstance(e[key], Mapping):
                e[key] = {k: e[key].get(k) for k in CONTAINER_STATES}
        out.append(e)
    return out


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _without_directives(items: Iterable[Any]) -> list[Any]:
    return [_strip_nulls(i) for i in items if not (isinstance(i, Mapping) and "$patch" in i)]


def _condition_differs(patch: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    if current is None:
        return True
    # lastProbeTime changes on every probe without meaning anything to a reader.
    return any(
        value != current.get(key) for key, value in patch.items() if key != "lastProbeTime" and value is not None
    )


def status_differs(patch: Mapping[str, Any], local: Mapping[str, Any]) -> bool:
    """Whether applying the status `patch` to `local` would change anything that matters."""
    current = local.get("status") or {}
    for key, value in (patch.get("status") or {}).items():
        if key == "conditions":
            by_type = {c.get("type"): c for c in current.get("conditions") or []}
            if any(_condition_differs(c, by_type.get(c.get("type"))) for c in value):
                return True
        elif isinstance(value, list):
            if _without_directives(value) != (current.get(key) or []):
                return True
        elif value != current.get(key):
            # None (delete) against an absent field is no change: .get() gives None for both.
            return True
    return False


def terminated_status(
    local: Mapping[str, Any], remote: Mapping[str, Any] | None, *, now: str, message: str
) -> dict[str, Any]:
    """Status patch reporting every container of a deleted pod as terminated (phase unchanged).

    A container already terminated locally keeps its status; else the remote's terminated state
    is used when the remote reported one, else it is reported killed (137) at `now`. Containers
    without any status yet (a pending pod) get a full entry too, since the list is replaced as a whole.
    """
    spec = local.get("spec") or {}
    lstatus = local.get("status") or {}
    rstatus = (remote or {}).get("status") or {}
    status: dict[str, Any] = {}
    for spec_key, status_key in (("containers", "containerStatuses"), ("initContainers", "initContainerStatuses")):
        containers = spec.get(spec_key) or []
        if not containers and status_key not in lstatus:
            continue
        local_by_name = {s.get("name"): s for s in lstatus.get(status_key) or []}
        remote_by_name = {s.get("name"): s for s in rstatus.get(status_key) or []}
        entries = []
        for container in containers:
            name = container.get("name")
            mine = local_by_name.get(name)
            theirs = remote_by_name.get(name)
            if mine is not None and "terminated" in (mine.get("state") or {}):
                entries.append(copy.deepcopy(mine))
                continue
            entry = copy.deepcopy(
                mine or theirs or {"name": name, "image": container.get("image", ""), "imageID": "", "restartCount": 0}
            )
            remote_terminated = ((theirs or {}).get("state") or {}).get("terminated")
            if remote_terminated is not None:
                terminated = copy.deepcopy(remote_terminated)
            else:
                terminated = {"exitCode": KILLED_EXIT_CODE, "reason": "Killed", "message": message}
                started = _started_at(mine) or _started_at(theirs)
                if started:
                    terminated["startedAt"] = started
                terminated["finishedAt"] = now
            entry.update(state={"terminated": terminated}, ready=False, started=False)
            entries.append(entry)
        status[status_key] = _exclusive_states(entries)
    current = {c.get("type"): c for c in lstatus.get("conditions") or []}
    conditions = []
    for kind in ("Ready", "ContainersReady"):
        before = current.get(kind) or {}
        # lastTransitionTime moves only when the status does (as the kubelet does it).
        since = before.get("lastTransitionTime") if before.get("status") == "False" else now
        conditions.append(
            {
                "type": kind,
                "status": "False",
                "reason": DELETED_REASON,
                "lastProbeTime": None,
                "lastTransitionTime": since,
            }
        )
    status["conditions"] = conditions
    return {"status": status}


#: Condition on a pod failed back to the consumer: Jobs can ignore such failures with a
#: podFailurePolicy rule `onPodConditions: [{type: DisruptionTarget}]`, `action: Ignore`.
DISRUPTION_TARGET = "DisruptionTarget"
FAIL_BACK_CONDITION_REASON = "FailedBackByVirtualNode"


def failed_back_status(local: Mapping[str, Any], *, now: str, reason: str, message: str) -> dict[str, Any]:
    """Status patch failing a pod that cannot run where it was bound (phase Failed, `reason`,
    containers terminated, a DisruptionTarget condition), so its controller creates a replacement
    that the scheduler may place elsewhere."""
    patch = terminated_status(local, None, now=now, message=message)
    status = patch["status"]
    status.update(phase="Failed", reason=reason, message=message)
    status["conditions"] = [
        *status.get("conditions", []),
        {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": FAIL_BACK_CONDITION_REASON,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now,
        },
    ]
    return patch


def _started_at(container_status: Mapping[str, Any] | None) -> str | None:
    running = ((container_status or {}).get("state") or {}).get("running") or {}
    started = running.get("startedAt")
    return str(started) if started else None


# ---------------------------------------------------------------- ConfigMaps and Secrets


def _env_references(container: Mapping[str, Any]) -> Iterable[Reference]:
    for env in container.get("env") or []:
        source = env.get("valueFrom") or {}
        for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
            ref = source.get(field)
            if ref and ref.get("name"):
                yield Reference(kind, ref["name"], bool(ref.get("optional", False)))
    for env_from in container.get("envFrom") or []:
        for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            ref = env_from.get(field)
            if ref and ref.get("name"):
                yield Reference(kind, ref["name"], bool(ref.get("optional", False)))


def _volume_references(volume: Mapping[str, Any]) -> Iterable[Reference]:
    # Token volumes need nothing copied: remote_pod drops them, or serves them from the token Secret
    # (kube-root-ca.crt there is the consumer's CA, which the provider's namesake is not).
    if _is_token_volume(volume):
        return
    config_map = volume.get("configMap")
    if config_map and config_map.get("name"):
        yield Reference("ConfigMap", config_map["name"], bool(config_map.get("optional", False)))
    secret = volume.get("secret")
    if secret and secret.get("secretName"):
        yield Reference("Secret", secret["secretName"], bool(secret.get("optional", False)))
    for source in (volume.get("projected") or {}).get("sources") or []:
        for field, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
            ref = source.get(field)
            if ref and ref.get("name"):
                yield Reference(kind, ref["name"], bool(ref.get("optional", False)))


def invalid_names(pod: Mapping[str, Any]) -> list[str]:
    """What in `pod` names an object by a name Kubernetes would never give one, e.g. an
    `imagePullSecrets` entry `../../gpufed/secrets/x` (sorted `<kind> <name>`; empty: all valid).

    Checked: the ConfigMaps and Secrets it references and its ServiceAccount (RFC 1123 subdomains),
    the names the virtual kubelet reads or requests tokens for on the pod's behalf.
    """
    spec = pod.get("spec") or {}
    found = {f"{ref.kind} {ref.name!r}" for ref in _all_references(spec) if not is_dns_subdomain(str(ref.name))}
    for field in ("serviceAccountName", "serviceAccount"):
        account = spec.get(field)
        if account and not is_dns_subdomain(str(account)):
            found.add(f"ServiceAccount {account!r}")
    return sorted(found)


def _all_references(spec: Mapping[str, Any]) -> list[Reference]:
    found: list[Reference] = []
    for volume in spec.get("volumes") or []:
        found.extend(_volume_references(volume))
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            found.extend(_env_references(container))
    # A pull secret the provider cannot use is not fatal: the image may be public or pre-pulled.
    found.extend(Reference("Secret", s["name"], True) for s in spec.get("imagePullSecrets") or [] if s.get("name"))
    return found


def references(pod: Mapping[str, Any]) -> list[Reference]:
    """ConfigMaps and Secrets `pod` needs, sorted; a name needed both optionally and not is required."""
    found = _all_references(pod.get("spec") or {})
    optional: dict[tuple[str, str], bool] = {}
    for ref in found:
        key = (ref.kind, ref.name)
        optional[key] = optional.get(key, True) and ref.optional
    return sorted(Reference(kind, name, opt) for (kind, name), opt in optional.items())
