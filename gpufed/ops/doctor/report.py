"""`gpufed doctor`'s run: every check of a cluster, side by side, each under its own timeout, in a `Report`.

Owns: `doctor` (connect with the kubeconfig, then `diagnose`), `diagnose` (which checks apply to
this cluster and to each peering, run all at once so an unreachable provider costs one timeout and
never hangs the report; their order in the report), `guard` (one check's timeout, and a failure to
read as that check's FAIL naming the error, never an exception out of `diagnose`), and `DoctorError`
(the cluster cannot be read at all).

Does not: print (the CLI renders the `Report`), write or repair anything, or reach the consumer's
cluster from a provider (a provider has no credentials there).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Awaitable, Mapping
from functools import partial
from typing import Any

import aiohttp
import yaml

from gpufed.apis.meta import API_VERSION, GROUP
from gpufed.apis.wire import IDENTITY_CONFIGMAP, REMOTE_CLUSTER_LABEL, SYSTEM_NAMESPACE, parse_cluster_id
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client, client_from_dict, require_kubeconfig
from gpufed.ops.doctor.checks import FAIL, OK, THIS_CLUSTER, WARN, Check, Peer, Report
from gpufed.ops.doctor.probes import ClientFactory, Probe, Probes, ProviderLink, get_object, list_objects
from gpufed.ops.doctor.settings import DoctorSettings
from gpufed.ops.doctor.verdicts import judge_controller, judge_identity, one_line
from gpupool.estimator.client import EstimatorError

#: Fixes of checks that time out or fail before they could say more.
API_FIX = "check that the provider's API server is reachable from here (DNS, firewall, VPN)"
ESTIMATOR_FIX = "check the provider's controller (--estimator-port) and that its estimator endpoint is reachable"


class DoctorError(GpufedError):
    """The cluster to check cannot be read at all (no kubeconfig, unreachable); the message says why."""


async def guard(name: str, peer: str, timeout_s: float, fix: str, probe: Probe) -> list[Check]:
    """Run one check under its own timeout; a failure to read is the check's FAIL, never an exception."""
    try:
        async with asyncio.timeout(timeout_s):
            return await probe()
    except TimeoutError:
        return [Check(name, FAIL, f"no answer within {timeout_s:g} s", fix, peer)]
    except (KubeError, EstimatorError, LookupError, OSError, ValueError, aiohttp.ClientError, ssl.SSLError) as e:
        return [Check(name, FAIL, one_line(str(e) or type(e).__name__), fix, peer)]


def _roles(fc: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in (fc.get("spec") or {}).get("roles") or []]


