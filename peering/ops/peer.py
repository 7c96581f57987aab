"""`gpufed peer` / `unpeer` / `info`: connecting a consumer to a provider, and undoing it.

Owns the operator's side of the protocol (see `peering.handshake` and the controllers):
1. check everything that can be checked before touching anything — the slice request, both
   kubeconfigs and contexts, both API servers, both gpufed identities, that the clusters differ,
   that the provider does not already know this consumer under another key — so a bad input
   leaves no state behind;
2. register each cluster with the other (ForeignCluster on both, Tenant on the provider);
3. carry the handshake: the provider's challenge to the consumer, the consumer's answer to the
   provider, the certificate back; every wait is bounded and a refusal is reported with its reason;
4. run the steps the layers above plug in, given as `Step`s (`gpufed.ops.peer` passes the
   network fabric after authentication and the wait for the virtual node after the grant);
5. ask for the slice (ResourceSlice `gpufed/<provider-id>` on the consumer) and wait for the
   provider's decision.
Running it again with the same arguments changes nothing; with other resources it renegotiates.

`unpeer` deletes everything peering created on both sides (provider first, so a failure there
leaves the consumer intact) and waits until none of it is left. `info` reads both roles' objects.

Does not: decide anything itself (grants and verification are the provider controller's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.peering import ResourceSliceSpec
from gpufed.apis.quantity import parse
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    IDENTITY_CONFIGMAP,
    PROVIDER_LABEL,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    parse_cluster_id,
)
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client, require_kubeconfig
from peering import defaults, grants
from peering.handshake import fingerprint
from peering.ops import volumes

DEFAULT_TIMEOUT_S = defaults.OPERATION_TIMEOUT_S
POLL_S = 0.25


class PeerError(GpufedError):
    """The operation cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class ClusterRef:
    kubeconfig: Path
    context: str | None = None
    #: What to call the cluster in messages.
    role: str = "cluster"


@dataclass(frozen=True)
class PeerRequest:
    consumer: ClusterRef
    provider: ClusterRef
    #: Requested quantities by resource name (cpu, memory, pods, nvidia.com/gpu, storage).
    resources: dict[str, str]
    gpu_product: str | None = None
    #: Seconds the whole operation may take.
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: The provider API URL the consumer's controller should use (default: the one in the provider kubeconfig).
    provider_api_server: str | None = None


class Reporter(Protocol):
    def step(self, text: str) -> None: ...
    def done(self, text: str) -> None: ...


@dataclass
class Peers:
    """Both clusters, connected and identified."""

    consumer_api: Any
    provider_api: Any
    consumer_id: ClusterID
    provider_id: ClusterID
    consumer_key: str
    provider_key: str
    provider_server: str


class Step(Protocol):
    """An upper layer's part of `gpufed peer` (network tunnel, virtual node)."""

    name: str

    async def run(self, peers: Peers, report: Reporter) -> None: ...


@dataclass(frozen=True)
class PeerResult:
    consumer_id: str
    provider_id: str
    accepted: bool
    reason: str
    message: str
    requested: dict[str, str]
    granted: dict[str, str]
    already_authenticated: bool = False
    steps: list[str] = field(default_factory=list)


def validate_request(resources: dict[str, str], gpu_product: str | None, provider: ClusterID) -> ResourceSliceSpec:
    """The slice as the provider will see it; PeerError before anything is touched when it is invalid."""
    try:
        spec = ResourceSliceSpec.model_validate(
            {"providerClusterId": provider, "resources": resources, "gpuProduct": gpu_product}
        )
        grants.validate(grants.SliceRequest({r: parse(q) for r, q in resources.items()}, gpu_product))
    except ValidationError as e:
        raise PeerError("invalid slice: " + "; ".join(str(err["msg"]) for err in e.errors())) from e
    except ValueError as e:
        raise PeerError(f"invalid slice: {e}") from e
    return spec


@asynccontextmanager
async def connect_one(ref: ClusterRef) -> AsyncIterator[tuple[Any, str]]:
    """One cluster's client and API server URL, once it answered; PeerError when it does not."""
    require_kubeconfig(ref.kubeconfig, ref.role)
    try:
        async with api_client(ref.kubeconfig, ref.context) as api:
            server = str(api.configuration.host)
            try:
                await rest.request(api, "GET", "/version", request_timeout=10)
            except KubeError as e:
                raise PeerError(f"cannot reach the {ref.role} API server {server}: {e}") from e
            yield api, server
    except KubeError as e:
        raise PeerError(f"{ref.role}: {e}") from e


