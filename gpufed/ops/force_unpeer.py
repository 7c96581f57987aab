"""`gpufed unpeer --force`: forgetting, on the one cluster that is left, a peer that is gone for good.

Owns: `ForceRequest` (which cluster this is, the side it plays in the peering and the peer's
ClusterID, all named by the operator: nothing is inferred from a peer that cannot answer), the
planning of what that side holds of the peering (`plan_consumer`, `plan_provider`: pure, from
what was listed), running a plan (`force_unpeer`), and `unreachable_hint`, which a plain `gpufed
unpeer` uses to refuse, when one side does not answer, with what `--force` would delete.

On the consumer (the provider is gone): the fabric's objects for that provider (the Gateway first,
so its agent tears the tunnel down and exits), its virtual nodes cordoned, every pod still bound to
them failed back here (phase Failed, reason `ProviderGone`, a DisruptionTarget condition and a Warning Event, so
that a Job or ReplicaSet replaces it; a pod already being deleted is deleted at once, nobody can
stop its twin), then its ForeignCluster (its virtual kubelet sees that and exits, the controller
revokes the credentials' readers), ResourceSlices, virtual nodes, credential Secrets and Roles.
On the provider (the consumer is gone): the fabric's objects for that consumer, its Tenant and
ForeignCluster, its CSRs and its tenant and twin namespaces (with the twins, quotas and RoleBindings
in them).

Claims: a plain unpeer refuses while claims keep data on the provider, and so does this one, unless
`--delete-volumes`: on the consumer, the data sits on a provider that is out of reach, so nothing
can be copied out and the claims can only be deleted here; on the provider, deleting the twin
namespaces deletes the consumer's data, which nobody reads through gpufed any more.

Idempotent: a second run finds nothing and says so. Every listing happens before anything is
deleted, so a refusal leaves everything in place.

Does not: contact the peer (it is gone; if it comes back, its operator runs `--force` there too),
or check flags (the CLI does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    PROVIDER_LABEL,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
)
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError, api_client, require_kubeconfig
from gpufed.kube.times import rfc3339
from netfabric import ops as network_ops
from peering.ops import volumes
from peering.ops.peer import ClusterRef, PeerError, Reporter, connect_one, identity
from vkprovider.forge.pods import failed_back_status

Side = Literal["consumer", "provider"]
#: Status reason (and Event reason) of a pod failed back because its provider was forgotten.
PROVIDER_GONE = "ProviderGone"
COMPONENT = "gpufed-unpeer"
POLL_S = 0.5
#: Seconds each side gets to answer when a plain unpeer checks whether both are there.
PROBE_TIMEOUT_S = 10
_TERMINAL = frozenset({"Succeeded", "Failed"})
_RBAC = "rbac.authorization.k8s.io/v1"
_CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


@dataclass(frozen=True)
class ForceRequest:
    #: The cluster that is left (this command's --kubeconfig/--context).
    local: ClusterRef
    #: The part the local cluster plays in the peering: "consumer" forgets a provider, "provider" a consumer.
    side: Side
    #: The ClusterID of the peer that is gone.
    peer: ClusterID
    #: Also delete claims whose data lives on the provider (consumer) or in the twin namespaces (provider).
    delete_volumes: bool = False
    #: Seconds the whole operation may take.
    timeout_s: float = 120.0


@dataclass(frozen=True)
class Deletion:
    path: str
    what: str
    propagation: str = "Background"


@dataclass(frozen=True)
class FailBack:
    """A pod bound to one of the gone provider's virtual nodes."""

    pod: Mapping[str, Any]

    @property
    def what(self) -> str:
        meta = self.pod["metadata"]
        return f"pod {meta['namespace']}/{meta['name']}"

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))


@dataclass(frozen=True)
class Plan:
    """What the local side holds of a peering with a gone peer, in the order it is removed."""

    side: Side
    local_id: ClusterID
    peer: ClusterID
    #: The fabric's objects for the peer (Gateway first).
    fabric: tuple[Deletion, ...] = ()
    #: Pods bound to the peer's virtual nodes that are not finished yet (consumer only).
    pods: tuple[FailBack, ...] = ()
    #: Claims whose data the deletions take (consumer: claims bound on the provider; provider:
    #: claims in the consumer's twin namespaces), as "namespace/name (size)".
    claims: tuple[str, ...] = ()
    #: Claims to delete first (consumer, with --delete-volumes).
    claim_deletions: tuple[Deletion, ...] = ()
    #: Everything else, peering objects first.
    deletions: tuple[Deletion, ...] = ()
    #: Set when the named side is wrong for this peer: nothing may be deleted.
    wrong_side: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not (self.fabric or self.pods or self.claim_deletions or self.deletions or self.claims)

    def describe(self) -> list[str]:
        """One line per thing the plan removes (for progress and for a refusal)."""
        lines = [d.what for d in self.fabric]
        lines += [f"{p.what} (failed back: {PROVIDER_GONE})" for p in self.pods if not p.deleting]
        lines += [f"{p.what} (being deleted: deleted at once)" for p in self.pods if p.deleting]
        lines += [d.what for d in self.claim_deletions]
        lines += [d.what for d in self.deletions]
        return lines


