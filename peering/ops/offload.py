"""`gpufed offload-namespace` / `unoffload-namespace`: extending a namespace to the providers, and back.

Owns the operator's side of namespace offloading:
- `parse_selector`: `key=value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key`, `!key`,
  `key>N`, `key<N` -> one node-selector term (every expression must hold);
- `offload`: check everything first (the request, the kubeconfig, that gpufed is installed and the
  namespace exists) so bad input leaves nothing behind; server-side apply the namespace's
  NamespaceOffloading (the same flags again change nothing; other flags update it); wait until the
  controller has seen this generation and every selected provider's twin is Ready, reporting
  progress, or say which is not and why;
- `unoffload`: refuse while non-terminal pods of the namespace are bound to virtual nodes (unless
  forced); delete the NamespaceOffloading and wait until its finalizer ran (the twins are gone);
  when forced, then delete those pods so that their controllers recreate them, locally.
Both are idempotent.

Does not: create twins or label namespaces itself (the offloading controller does), or mutate pods
(the webhook does).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION, GROUP
from gpufed.apis.offloading import NamespaceOffloading, NamespaceOffloadingSpec, NodeSelectorRequirement
from gpufed.apis.wire import (
    IDENTITY_CONFIGMAP,
    NAMESPACE_OFFLOADING,
    SYSTEM_NAMESPACE,
    TYPE_LABEL,
    VIRTUAL_NODE_TYPE,
)
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client, require_kubeconfig
from peering import defaults
from peering.ops import volumes

DEFAULT_TIMEOUT_S = defaults.OPERATION_TIMEOUT_S
POLL_S = 0.25
PLURAL = NamespaceOffloading.plural

_KEY = (
    r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$", re.IGNORECASE)
_CMP = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s=!<>]*)\s*$")
_EXISTS = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


class OffloadError(GpufedError):
    """The operation cannot go on; the message says why and what to do."""


class Reporter(Protocol):
    def step(self, text: str) -> None: ...
    def done(self, text: str) -> None: ...


@dataclass(frozen=True)
class OffloadRequest:
    kubeconfig: Path
    namespace: str
    context: str | None = None
    #: Local | Remote | LocalAndRemote.
    pod_strategy: str = "LocalAndRemote"
    #: DefaultName | EnforceSameName | SelectedName.
    mapping: str = "DefaultName"
    #: The twin's name with mapping SelectedName.
    remote_name: str | None = None
    #: Selector expressions (see `parse_selector`), all of which a provider's virtual node must match.
    selectors: tuple[str, ...] = ()
    #: Seconds the whole operation may take.
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class OffloadResult:
    namespace: str
    consumer_id: str
    pod_strategy: str
    phase: str
    #: `status.remoteNamespaces`: clusterId, namespace, phase, message per provider.
    remote_namespaces: list[dict[str, str]]
    #: False when the NamespaceOffloading already had this spec.
    changed: bool
    #: The controller's Ready condition message.
    message: str = ""


@dataclass(frozen=True)
class UnoffloadResult:
    namespace: str
    #: False when the namespace was not offloaded.
    removed: bool
    #: Pods (bound to virtual nodes) deleted because of --force.
    deleted_pods: list[str] = field(default_factory=list)


def parse_selector(expressions: Sequence[str]) -> dict[str, Any] | None:
    """One node-selector term from CLI expressions, or None for none; ValueError with the offender."""
    exprs: list[dict[str, Any]] = []
    for raw in expressions:
        expr: dict[str, Any]
        if m := _SET.match(raw):
            values = [v.strip() for v in m["values"].split(",") if v.strip()]
            expr = {"key": m["key"], "operator": "In" if m["op"].lower() == "in" else "NotIn", "values": values}
        elif m := _CMP.match(raw):
            op = {"=": "In", "==": "In", "!=": "NotIn", ">": "Gt", "<": "Lt"}[m["op"]]
            expr = {"key": m["key"], "operator": op, "values": [m["value"]]}
        elif m := _EXISTS.match(raw):
            expr = {"key": m["key"], "operator": "DoesNotExist" if m["neg"] else "Exists"}
        else:
            raise ValueError(
                f"cannot parse selector {raw!r}: use key=value, key!=value, 'key in (a,b)', "
                "'key notin (a,b)', key, !key, key>N or key<N"
            )
        try:
            NodeSelectorRequirement.model_validate(expr)
        except ValidationError as e:
            raise ValueError(f"selector {raw!r}: " + "; ".join(str(x["msg"]) for x in e.errors())) from e
        if any(v == "" for v in expr.get("values", [])):
            raise ValueError(f"selector {raw!r}: empty value")
        exprs.append(expr)
    return {"nodeSelectorTerms": [{"matchExpressions": exprs}]} if exprs else None


def build_spec(req: OffloadRequest) -> NamespaceOffloadingSpec:
    """The NamespaceOffloading spec the request asks for; OffloadError when it is invalid."""
    try:
        selector = parse_selector(req.selectors)
    except ValueError as e:
        raise OffloadError(str(e)) from e
    body: dict[str, Any] = {"podOffloadingStrategy": req.pod_strategy, "namespaceMappingStrategy": req.mapping}
    if req.remote_name is not None:
        body["remoteNamespaceName"] = req.remote_name
    if selector:
        body["clusterSelector"] = selector
    try:
        return NamespaceOffloadingSpec.model_validate(body)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            msgs.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
        raise OffloadError("invalid offloading: " + "; ".join(msgs)) from e


def _wire(spec: NamespaceOffloadingSpec) -> dict[str, Any]:
    """The spec as applied: strategies always spelled out, an empty selector left out."""
    out = spec.model_dump(by_alias=True, exclude_none=True)
    if not spec.cluster_selector.node_selector_terms:
        out.pop("clusterSelector", None)
    return out


def _same(existing: dict[str, Any] | None, spec: NamespaceOffloadingSpec) -> bool:
    try:
        return existing is not None and NamespaceOffloadingSpec.model_validate(existing.get("spec") or {}) == spec
    except ValidationError:
        return False


@asynccontextmanager
async def _connect(kubeconfig: Path, context: str | None) -> AsyncIterator[Any]:
    await asyncio.to_thread(require_kubeconfig, kubeconfig)
    try:
        async with api_client(kubeconfig, context) as api:
            try:
                await rest.request(api, "GET", "/version", request_timeout=10)
            except KubeError as e:
                raise OffloadError(f"cannot reach the API server {api.configuration.host}: {e}") from e
            crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}"
            if await rest.get(api, crd) is None:
                raise OffloadError(
                    f"gpufed is not installed on this cluster (no CRD {PLURAL}.{GROUP}): apply deploy/crds/ "
                    "and deploy/rbac/, and start `gpufed controller`"
                )
            yield api
    except KubeError as e:
        raise OffloadError(str(e)) from e


async def _consumer_id(api: Any) -> str:
    cm = await rest.get(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE))
    if cm is None:
        raise OffloadError(
            f"this cluster has no gpufed identity (ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP}): "
            "start `gpufed controller`"
        )
    return str((cm.get("data") or {}).get("clusterId", ""))


def _path(namespace: str) -> str:
    return rest.path(API_VERSION, PLURAL, NAMESPACE_OFFLOADING, namespace=namespace)


def _ready_condition(obj: dict[str, Any]) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return dict(c)
    return {}


def _describe(remote: list[dict[str, str]]) -> str:
    return "; ".join(f"{r.get('clusterId')}: {r.get('phase')} ({r.get('message', '')})" for r in remote) or "none"


async def offload(req: OffloadRequest, report: Reporter) -> OffloadResult:
    deadline = time.monotonic() + req.timeout_s
    spec = build_spec(req)
    report.step("checking the cluster")
    async with _connect(req.kubeconfig, req.context) as api:
        consumer = await _consumer_id(api)
        if await rest.get(api, rest.path("v1", "namespaces", req.namespace)) is None:
            raise OffloadError(f"namespace {req.namespace!r} does not exist (create it first)")
        existing = await rest.get(api, _path(req.namespace))
        if existing is not None and existing["metadata"].get("deletionTimestamp"):
            raise OffloadError(
                f"namespace {req.namespace!r} is being unoffloaded; wait for `gpufed unoffload-namespace` to finish"
            )
        report.done(f"cluster {consumer}, namespace {req.namespace}")
        want = _wire(spec)
        changed = not _same(existing, spec)
        report.step(
            f"offloading {req.namespace} (pods: {spec.pod_offloading_strategy}, "
            f"twin names: {spec.namespace_mapping_strategy})"
        )
        applied = await rest.apply(
            api,
            _path(req.namespace),
            {
                "apiVersion": API_VERSION,
                "kind": NamespaceOffloading.kind,
                "metadata": {"name": NAMESPACE_OFFLOADING, "namespace": req.namespace},
                "spec": want,
            },
        )
        generation = applied["metadata"].get("generation", 1)
        report.done("NamespaceOffloading applied" if changed else "already offloaded this way: nothing changed")
        report.step("waiting for the twin namespaces on the selected providers")
        seen: dict[str, str] = {}
        obj = applied
        while True:
            got = await rest.get(api, _path(req.namespace))
            if got is None:
                raise OffloadError(f"the NamespaceOffloading of {req.namespace} was deleted meanwhile")
            obj = got
            st = obj.get("status") or {}
            remote = [dict(r) for r in st.get("remoteNamespaces") or []]
            current = st.get("observedGeneration") == generation
            if current:
                for r in remote:
                    key, phase = str(r.get("clusterId")), str(r.get("phase"))
                    if seen.get(key) != phase:
                        seen[key] = phase
                        report.done(f"{key}: twin {r.get('namespace') or '?'} {phase}")
                if st.get("phase") == "Ready":
                    break
                if st.get("phase") == "Failed":
                    raise OffloadError(f"the providers refused the twin namespaces: {_describe(remote)}")
                if _ready_condition(obj).get("reason") == "NoMatchingProvider":
                    break  # valid, and nothing to wait for: twins follow when a matching virtual node appears
            if time.monotonic() > deadline:
                if not current:
                    raise OffloadError(
                        f"timed out: the offloading controller has not processed {req.namespace} "
                        "(is `gpufed controller` running?)"
                    )
                cond = _ready_condition(obj)
                raise OffloadError(
                    f"timed out waiting for the twin namespaces ({cond.get('reason', '')}): {_describe(remote)}"
                )
            await asyncio.sleep(POLL_S)
        st = obj.get("status") or {}
        return OffloadResult(
            req.namespace,
            consumer,
            spec.pod_offloading_strategy,
            str(st.get("phase") or "Pending"),
            [dict(r) for r in st.get("remoteNamespaces") or []],
            changed,
            str(_ready_condition(obj).get("message") or ""),
        )


async def bound_to_virtual_nodes(api: Any, namespace: str) -> list[str]:
    """`pod (node)` for the non-terminal pods of `namespace` bound to virtual nodes."""
    nodes = await rest.list_items(api, "/api/v1/nodes", params={"labelSelector": f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}"})
    virtual = {n["metadata"]["name"] for n in nodes}
    pods = await rest.list_items(api, rest.path("v1", "pods", namespace=namespace))
    out = []
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node in virtual and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            out.append(f"{p['metadata']['name']} ({node})")
    return sorted(out)


async def unoffload(
    kubeconfig: Path,
    context: str | None,
    namespace: str,
    report: Reporter,
    *,
    force: bool = False,
    delete_volumes: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> UnoffloadResult:
    deadline = time.monotonic() + timeout_s
    report.step("checking the cluster")
    async with _connect(kubeconfig, context) as api:
        obj = await rest.get(api, _path(namespace))
        if obj is None:
            report.done(f"namespace {namespace} is not offloaded: nothing to do")
            return UnoffloadResult(namespace, False)
        remote_pods = await bound_to_virtual_nodes(api, namespace)
        if remote_pods and not force:
            raise OffloadError(
                f"{len(remote_pods)} pod(s) of {namespace} run on virtual nodes: "
                + ", ".join(remote_pods)
                + "; delete them first, or use --force to delete them after the twins are removed "
                "(their controllers recreate them locally)"
            )
        claims = await volumes.bound_claims(api, namespace=namespace)
        if claims and not delete_volumes:
            raise OffloadError(
                f"{len(claims)} claim(s) of {namespace} keep their data on providers: {volumes.describe(claims)}; "
                "unoffloading deletes the twin namespaces and the data in them. Copy the data out first, or "
                "pass --delete-volumes to delete these claims and their data on the providers"
            )
        report.done(f"namespace {namespace} is offloaded; {len(remote_pods)} pod(s) on virtual nodes")
        if claims:
            for name in await volumes.delete_claims(api, claims):
                report.done(f"deleted claim {name} (--delete-volumes: its data on the provider goes with it)")
        report.step(f"removing the offloading of {namespace} and its twin namespaces")
        if not obj["metadata"].get("deletionTimestamp"):
            await rest.delete(api, _path(namespace), uid=obj["metadata"]["uid"])
        while (left := await rest.get(api, _path(namespace))) is not None:
            if time.monotonic() > deadline:
                st = left.get("status") or {}
                raise OffloadError(
                    "timed out waiting for the twin namespaces to be removed: "
                    f"{_describe([dict(r) for r in st.get('remoteNamespaces') or []])} "
                    "(is `gpufed controller` running? an unreachable provider is retried)"
                )
            await asyncio.sleep(POLL_S)
        report.done("twin namespaces removed; the namespace is local again")
        deleted = []
        if force:
            for entry in remote_pods:
                name = entry.split(" ", 1)[0]
                if await rest.delete(api, rest.path("v1", "pods", name, namespace=namespace)):
                    deleted.append(name)
                    report.done(f"deleted pod {name}")
        return UnoffloadResult(namespace, True, deleted)