async def identity(api: Any, ref: ClusterRef) -> tuple[ClusterID, str]:
    """The cluster's gpufed ClusterID and public key; PeerError when it has none."""
    try:
        cm = await rest.get(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE))
    except KubeError as e:
        raise PeerError(f"{ref.role}: cannot read the gpufed identity: {e}") from e
    if cm is None:
        raise PeerError(
            f"the {ref.role} cluster has no gpufed identity (ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP}): "
            "install gpufed there and start `gpufed controller`"
        )
    data = cm.get("data") or {}
    try:
        return parse_cluster_id(str(data.get("clusterId", ""))), str(data["publicKey"])
    except (KeyError, ValueError) as e:
        raise PeerError(f"the {ref.role} cluster's identity ConfigMap is damaged: {e}") from e


@asynccontextmanager
async def connect(consumer: ClusterRef, provider: ClusterRef) -> AsyncIterator[Peers]:
    async with AsyncExitStack() as stack:
        capi, _cserver = await stack.enter_async_context(connect_one(consumer))
        papi, pserver = await stack.enter_async_context(connect_one(provider))
        cid, ckey = await identity(capi, consumer)
        pid, pkey = await identity(papi, provider)
        if cid == pid:
            raise PeerError(f"both kubeconfigs point at the same cluster ({cid}): a cluster cannot peer with itself")
        yield Peers(capi, papi, cid, pid, ckey, pkey, pserver)


def _cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


async def _wait(what: str, deadline: float, probe: Callable[[], Awaitable[Any]], hint: str = "") -> Any:
    """Poll `probe` until it returns something truthy; PeerError (with the hint) at the deadline."""
    last: Exception | None = None
    while True:
        try:
            got = await probe()
            if got:
                return got
        except KubeError as e:
            last = e
        if time.monotonic() > deadline:
            extra = f" (last error: {last})" if last else ""
            raise PeerError(f"timed out waiting for {what}{extra}" + (f"; {hint}" if hint else ""))
        await asyncio.sleep(POLL_S)


def _fc_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ForeignCluster", "metadata": {"name": name}, "spec": spec}


def _tenant_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Tenant", "metadata": {"name": name}, "spec": spec}


async def _handshake(p: Peers, report: Reporter, deadline: float, provider_server: str) -> bool:
    """Carry the handshake; True when it was already done."""
    tenant_path = rest.path(API_VERSION, "tenants", p.consumer_id)
    fc_path = rest.path(API_VERSION, "foreignclusters", p.provider_id)
    hint_p = "is `gpufed controller` running on the provider?"
    hint_c = "is `gpufed controller` running on the consumer?"
    tenant = await rest.get(p.provider_api, tenant_path)
    fc = await rest.get(p.consumer_api, fc_path)
    tstatus = (tenant or {}).get("status") or {}
    if (
        tstatus.get("phase") == "Authenticated"
        and _cond(fc, "Authentication").get("status") == "True"
        and ((fc or {}).get("spec") or {}).get("certificate") == tstatus.get("certificate")
        and ((fc or {}).get("spec") or {}).get("apiServerUrl") == provider_server
        and ((tenant or {}).get("spec") or {}).get("authGeneration") == tstatus.get("authGeneration")
    ):
        return True
    gen = int(((tenant or {}).get("spec") or {}).get("authGeneration") or 1)
    if tstatus.get("phase") in ("Refused", "Authenticated") or tstatus.get("answered"):
        gen += 1  # a finished (or failed) handshake is not re-run: ask for a new one
    spec = {"consumerClusterId": p.consumer_id, "publicKey": p.consumer_key, "authGeneration": gen}
    await rest.apply(
        p.provider_api,
        tenant_path,
        _tenant_body(p.consumer_id, spec),
    )

    report.step(f"waiting for {p.provider_id}'s challenge")

    async def challenge() -> dict[str, Any] | None:
        t = await rest.get(p.provider_api, tenant_path)
        st = (t or {}).get("status") or {}
        if st.get("authGeneration") == gen and st.get("phase") == "Challenged" and st.get("challenge"):
            return dict(st["challenge"])
        return None

    ch = await _wait("the provider's challenge", deadline, challenge, hint_p)
    report.done(f"challenge issued by {p.provider_id} (expires {ch['expiresAt']})")

    fc_spec = {
        "clusterId": p.provider_id,
        "roles": ["Provider"],
        "apiServerUrl": provider_server,
        "publicKey": p.provider_key,
        "challenge": ch,
    }
    await rest.apply(p.consumer_api, fc_path, _fc_body(p.provider_id, fc_spec))
    report.step(f"{p.consumer_id} signs the challenge with its identity key")

    async def answer() -> dict[str, Any] | None:
        f = await rest.get(p.consumer_api, fc_path)
        a = ((f or {}).get("status") or {}).get("answer") or {}
        if a.get("nonce") == ch["nonce"]:
            return dict(a)
        c = _cond(f, "Authentication")
        if c.get("status") == "False":
            raise PeerError(f"the consumer refused to answer: {c.get('reason')}: {c.get('message')}")
        return None

    ans = await _wait("the consumer's answer", deadline, answer, hint_c)
    report.done(f"challenge signed by {p.consumer_id} (key {fingerprint(p.consumer_key)})")

    await rest.apply(
        p.provider_api,
        tenant_path,
        _tenant_body(p.consumer_id, {**spec, "answer": ans}),
    )
    report.step(f"{p.provider_id} verifies the signature and signs the consumer's certificate")

    async def verified() -> dict[str, Any] | None:
        t = await rest.get(p.provider_api, tenant_path)
        st = (t or {}).get("status") or {}
        if st.get("authGeneration") != gen:
            return None
        if st.get("phase") == "Refused":
            c = _cond(t, "Authentication")
            raise PeerError(f"{p.provider_id} refused the consumer: {c.get('reason')}: {c.get('message')}")
        if st.get("phase") == "Authenticated" and st.get("certificate"):
            return dict(st)
        return None

    st = await _wait("the provider's verdict and certificate", deadline, verified, hint_p)
    report.done(f"{p.provider_id} verified {p.consumer_id} and issued its certificate")

    await rest.apply(
        p.consumer_api,
        fc_path,
        _fc_body(p.provider_id, {**fc_spec, "certificate": st["certificate"], "caData": st["caData"]}),
    )
    report.step(f"{p.consumer_id} stores its credentials for {p.provider_id}")

    async def stored() -> bool:
        f = await rest.get(p.consumer_api, fc_path)
        c = _cond(f, "Authentication")
        if c.get("status") == "False":
            raise PeerError(f"the consumer could not store its credentials: {c.get('reason')}: {c.get('message')}")
        return c.get("status") == "True" and c.get("reason") == "Authenticated"

    await _wait("the consumer to store its credentials", deadline, stored, hint_c)
    report.done(f"{p.consumer_id} holds a least-privilege identity on {p.provider_id}")
    return False


