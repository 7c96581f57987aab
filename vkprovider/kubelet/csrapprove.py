"""Approval of the virtual nodes' kubelet-serving certificate requests (runs in `gpufed controller`).

Owns: a watch on CertificateSigningRequests with signer `kubernetes.io/kubelet-serving`, and for
each pending one filed by a virtual-kubelet identity (`requesters`, checked against the request's
`spec.username` and `spec.groups`, which the API server fills in and nobody can forge) a review:

- the requester: one of `requesters`, authenticated, a ServiceAccount in its own namespace's group;
- the request itself (`servingcert.serving_csr_problems`): subject exactly `O=system:nodes,
  CN=system:node:<node>`, the subject-alternative names only the node's name and its own
  addresses, no other extension, the usages exactly what a virtual kubelet asks for;
- the node it names (`virtual_node_problems`): it must exist and be a gpufed virtual node by more
  than its label: the name carries the virtual-node prefix, the label `gpufed.io/type=virtual-node`
  is set (the ValidatingAdmissionPolicy `gpufed-virtual-kubelet` in deploy/rbac/virtual-kubelet.yaml
  keeps the virtual kubelets from putting it on any other node), and the Node is owned by the
  ForeignCluster of the provider it names (`gpufed.io/remote-cluster-id`), which exists with that
  UID and is not being deleted.

Then Approved (the cluster's signer signs it) or Denied with every reason, plus a Warning Event on
the request. The approval is written with the reviewed object's UID and resourceVersion, so it
approves exactly what was reviewed: a request replaced or changed in between is reviewed again. A
request whose node is not registered yet is left pending and looked at again shortly (the virtual
kubelet files it while it registers its node); after `PENDING_LIMIT_S` it is denied. Requests of
anyone else (real kubelets, other tools) are never touched: that is the job of whatever approves
them today.

Does not: sign (kube-controller-manager does), or file requests (`servingcert` does).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpufed.apis.meta import API_VERSION, GROUP
from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, TYPE_LABEL, VIRTUAL_NODE_PREFIX, VIRTUAL_NODE_TYPE
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from vkprovider.kubelet.servingcert import NODE_PREFIX, SIGNER, serving_csr_problems

CSR_API = "certificates.k8s.io/v1"
#: Seconds between looks at requests left pending (their node was not registered yet).
RECHECK_S = 2.0
#: Give up on a pending request after this long (it is then denied).
PENDING_LIMIT_S = 300.0
REASON = "GpufedVirtualNode"
#: The reason of a denial (the condition's and the Event's).
DENIED_REASON = "InvalidServingRequest"
#: Every virtual node's name starts with this (`gpufed-<provider>[-<product>]`); the admission
#: policy in deploy/rbac/virtual-kubelet.yaml confines the virtual kubelets to such nodes.
AUTHENTICATED = "system:authenticated"
_SA_PREFIX = "system:serviceaccount:"


def requester_problems(spec: Mapping[str, Any], requesters: frozenset[str]) -> list[str]:
    """Why the user who filed a CSR (`spec.username`, `spec.groups`) is not a virtual kubelet."""
    user = str(spec.get("username") or "")
    groups = {str(g) for g in spec.get("groups") or ()}
    problems: list[str] = []
    if user not in requesters:
        problems.append(f"filed by {user or '(nobody)'}, not by a gpufed virtual kubelet")
    if AUTHENTICATED not in groups:
        problems.append(f"the requester is not in {AUTHENTICATED}")
    if user.startswith(_SA_PREFIX):
        namespace = user.removeprefix(_SA_PREFIX).partition(":")[0]
        if f"system:serviceaccounts:{namespace}" not in groups:
            problems.append(f"the service account {user} lacks the group system:serviceaccounts:{namespace}")
    return problems


def virtual_node_problems(node: Mapping[str, Any], foreign_cluster: Mapping[str, Any] | None) -> list[str]:
    """Why `node` is not a gpufed virtual node (empty: it is). `foreign_cluster` is the ForeignCluster
    its `gpufed.io/remote-cluster-id` label names, or None when there is none."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    problems: list[str] = []
    if labels.get(TYPE_LABEL) != VIRTUAL_NODE_TYPE:
        problems.append(f"node {name} is not a gpufed virtual node (no {TYPE_LABEL}={VIRTUAL_NODE_TYPE})")
    if not name.startswith(VIRTUAL_NODE_PREFIX):
        problems.append(
            f"node {name} is not a gpufed virtual node (its name does not start with {VIRTUAL_NODE_PREFIX})"
        )
    provider = str(labels.get(REMOTE_CLUSTER_LABEL) or "")
    if not provider:
        problems.append(f"node {name} names no provider ({REMOTE_CLUSTER_LABEL})")
        return problems
    if foreign_cluster is None:
        problems.append(f"node {name} names provider {provider}, which is not peered (no ForeignCluster)")
        return problems
    fc_meta = foreign_cluster.get("metadata") or {}
    if fc_meta.get("deletionTimestamp"):
        problems.append(f"the ForeignCluster {provider} of node {name} is being deleted")
    owned = any(
        ref.get("kind") == "ForeignCluster"
        and str(ref.get("apiVersion") or "").partition("/")[0] == GROUP
        and ref.get("name") == provider
        and ref.get("uid") == fc_meta.get("uid")
        for ref in meta.get("ownerReferences") or ()
    )
    if not owned:
        problems.append(f"node {name} is not owned by the ForeignCluster {provider}")
    return problems


