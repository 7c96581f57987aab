"""Approval of the virtual nodes' kubelet-serving certificate requests (runs in `gpufed controller`).

Owns: a watch on CertificateSigningRequests with signer `kubernetes.io/kubelet-serving`, and for
each pending one filed by a virtual-kubelet identity (`requesters`): the checks of
`servingcert.serving_csr_problems` against the Node it names — which must exist and be a gpufed
virtual node (`gpufed.io/type=virtual-node`), with the CSR's IP SANs among its addresses — then
Approved (the cluster's signer then signs it) or Denied with the reasons. A CSR whose node is not
registered yet is left pending and looked at again shortly (the virtual kubelet files it while it
registers its node). CSRs of anyone else (real kubelets, other tools) are never touched: that is
the job of whatever approves them today.

Does not: sign (kube-controller-manager does), or file requests (`servingcert` does).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any

import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpufed.apis.wire import TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from vkprovider.kubelet.servingcert import NODE_PREFIX, SIGNER, serving_csr_problems

CSR_API = "certificates.k8s.io/v1"
#: Seconds between looks at requests left pending (their node was not registered yet).
RECHECK_S = 2.0
#: Give up on a pending request after this long (it is then denied).
PENDING_LIMIT_S = 300.0
REASON = "GpufedVirtualNode"


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
        try:
            pem = base64.b64decode(spec.get("request") or "")
        except ValueError:
            pem = b""
        node_name = _node_of(pem)
        node = await rest.get(self.api, rest.path("v1", "nodes", node_name)) if node_name else None
        if node is None:
            started = self._pending.get(name, 0.0)
            if asyncio.get_running_loop().time() - started < PENDING_LIMIT_S and node_name:
                return False
            await self._decide(csr, False, f"no node {node_name or '(none named)'} is registered")
            return True
        if (node["metadata"].get("labels") or {}).get(TYPE_LABEL) != VIRTUAL_NODE_TYPE:
            await self._decide(csr, False, f"node {node_name} is not a gpufed virtual node")
            return True
        addresses = {str(a.get("address")) for a in (node.get("status") or {}).get("addresses") or []}
        problems = serving_csr_problems(pem, list(spec.get("usages") or []), node_name, addresses)
        await self._decide(csr, not problems, "; ".join(problems) or f"serving certificate of virtual node {node_name}")
        return True

    async def _decide(self, csr: dict[str, Any], approve: bool, message: str) -> None:
        name = csr["metadata"]["name"]
        cond = {
            "type": "Approved" if approve else "Denied",
            "status": "True",
            "reason": REASON if approve else "InvalidServingRequest",
            "message": message,
        }
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


def _node_of(pem: bytes) -> str:
    """The node a kubelet-serving CSR names in its CN (`system:node:<name>`), or ""."""
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError:
        return ""
    cns = [str(a.value) for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return cns[0].removeprefix(NODE_PREFIX) if len(cns) == 1 and cns[0].startswith(NODE_PREFIX) else ""