async def diagnose(
    api: Any,
    settings: DoctorSettings,
    *,
    api_server: str = "",
    now: dt.datetime | None = None,
    provider_client: ClientFactory = client_from_dict,
) -> Report:
    """Every check of the cluster behind `api` (see the package docstring), judged at `now`."""
    d = Probes(api, settings, now or dt.datetime.now(dt.UTC))

    def timed(name: str, peer: str, fix: str, probe: Probe) -> Awaitable[list[Check]]:
        return guard(name, peer, settings.check_timeout_s, fix, probe)

    kubectl = settings.kubectl
    can_read = f"check that the kubeconfig's user may read gpufed's objects: {kubectl} auth can-i --list"
    identity_cm: dict[str, Any] | None = None
    identity_error: Check | None = None
    try:
        async with asyncio.timeout(settings.check_timeout_s):
            identity_cm = await get_object(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, SYSTEM_NAMESPACE))
    except (KubeError, TimeoutError) as e:
        identity_error = Check("identity", FAIL, one_line(f"cannot read the identity: {e or 'timed out'}"), can_read)
    identity = identity_error or judge_identity(identity_cm, fix_flags=settings.flags)
    if identity.status == OK and identity_cm is not None:
        d.cluster_id = str((identity_cm.get("data") or {}).get("clusterId") or "")

    peers_error: Check | None = None
    fcs: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(settings.check_timeout_s):
            fcs = await list_objects(api, rest.path(API_VERSION, "foreignclusters"))
    except (KubeError, TimeoutError) as e:
        peers_error = Check("peerings", FAIL, one_line(f"cannot list ForeignClusters: {e or 'timed out'}"), can_read)
    by_id = {str((fc.get("spec") or {}).get("clusterId") or fc["metadata"]["name"]): fc for fc in fcs}
    selection = sorted(by_id)
    if settings.remote_cluster_id is not None:
        selection = [settings.remote_cluster_id] if settings.remote_cluster_id in by_id else []
    consumes = any("Provider" in _roles(fc) for fc in fcs)

    head: list[Awaitable[list[Check]]] = [
        timed("install", THIS_CLUSTER, f"kubectl {settings.flags} apply -f deploy/crds/ -f deploy/rbac/", d.install),
        timed("webhook", THIS_CLUSTER, d.restart("--webhook-port PORT"), partial(d.webhook, consumes)),
        timed("estimator-server", THIS_CLUSTER, d.restart("--estimator-port PORT"), d.estimator_server),
    ]
    links: list[ProviderLink] = []
    per_peer: list[Awaitable[list[Check]]] = []
    peers: list[Peer] = []
    for peer in selection:
        fc = by_id[peer]
        roles = _roles(fc)
        slices, selector = f"resourceslices.{GROUP}", f"{REMOTE_CLUSTER_LABEL}={peer}"
        role = "+".join(r.lower() for r in ("Provider", "Consumer") if r in roles) or "unknown"
        peers.append(Peer(peer, role))
        fabric = timed("tunnel", peer, f"gpufed network status {settings.flags}", partial(d.tunnel, peer, role))
        if "Provider" in roles:
            link = ProviderLink(api, peer, provider_client)
            links.append(link)
            reach = f"re-run the handshake: {d.peer_cmd()}"
            per_peer += [
                timed("peering", peer, reach, partial(d.auth, peer, fc)),
                timed("credentials", peer, reach, partial(d.credentials, peer, link)),
                timed("api", peer, API_FIX, partial(d.api_rtt, peer, link)),
                timed("grant", peer, f"{kubectl} -n {SYSTEM_NAMESPACE} describe {slices}", partial(d.grant, peer)),
                timed("virtual-nodes", peer, f"{kubectl} get nodes -l {selector}", partial(d.nodes, peer)),
                fabric,
                timed("estimator", peer, ESTIMATOR_FIX, partial(d.estimator, peer, link)),
            ]
        else:
            per_peer.append(fabric)
        if "Consumer" in roles:
            tenant_fix = f"{kubectl} describe tenant.gpufed.io {peer}"
            per_peer.append(timed("tenant", peer, tenant_fix, partial(d.tenant, peer)))
    controller_fix = (
        f"start it: gpufed controller {settings.flags} (in a cluster: "
        f"{settings.kubectl} -n {SYSTEM_NAMESPACE} get pods; logs of the gpufed-controller pod)"
    )
    lease_result: list[dict[str, Any] | None] = []

    async def read_lease() -> list[Check]:
        lease_result.append(await d.lease())
        return []

    try:
        results = await asyncio.gather(*head, *per_peer, timed("controller", THIS_CLUSTER, controller_fix, read_lease))
    finally:
        for link in links:
            with contextlib.suppress(Exception):
                await link.close()
    flat_head = [c for r in results[: len(head)] for c in r]
    flat_peers = [c for r in results[len(head) : len(head) + len(per_peer)] for c in r]
    lease_failure = results[-1]
    controller = (
        lease_failure[0]
        if lease_failure
        else judge_controller(
            lease_result[0] if lease_result else None,
            d.now,
            answering=d.answering,
            fix=controller_fix,
        )
    )
    checks = [flat_head[0], identity, controller, *flat_head[1:]]
    if peers_error is not None:
        checks.append(peers_error)
    elif settings.remote_cluster_id is not None and not selection:
        known = ", ".join(sorted(by_id)) or "none"
        checks.append(
            Check(
                "peering",
                FAIL,
                f"this cluster has no ForeignCluster {settings.remote_cluster_id} (its peers: {known})",
                f"peer it: {d.peer_cmd()}",
                settings.remote_cluster_id,
            )
        )
    elif not fcs:
        checks.append(
            Check(
                "peerings",
                WARN,
                "this cluster has no peerings (no ForeignCluster)",
                f"peer it with a provider: {d.peer_cmd()}",
            )
        )
    checks += flat_peers
    return Report(d.cluster_id, api_server, tuple(peers), tuple(checks))


@contextlib.asynccontextmanager
async def _connect(settings: DoctorSettings) -> AsyncIterator[tuple[Any, str]]:
    require_kubeconfig(settings.kubeconfig)
    try:
        async with api_client(settings.kubeconfig, settings.context) as api:
            server = str(api.configuration.host)
            try:
                async with asyncio.timeout(settings.check_timeout_s):
                    await rest.request(api, "GET", "/version", request_timeout=settings.check_timeout_s)
            except TimeoutError:
                raise DoctorError(
                    f"the API server {server} does not answer within {settings.check_timeout_s:g} s "
                    f"(kubeconfig {settings.kubeconfig}, context {settings.context or 'current'})"
                ) from None
            except KubeError as e:
                raise DoctorError(
                    f"cannot reach the API server {server} (kubeconfig {settings.kubeconfig}, context "
                    f"{settings.context or 'current'}): {e}"
                ) from e
            yield api, server
    except KubeError as e:
        raise DoctorError(str(e)) from e
    except yaml.YAMLError as e:  # a kubeconfig that is not YAML escapes api_client as YAMLError
        raise DoctorError(one_line(f"cannot load kubeconfig {settings.kubeconfig}: not YAML ({e})")) from e


async def doctor(
    settings: DoctorSettings,
    *,
    provider_client: ClientFactory = client_from_dict,
) -> Report:
    """Check the cluster of `settings.kubeconfig`; DoctorError when it cannot be read at all."""
    if settings.remote_cluster_id is not None:
        try:
            parse_cluster_id(settings.remote_cluster_id)
        except ValueError as e:
            raise DoctorError(str(e)) from e
    async with _connect(settings) as (api, server):
        return await diagnose(api, settings, api_server=server, provider_client=provider_client)