async def peer(
    req: PeerRequest, report: Reporter, *, after_auth: Sequence[Step] = (), after_grant: Sequence[Step] = ()
) -> PeerResult:
    deadline = time.monotonic() + req.timeout_s
    report.step("checking both clusters")
    async with connect(req.consumer, req.provider) as p:
        slice_spec = validate_request(req.resources, req.gpu_product, p.provider_id)
        server = req.provider_api_server or p.provider_server
        tenant = await rest.get(p.provider_api, rest.path(API_VERSION, "tenants", p.consumer_id))
        known = ((tenant or {}).get("spec") or {}).get("publicKey")
        if known and known != p.consumer_key:
            raise PeerError(
                f"{p.provider_id} already has a tenant {p.consumer_id} with another identity key "
                f"({fingerprint(known)}, this consumer has {fingerprint(p.consumer_key)}); "
                "if the consumer's identity was recreated, run `gpufed unpeer` first"
            )
        report.done(f"consumer {p.consumer_id} and provider {p.provider_id} are reachable and initialised")

        report.step("registering the clusters with each other")
        await rest.apply(
            p.provider_api,
            rest.path(API_VERSION, "foreignclusters", p.consumer_id),
            _fc_body(p.consumer_id, {"clusterId": p.consumer_id, "roles": ["Consumer"], "publicKey": p.consumer_key}),
        )
        report.done("ForeignCluster objects registered on both sides")

        already = await _handshake(p, report, deadline, server)
        if already:
            report.done(f"{p.consumer_id} is already authenticated with {p.provider_id}")
        steps: list[str] = []
        for s in after_auth:
            report.step(s.name)
            await s.run(p, report)
            steps.append(s.name)

        report.step(f"asking {p.provider_id} for {_describe(req.resources, req.gpu_product)}")
        slice_path = rest.path(API_VERSION, "resourceslices", p.provider_id, namespace=SYSTEM_NAMESPACE)
        applied = await rest.apply(
            p.consumer_api,
            slice_path,
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {
                    "name": p.provider_id,
                    "namespace": SYSTEM_NAMESPACE,
                    "labels": {PROVIDER_LABEL: p.provider_id},
                },
                "spec": slice_spec.model_dump(by_alias=True, exclude_none=True),
            },
        )
        generation = applied["metadata"].get("generation", 1)

        async def decided() -> dict[str, Any] | None:
            s = await rest.get(p.consumer_api, slice_path)
            c = _cond(s, "Resources")
            return s if c and c.get("observedGeneration") == generation else None

        s = await _wait(
            "the provider's decision on the slice",
            deadline,
            decided,
            "is `gpufed controller` running on both clusters?",
        )
        c = _cond(s, "Resources")
        granted = dict(((s.get("status") or {}).get("granted")) or {})
        accepted = c.get("status") == "True"
        if accepted:
            report.done(f"{c.get('reason')}: {c.get('message')}")
            for st in after_grant:
                report.step(st.name)
                await st.run(p, report)
                steps.append(st.name)
        return PeerResult(
            p.consumer_id,
            p.provider_id,
            accepted,
            str(c.get("reason", "")),
            str(c.get("message", "")),
            dict(req.resources),
            granted,
            already,
            steps,
        )