@dataclass(frozen=True)
class ConsumerView:
    """What the consumer holds of its peering with one provider, as listed."""

    foreign_cluster: Mapping[str, Any] | None
    slices: Sequence[Mapping[str, Any]]
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    #: Secrets, Roles and RoleBindings of `gpufed` labelled with the provider.
    credentials: Sequence[tuple[str, Mapping[str, Any]]]
    #: (path, kind) of the fabric objects that exist.
    fabric: Sequence[tuple[str, str]]
    #: The consumer's virtual PersistentVolumes of this provider.
    volumes: Sequence[Mapping[str, Any]]
    #: Tenant of the same ClusterID here (the peer is a consumer of this cluster, too).
    tenant: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ProviderView:
    """What the provider holds of its peering with one consumer, as listed."""

    tenant: Mapping[str, Any] | None
    foreign_cluster: Mapping[str, Any] | None
    namespaces: Sequence[Mapping[str, Any]]
    csrs: Sequence[Mapping[str, Any]]
    fabric: Sequence[tuple[str, str]]
    #: PersistentVolumeClaims in the consumer's namespaces.
    claims: Sequence[Mapping[str, Any]]


def _roles(fc: Mapping[str, Any] | None) -> list[str]:
    return list(((fc or {}).get("spec") or {}).get("roles") or [])


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def plan_consumer(local_id: ClusterID, peer: ClusterID, view: ConsumerView, *, delete_volumes: bool) -> Plan:
    """What forgetting provider `peer` removes from consumer `local_id` (pure)."""
    fc = view.foreign_cluster
    if fc is not None and "Provider" not in _roles(fc):
        return Plan(
            "consumer",
            local_id,
            peer,
            wrong_side=f"{peer} is not a provider of {local_id} (its ForeignCluster's roles: "
            f"{', '.join(_roles(fc)) or 'none'}); if {local_id} provides for {peer}, run with --consumer {peer}",
        )
    fabric = tuple(Deletion(p, f"{kind} {peer}") for p, kind in view.fabric)
    pods = tuple(FailBack(p) for p in view.pods if ((p.get("status") or {}).get("phase")) not in _TERMINAL)
    claims = volumes.claims_of([dict(v) for v in view.volumes])
    claim_deletions: tuple[Deletion, ...] = ()
    deletions: list[Deletion] = []
    if fc is not None:
        deletions.append(Deletion(rest.path(API_VERSION, "foreignclusters", peer), f"ForeignCluster {peer}"))
    for s in view.slices:
        deletions.append(
            Deletion(
                rest.path(API_VERSION, "resourceslices", _name(s), namespace=SYSTEM_NAMESPACE),
                f"ResourceSlice.gpufed.io {_name(s)}",
            )
        )
    for n in view.nodes:
        deletions.append(Deletion(rest.path("v1", "nodes", _name(n)), f"virtual node {_name(n)}"))
    for path_, obj in view.credentials:
        deletions.append(Deletion(path_, f"{obj.get('kind', 'object')} {SYSTEM_NAMESPACE}/{_name(obj)}"))
    if delete_volumes:
        claim_deletions = tuple(
            Deletion(
                rest.path("v1", "persistentvolumeclaims", c.name, namespace=c.namespace),
                f"claim {c.namespace}/{c.name} (its data on {peer} is out of reach)",
            )
            for c in claims
        )
        for v in view.volumes:
            deletions.append(Deletion(rest.path("v1", "persistentvolumes", _name(v)), f"virtual volume {_name(v)}"))
    notes: tuple[str, ...] = ()
    if fc is None and not deletions and not pods and view.tenant is not None:
        notes = (f"{peer} is a consumer of {local_id}, not a provider: did you mean --consumer {peer}?",)
    return Plan(
        "consumer",
        local_id,
        peer,
        fabric=fabric,
        pods=pods,
        claims=tuple(f"{c.namespace}/{c.name} ({c.size})" for c in claims),
        claim_deletions=claim_deletions,
        deletions=tuple(deletions),
        notes=notes,
    )