class ServingCSRApprover:
    def __init__(self, api: Any, requesters: Sequence[str]) -> None:
        self.api = api
        self.requesters = frozenset(requesters)
        self._pending: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._log = structlog.get_logger().bind(kind="CertificateSigningRequest")

    def _on_csr(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED" or not self._is_candidate(obj):
            self._pending.pop(name, None)
            return
        self._pending.setdefault(name, asyncio.get_running_loop().time())
        self._wake.set()

    def _is_candidate(self, csr: dict[str, Any]) -> bool:
        spec = csr.get("spec") or {}
        decided = {c.get("type") for c in (csr.get("status") or {}).get("conditions") or []}
        return (
            spec.get("signerName") == SIGNER
            and spec.get("username") in self.requesters
            and not decided & {"Approved", "Denied", "Failed"}
        )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                watch(
                    self.api,
                    rest.path(CSR_API, "certificatesigningrequests"),
                    self._on_csr,
                    what="kubelet-serving CSRs",
                    params={"fieldSelector": f"spec.signerName={SIGNER}"},
                )
            )
            while True:
                self._wake.clear()
                for name in list(self._pending):
                    try:
                        if await self.review(name):
                            self._pending.pop(name, None)
                    except KubeError as e:
                        self._log.warning("cannot review CSR; retrying", name=name, error=str(e))
                if self._pending:
                    try:
                        async with asyncio.timeout(RECHECK_S):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                else:
                    await self._wake.wait()

    async def review(self, name: str) -> bool:
        """Approve or deny `name`; False when it must wait (its node is not there yet)."""
        url = rest.path(CSR_API, "certificatesigningrequests", name)
        csr = await rest.get(self.api, url)
        if csr is None or not self._is_candidate(csr):
            return True
        spec = csr["spec"]
        problems = requester_problems(spec, self.requesters)
        try:
            pem = base64.b64decode(spec.get("request") or "", validate=True)
        except ValueError:
            pem = b""
        node_name = _node_of(pem)
        node = await rest.get(self.api, rest.path("v1", "nodes", node_name)) if node_name else None
        if node is None:
            started = self._pending.get(name, 0.0)
            if not problems and node_name and asyncio.get_running_loop().time() - started < PENDING_LIMIT_S:
                return False
            problems += serving_csr_problems(pem, list(spec.get("usages") or []), node_name, set())
            problems.append(f"no node {node_name or '(none named)'} is registered")
            await self._decide(csr, False, "; ".join(dict.fromkeys(problems)))
            return True
        provider = str(((node.get("metadata") or {}).get("labels") or {}).get(REMOTE_CLUSTER_LABEL) or "")
        fc = await rest.get(self.api, rest.path(API_VERSION, "foreignclusters", provider)) if provider else None
        problems += virtual_node_problems(node, fc)
        addresses = {str(a.get("address")) for a in (node.get("status") or {}).get("addresses") or []}
        problems += serving_csr_problems(pem, list(spec.get("usages") or []), node_name, addresses)
        await self._decide(csr, not problems, "; ".join(problems) or f"serving certificate of virtual node {node_name}")
        return True

    async def _decide(self, csr: dict[str, Any], approve: bool, message: str) -> None:
        name = csr["metadata"]["name"]
        cond = {
            "type": "Approved" if approve else "Denied",
            "status": "True",
            "reason": REASON if approve else DENIED_REASON,
            "message": message,
        }
        # The reviewed object, UID and resourceVersion included: the API server refuses the
        # approval (409) when the request was replaced or changed since it was read.
        body = {**csr, "status": {**(csr.get("status") or {}), "conditions": [cond]}}
        await rest.request(
            self.api,
            "PUT",
            rest.path(CSR_API, "certificatesigningrequests", name, sub="approval"),
            body=body,
            what=f"{'approve' if approve else 'deny'} CSR {name}",
        )
        if approve:
            self._log.info("kubelet serving certificate approved", name=name, reason=message)
        else:
            self._log.warning("kubelet serving certificate denied", name=name, reason=message)
            await events.emit(
                self.api,
                csr,
                type_="Warning",
                reason=DENIED_REASON,
                message=f"kubelet-serving request denied: {message}",
            )


def _node_of(pem: bytes) -> str:
    """The node a kubelet-serving CSR names in its CN (`system:node:<name>`), or ""."""
    try:
        csr = x509.load_pem_x509_csr(pem)
        cns = [str(a.value) for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    except ValueError:
        return ""
    return cns[0].removeprefix(NODE_PREFIX) if len(cns) == 1 and cns[0].startswith(NODE_PREFIX) else ""