def _describe(resources: dict[str, str], product: str | None) -> str:
    parts = [f"{v} {k}" for k, v in sorted(resources.items())]
    return ", ".join(parts) + (f" (GPU product {product})" if product else "")


# ---- unpeer


async def _leftovers(p: Peers) -> list[tuple[Any, str, str]]:
    """(api, path, description) of everything the peering left on either side."""
    out: list[tuple[Any, str, str]] = []
    c_sel = {"labelSelector": f"{CONSUMER_LABEL}={p.consumer_id}"}
    p_sel = {"labelSelector": f"{PROVIDER_LABEL}={p.provider_id}"}
    for path_, what in (
        (rest.path(API_VERSION, "tenants", p.consumer_id), f"Tenant {p.consumer_id}"),
        (rest.path(API_VERSION, "foreignclusters", p.consumer_id), f"ForeignCluster {p.consumer_id}"),
    ):
        if await rest.get(p.provider_api, path_) is not None:
            out.append((p.provider_api, path_, f"provider: {what}"))
    for ns in await rest.list_items(p.provider_api, "/api/v1/namespaces", params=c_sel):
        out.append(
            (
                p.provider_api,
                rest.path("v1", "namespaces", ns["metadata"]["name"]),
                f"provider: namespace {ns['metadata']['name']}",
            )
        )
    for csr in await rest.list_items(
        p.provider_api, "/apis/certificates.k8s.io/v1/certificatesigningrequests", params=c_sel
    ):
        n = csr["metadata"]["name"]
        out.append(
            (p.provider_api, f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{n}", f"provider: CSR {n}")
        )
    fc = rest.path(API_VERSION, "foreignclusters", p.provider_id)
    if await rest.get(p.consumer_api, fc) is not None:
        out.append((p.consumer_api, fc, f"consumer: ForeignCluster {p.provider_id}"))
    for s in await rest.list_items(
        p.consumer_api, rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE)
    ):
        if (s.get("spec") or {}).get("providerClusterId") == p.provider_id:
            n = s["metadata"]["name"]
            out.append(
                (
                    p.consumer_api,
                    rest.path(API_VERSION, "resourceslices", n, namespace=SYSTEM_NAMESPACE),
                    f"consumer: ResourceSlice.gpufed.io {n}",
                )
            )
    # Virtual nodes of the provider (their virtual kubelets delete them when the ForeignCluster goes;
    # listed so that a stopped virtual kubelet cannot leave one behind).
    for node in await rest.list_items(
        p.consumer_api, "/api/v1/nodes", params={"labelSelector": f"{REMOTE_CLUSTER_LABEL}={p.provider_id}"}
    ):
        n = node["metadata"]["name"]
        out.append((p.consumer_api, rest.path("v1", "nodes", n), f"consumer: virtual node {n}"))
    for sec in await rest.list_items(
        p.consumer_api, rest.path("v1", "secrets", namespace=SYSTEM_NAMESPACE), params=p_sel
    ):
        n = sec["metadata"]["name"]
        out.append((p.consumer_api, rest.path("v1", "secrets", n, namespace=SYSTEM_NAMESPACE), f"consumer: Secret {n}"))
    return out