def plan_provider(local_id: ClusterID, peer: ClusterID, view: ProviderView) -> Plan:
    """What forgetting consumer `peer` removes from provider `local_id` (pure)."""
    fc = view.foreign_cluster
    if fc is not None and view.tenant is None and "Consumer" not in _roles(fc):
        return Plan(
            "provider",
            local_id,
            peer,
            wrong_side=f"{peer} is not a consumer of {local_id} (its ForeignCluster's roles: "
            f"{', '.join(_roles(fc)) or 'none'}); if {local_id} consumes from {peer}, run with --provider {peer}",
        )
    deletions: list[Deletion] = []
    if view.tenant is not None:
        deletions.append(Deletion(rest.path(API_VERSION, "tenants", peer), f"Tenant {peer}"))
    if fc is not None:
        deletions.append(Deletion(rest.path(API_VERSION, "foreignclusters", peer), f"ForeignCluster {peer}"))
    for csr in view.csrs:
        deletions.append(Deletion(f"{_CSRS}/{_name(csr)}", f"CertificateSigningRequest {_name(csr)}"))
    for ns in sorted(view.namespaces, key=_name):
        deletions.append(Deletion(rest.path("v1", "namespaces", _name(ns)), f"namespace {_name(ns)}", "Foreground"))
    claims = tuple(
        sorted(
            f"{c['metadata'].get('namespace', '')}/{_name(c)} "
            f"({((c.get('spec') or {}).get('resources') or {}).get('requests', {}).get('storage', '?')})"
            for c in view.claims
        )
    )
    return Plan(
        "provider",
        local_id,
        peer,
        fabric=tuple(Deletion(p, f"{kind} {peer}") for p, kind in view.fabric),
        claims=claims,
        deletions=tuple(deletions),
    )


def refusal(plan: Plan, *, delete_volumes: bool) -> str | None:
    """Why the plan must not run (None: it may)."""
    if plan.wrong_side:
        return plan.wrong_side
    if plan.claims and not delete_volumes:
        shown = ", ".join(plan.claims[:10]) + (f", and {len(plan.claims) - 10} more" if len(plan.claims) > 10 else "")
        if plan.side == "consumer":
            return (
                f"{len(plan.claims)} claim(s) keep their data on provider {plan.peer}: {shown}. That provider is "
                "unreachable, so the data is out of reach whatever is done here: it cannot be copied out, and the "
                f"claims cannot be used again. Pass --delete-volumes to delete them with the rest of {plan.peer}'s "
                "peering (their data stays on the provider until its operator removes this consumer there)"
            )
        return (
            f"the namespaces of consumer {plan.peer} hold {len(plan.claims)} claim(s): {shown}; forgetting the "
            "consumer deletes them and their data. The consumer is gone, so nothing reads this data through gpufed "
            "any more: copy it out with kubectl first if it matters, then pass --delete-volumes"
        )
    return None


# ---- listing


async def _existing(api: Any, paths: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(p, kind) for p, kind in paths if await rest.get(api, p) is not None]


async def consumer_view(api: Any, peer: ClusterID) -> ConsumerView:
    fc = await rest.get(api, rest.path(API_VERSION, "foreignclusters", peer))
    slices = [
        s
        for s in await rest.list_items(api, rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE))
        if (s.get("spec") or {}).get("providerClusterId") == peer
    ]
    nodes = await rest.list_items(api, "/api/v1/nodes", params={"labelSelector": f"{REMOTE_CLUSTER_LABEL}={peer}"})
    pods: list[dict[str, Any]] = []
    for n in nodes:
        pods += await rest.list_items(api, "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={_name(n)}"})
    selector = {"labelSelector": f"{PROVIDER_LABEL}={peer}"}
    credentials: list[tuple[str, Mapping[str, Any]]] = []
    for api_version, plural, kind in (("v1", "secrets", "Secret"), (_RBAC, "rolebindings", "RoleBinding")):
        for obj in await rest.list_items(
            api, rest.path(api_version, plural, namespace=SYSTEM_NAMESPACE), params=selector
        ):
            credentials.append(
                (rest.path(api_version, plural, _name(obj), namespace=SYSTEM_NAMESPACE), {**obj, "kind": kind})
            )
    for obj in await rest.list_items(api, rest.path(_RBAC, "roles", namespace=SYSTEM_NAMESPACE), params=selector):
        credentials.append((rest.path(_RBAC, "roles", _name(obj), namespace=SYSTEM_NAMESPACE), {**obj, "kind": "Role"}))
    return ConsumerView(
        foreign_cluster=fc,
        slices=slices,
        nodes=nodes,
        pods=pods,
        credentials=credentials,
        fabric=await _existing(api, network_ops.side_objects(peer)),
        volumes=await volumes.read_volumes(api, peer),
        tenant=await rest.get(api, rest.path(API_VERSION, "tenants", peer)),
    )