async def check_claims(
    consumer: ClusterRef, provider: ClusterRef, report: Reporter, *, delete_volumes: bool = False
) -> None:
    """Before unpeering: refuse while the consumer has claims bound on the provider (their data is in
    the twin namespaces unpeering deletes), unless `delete_volumes`, which deletes those claims."""
    async with connect(consumer, provider) as p:
        claims = await volumes.bound_claims(p.consumer_api, provider=p.provider_id)
        if not claims:
            return
        if not delete_volumes:
            raise PeerError(
                f"{len(claims)} claim(s) keep their data on provider {p.provider_id}: {volumes.describe(claims)}; "
                "unpeering deletes the twin namespaces and the data in them. Copy the data out first, or pass "
                "--delete-volumes to delete these claims and their data on the provider"
            )
        for name in await volumes.delete_claims(p.consumer_api, claims):
            report.done(f"deleted claim {name} (--delete-volumes: its data on {p.provider_id} goes with it)")


async def unpeer(
    consumer: ClusterRef,
    provider: ClusterRef,
    report: Reporter,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    delete_volumes: bool = False,
) -> int:
    """Remove the peering from both sides; the number of objects deleted (0: nothing was peered).
    Refused while claims are bound on the provider, unless `delete_volumes` (`check_claims`)."""
    deadline = time.monotonic() + timeout_s
    report.step("checking both clusters")
    await check_claims(consumer, provider, report, delete_volumes=delete_volumes)
    async with connect(consumer, provider) as p:
        report.done(f"consumer {p.consumer_id}, provider {p.provider_id}")
        found = await _leftovers(p)
        if not found:
            report.done(f"{p.consumer_id} and {p.provider_id} are not peered: nothing to remove")
            return 0
        report.step(f"removing {len(found)} objects (provider side first)")
        # Provider side first: if it fails, the consumer keeps its credentials and a retry can finish.
        for api, path_, what in sorted(found, key=lambda f: (f[0] is p.consumer_api, "Tenant" not in f[2])):
            if await rest.delete(api, path_, propagation="Foreground" if "namespace" in what else "Background"):
                report.done(f"deleted {what}")

        async def gone() -> bool:
            left = await _leftovers(p)
            for api, path_, _what in left:
                await rest.delete(api, path_)  # something re-created meanwhile: delete again
            return not left

        report.step("waiting until nothing of the peering is left (namespaces finish terminating)")
        await _wait("the peering's objects to disappear", deadline, gone)
        report.done(f"unpeered {p.consumer_id} from {p.provider_id}: nothing left on either side")
        return len(found)


# ---- info


async def info(ref: ClusterRef) -> dict[str, Any]:
    """This cluster's peerings in both roles, with requested, granted and used resources, and the
    claims bound on each provider."""
    async with connect_one(ref) as (api, server):
        cid, key = await identity(api, ref)
        fcs = await rest.list_items(api, rest.path(API_VERSION, "foreignclusters"))
        slices = await rest.list_items(api, rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE))
        tenants = await rest.list_items(api, rest.path(API_VERSION, "tenants"))
        claims = await volumes.bound_claims(api)
    providers = []
    for fc in fcs:
        spec = fc.get("spec") or {}
        if "Provider" not in (spec.get("roles") or []):
            continue
        mine = [s for s in slices if (s.get("spec") or {}).get("providerClusterId") == spec.get("clusterId")]
        providers.append(
            {
                "clusterId": spec.get("clusterId"),
                "apiServer": spec.get("apiServerUrl"),
                "phase": (fc.get("status") or {}).get("phase", "Pending"),
                "authentication": _cond(fc, "Authentication").get("reason", ""),
                "claims": [
                    {"claim": f"{c.namespace}/{c.name}", "size": c.size}
                    for c in claims
                    if c.provider == spec.get("clusterId")
                ],
                "slices": [
                    {
                        "name": s["metadata"]["name"],
                        "gpuProduct": (s.get("spec") or {}).get("gpuProduct"),
                        "requested": (s.get("spec") or {}).get("resources") or {},
                        "granted": (s.get("status") or {}).get("granted") or {},
                        "used": (s.get("status") or {}).get("used") or {},
                        "accepted": _cond(s, "Resources").get("status") == "True",
                        "reason": _cond(s, "Resources").get("reason", "Pending"),
                        "message": _cond(s, "Resources").get("message", ""),
                    }
                    for s in mine
                ],
            }
        )
    consumers = [
        {
            "clusterId": (t.get("spec") or {}).get("consumerClusterId"),
            "phase": (t.get("status") or {}).get("phase", "Pending"),
            "granted": (t.get("status") or {}).get("granted") or {},
            "used": (t.get("status") or {}).get("used") or {},
            "twinNamespaces": (t.get("status") or {}).get("twinNamespaces") or [],
        }
        for t in tenants
    ]
    return {
        "clusterId": cid,
        "keyFingerprint": fingerprint(key),
        "apiServer": server,
        "providers": providers,
        "consumers": consumers,
    }