async def provider_view(api: Any, peer: ClusterID) -> ProviderView:
    selector = {"labelSelector": f"{CONSUMER_LABEL}={peer}"}
    namespaces = await rest.list_items(api, "/api/v1/namespaces", params=selector)
    claims: list[dict[str, Any]] = []
    for ns in namespaces:
        claims += await rest.list_items(api, rest.path("v1", "persistentvolumeclaims", namespace=_name(ns)))
    return ProviderView(
        tenant=await rest.get(api, rest.path(API_VERSION, "tenants", peer)),
        foreign_cluster=await rest.get(api, rest.path(API_VERSION, "foreignclusters", peer)),
        namespaces=namespaces,
        csrs=await rest.list_items(api, _CSRS, params=selector),
        fabric=await _existing(api, network_ops.side_objects(peer)),
        claims=claims,
    )


async def _plan(api: Any, local_id: ClusterID, req: ForceRequest) -> Plan:
    if req.side == "consumer":
        view = await consumer_view(api, req.peer)
        return plan_consumer(local_id, req.peer, view, delete_volumes=req.delete_volumes)
    return plan_provider(local_id, req.peer, await provider_view(api, req.peer))


# ---- running


def gone_message(plan: Plan) -> str:
    """What a user reads on a pod failed back because its provider was forgotten."""
    return (
        f"provider {plan.peer} is gone: its peering was removed from this cluster with `gpufed unpeer --force`, "
        "so this pod's containers there can no longer be reached or stopped; a Job or ReplicaSet creates a "
        "replacement"
    )


async def _fail_back(api: Any, plan: Plan, report: Reporter) -> None:
    message = gone_message(plan)
    for fb in plan.pods:
        meta = fb.pod["metadata"]
        url = rest.path("v1", "pods", meta["name"], namespace=meta["namespace"])
        try:
            if fb.deleting:
                if await rest.delete(api, url, uid=meta["uid"], grace_period_s=0):
                    report.done(f"deleted {fb.what} (it was being deleted)")
                continue
            patch = failed_back_status(fb.pod, now=rfc3339(), reason=PROVIDER_GONE, message=message)
            await rest.strategic_patch(api, url + "/status", patch, what=f"fail back {fb.what}")
        except KubeError as e:
            if e.not_found or e.conflict or e.status == HTTPStatus.UNPROCESSABLE_ENTITY:
                continue  # deleted, replaced or finished meanwhile: nothing of this pod to fail back
            raise
        await events.emit(
            api,
            {"apiVersion": "v1", "kind": "Pod", **fb.pod},
            type_="Warning",
            reason=PROVIDER_GONE,
            message=message,
            component=COMPONENT,
        )
        report.done(f"failed back {fb.what} ({PROVIDER_GONE})")


async def _cordon(api: Any, node: Deletion) -> None:
    try:
        await rest.merge_patch(api, node.path, {"spec": {"unschedulable": True}}, what=f"cordon {node.what}")
    except KubeError as e:
        if not e.not_found:
            raise


async def _delete(api: Any, items: Sequence[Deletion], report: Reporter) -> None:
    for d in items:
        if await rest.delete(api, d.path, propagation=d.propagation, what=f"delete {d.what}"):
            report.done(f"deleted {d.what}")


async def force_unpeer(req: ForceRequest, report: Reporter) -> int:
    """Forget `req.peer` on the local cluster; the number of objects removed or failed back (0: the
    local side holds nothing of that peering). PeerError when the plan is refused (nothing changed)."""
    deadline = time.monotonic() + req.timeout_s
    gone_peer = "provider" if req.side == "consumer" else "consumer"
    report.step(f"reading what this {req.side} holds of its peering with {gone_peer} {req.peer}")
    async with connect_one(req.local) as (api, _server):
        local_id, _key = await identity(api, req.local)
        if local_id == req.peer:
            raise PeerError(f"{req.peer} is this cluster's own ClusterID: name the peer that is gone")
        plan = await _plan(api, local_id, req)
        why = refusal(plan, delete_volumes=req.delete_volumes)
        if why:
            raise PeerError(why)
        for note in plan.notes:
            report.done(note)
        if plan.empty:
            report.done(f"{local_id} holds nothing of a peering with {gone_peer} {req.peer}: nothing to remove")
            return 0
        total = len(plan.describe())
        report.done(f"{total} object(s) of {gone_peer} {req.peer} on {req.side} {local_id}")
        if plan.fabric:
            report.step("removing the network fabric's objects (the gateway agent exits)")
            await _delete(api, plan.fabric, report)
        nodes = [d for d in plan.deletions if d.what.startswith("virtual node ")]
        if nodes:
            report.step("cordoning the virtual nodes (nothing new is bound to them)")
            for d in nodes:
                await _cordon(api, d)
            plan = await _plan(api, local_id, req)  # and the pods bound before the cordon, all of them
        if plan.pods:
            report.step(f"failing back {len(plan.pods)} pod(s) bound to {req.peer}'s virtual nodes")
            await _fail_back(api, plan, report)
        if plan.claim_deletions:
            report.step("deleting the claims bound on the provider (--delete-volumes)")
            await _delete(api, plan.claim_deletions, report)
        report.step(f"removing the peering's objects on {req.side} {local_id}")
        await _delete(api, plan.deletions, report)

        report.step("waiting until nothing of the peering is left (namespaces finish terminating)")
        while True:
            again = await _plan(api, local_id, req)
            left = [*again.fabric, *again.claim_deletions, *again.deletions]
            if not left:
                break
            if time.monotonic() > deadline:
                raise PeerError(
                    f"timed out after {req.timeout_s:.0f} s with {len(left)} object(s) left: "
                    + ", ".join(d.what for d in left[:10])
                    + "; run the same command again to go on"
                )
            for d in left:  # re-created meanwhile (e.g. by a virtual kubelet not stopped yet): delete again
                await _delete_again(api, d)
            await asyncio.sleep(POLL_S)
        report.done(f"{req.peer} forgotten on {local_id}: nothing of the peering is left on this side")
        return total


async def _delete_again(api: Any, d: Deletion) -> None:
    """Delete what is still there; a 409 (a namespace already terminating) or a 404 is no news."""
    try:
        await rest.delete(api, d.path, propagation=d.propagation)
    except KubeError as e:
        if not (e.conflict or e.not_found):
            raise


# ---- a plain unpeer with one side missing


async def _answers(ref: ClusterRef) -> str | None:
    """None when the cluster's API server answers; otherwise why not."""
    require_kubeconfig(ref.kubeconfig, ref.role)
    try:
        async with api_client(ref.kubeconfig, ref.context) as api:
            await rest.request(api, "GET", "/version", request_timeout=PROBE_TIMEOUT_S)
    except KubeError as e:
        return str(e)
    return None


async def unreachable_hint(consumer: ClusterRef, provider: ClusterRef) -> None:
    """Before a plain unpeer: when exactly one side does not answer, refuse with what `--force` on the
    other side would delete. Nothing is changed here."""
    down = {"consumer": await _answers(consumer), "provider": await _answers(provider)}
    if all(down.values()):
        raise PeerError(f"neither cluster answers: consumer: {down['consumer']}; provider: {down['provider']}")
    if not any(down.values()):
        return
    gone: Side = "provider" if down["provider"] else "consumer"
    left = consumer if gone == "provider" else provider
    gone_ref = provider if gone == "provider" else consumer
    async with api_client(gone_ref.kubeconfig, gone_ref.context) as gapi:
        gone_server = str(gapi.configuration.host)
    async with connect_one(left) as (api, _server):
        local_id, _key = await identity(api, left)
        if gone == "provider":
            candidates = [
                ClusterID(_name(fc))
                for fc in await rest.list_items(api, rest.path(API_VERSION, "foreignclusters"))
                if "Provider" in _roles(fc) and (fc.get("spec") or {}).get("apiServerUrl") == gone_server
            ]
        else:
            candidates = [ClusterID(_name(t)) for t in await rest.list_items(api, rest.path(API_VERSION, "tenants"))]
        lines = [f"the {gone} API server {gone_server} does not answer ({down[gone]})."]
        flag = "--provider" if gone == "provider" else "--consumer"
        side: Side = "consumer" if gone == "provider" else "provider"
        if not candidates:
            lines.append(f"{local_id} holds no peering with it; if it is gone for good there is nothing to remove.")
        for peer in candidates[:5]:
            plan = await _plan(api, local_id, ForceRequest(left, side, peer))
            what = plan.describe()
            shown = "; ".join(what[:15]) + (f"; and {len(what) - 15} more" if len(what) > 15 else "")
            lines.append(
                f"If {peer} is gone for good, `gpufed unpeer --force {flag} {peer}` with the {side}'s kubeconfig "
                f"would delete on {local_id}: {shown or 'nothing'}."
            )
        raise PeerError(" ".join(lines))
