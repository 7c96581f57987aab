"""Twins of the ResourceClaims an offloaded pod uses (pure).

Owns:
- `pod_claims`: which consumer ResourceClaim each of the pod's `spec.resourceClaims` entries is
  (named directly, or generated from a template: the name the resource-claim controller reported in
  `status.resourceClaimStatuses`);
- `twin_claim`: the claim re-created in the twin namespace WITHOUT the consumer's allocation, so the
  provider's scheduler allocates real devices: each request's DeviceClass becomes the provider's
  class of the devices the consumer's scheduler picked on the virtual node (the `deviceClass`
  attribute the node published), selectors, counts, capacity requests, tolerations and constraints
  copied (they read the provider's attribute domains on both sides). What cannot mean the same at
  the provider is refused with a sentence, never dropped silently: an allocation on another node or
  driver (a claim shared with a pod elsewhere), admin access, `allocationMode: All`, prioritized
  lists (`firstAvailable`), opaque driver configuration, and constraints on gpufed's own attributes;
- `twin_pod_claims`: the twin pod's `spec.resourceClaims`, each naming its twin claim;
- `provider_allocation`: the devices a twin claim was allocated, checked (they come from the
  provider) and written as one line for the consumer's claim.

Does not: read or write any object.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpufed.apis.wire import DRA_DRIVER, ORIGIN_NODE_LABEL
from vkprovider.forge.meta import Target, origin_labels

#: Most allocation results shown on the consumer's claim.
MAX_SHOWN = 16
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ClaimRefusedError(Exception):
    """A claim whose twin would not mean what the consumer's claim means; the message says why."""


def pod_claims(pod: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(the pod's claim entry name, the consumer claim's name; None: its template's claim is not made yet)."""
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out: list[tuple[str, str | None]] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            out.append((name, str(entry["resourceClaimName"])))
        else:
            claim = statuses.get(name)
            out.append((name, str(claim) if claim else None))
    return out


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def twin_claim(claim: Mapping[str, Any], target: Target, device_class: Callable[[str], str | None]) -> dict[str, Any]:
    """The twin of the consumer's allocated `claim` for a pod on `target.node`; ClaimRefusedError.

    `device_class(device)`: the provider class a device of the node's published slice stands for.
    """
    meta = claim.get("metadata") or {}
    name = str(meta.get("name") or "")
    results = _results(claim)
    if not results:
        raise ClaimRefusedError(f"claim {name} is not allocated yet")
    elsewhere = [r for r in results if r.get("driver") != DRA_DRIVER or r.get("pool") != target.node]
    if elsewhere:
        r = elsewhere[0]
        raise ClaimRefusedError(
            f"claim {name} holds device {r.get('driver')}/{r.get('pool')}/{r.get('device')}, which is "
            f"not on virtual node {target.node}: a claim shared by pods on different nodes or providers "
            "cannot be offloaded"
        )
    spec = claim.get("spec") or {}
    devices = spec.get("devices") or {}
    if devices.get("config"):
        raise ClaimRefusedError(
            f"resourceclaim {name} carries driver configuration, which means nothing to the provider"
        )
    classes: dict[str, str] = {}
    for r in results:
        request = str(r.get("request") or "")
        provider_class = device_class(str(r.get("device") or ""))
        if provider_class is None:
            raise ClaimRefusedError(
                f"resourceclaim {name}: device {r.get('device')} is no longer offered by virtual node {target.node}"
            )
        if classes.setdefault(request, provider_class) != provider_class:
            raise ClaimRefusedError(
                f"resourceclaim {name}: request {request} got devices of different provider classes"
            )
    requests: list[dict[str, Any]] = []
    for request in devices.get("requests") or []:
        rname = str(request.get("name") or "")
        if request.get("firstAvailable"):
            raise ClaimRefusedError(
                f"resourceclaim {name}: request {rname} is a prioritized list, which is not offloaded"
            )
        exactly = dict(request.get("exactly") or {})
        if exactly.get("adminAccess"):
            raise ClaimRefusedError(
                f"resourceclaim {name}: request {rname} asks for admin access, which is not offloaded"
            )
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            raise ClaimRefusedError(
                f"resourceclaim {name}: request {rname} asks for all devices, which is not offloaded"
            )
        if rname not in classes:
            raise ClaimRefusedError(f"claim {name}: request {rname} has no allocated device")
        twin = {k: exactly[k] for k in ("selectors", "count", "tolerations", "capacity") if k in exactly}
        twin["deviceClassName"] = classes[rname]
        twin["allocationMode"] = "ExactCount"
        requests.append({"name": rname, "exactly": twin})
    constraints = []
    for c in devices.get("constraints") or []:
        attribute = str(c.get("matchAttribute") or "")
        if attribute.startswith(f"{DRA_DRIVER}/") or "/" not in attribute:
            raise ClaimRefusedError(
                f"resourceclaim {name}: constraint on {attribute or 'an attribute'} names gpufed's own "
                "attributes, which the provider's devices do not have"
            )
        constraints.append(dict(c))
    twin_devices: dict[str, Any] = {"requests": requests}
    if constraints:
        twin_devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": target.namespace,
            "labels": {**origin_labels(meta, target), ORIGIN_NODE_LABEL: target.node},
        },
        "spec": {"devices": twin_devices},
    }


def twin_pod_claims(pod: Mapping[str, Any], names: Mapping[str, str]) -> list[dict[str, Any]]:
    """The twin pod's `spec.resourceClaims`: each entry names its twin claim (`names`: entry -> claim)."""
    return [
        {"name": str(e.get("name")), "resourceClaimName": names[str(e.get("name"))]}
        for e in (pod.get("spec") or {}).get("resourceClaims") or []
    ]


def with_owner(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """`claim`'s ownerReferences with the twin `pod` added (None: it is there already). The provider's
    garbage collector removes the claim once no twin pod that uses it is left."""
    meta = pod.get("metadata") or {}
    refs = list((claim.get("metadata") or {}).get("ownerReferences") or [])
    if any(r.get("uid") == meta.get("uid") for r in refs):
        return None
    return [*refs, {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}]


def provider_allocation(claims: Sequence[Mapping[str, Any]]) -> str | None:
    """ "<driver>/<pool>/<device>, ..." of the twin claims' allocations (None: not all allocated).
    Names that are no DNS subdomains (the provider writes them) are shown as "?"."""
    shown: list[str] = []
    for claim in claims:
        results = _results(claim)
        if not results:
            return None
        for r in results:
            parts = [str(r.get(k) or "") for k in ("driver", "pool", "device")]
            shown.append("/".join(p if 0 < len(p) <= 253 and _DNS.match(p) else "?" for p in parts))
    if len(shown) > MAX_SHOWN:
        shown = [*shown[:MAX_SHOWN], f"and {len(shown) - MAX_SHOWN} more"]
    return ", ".join(shown)


__all__ = [
    "ClaimRefusedError",
    "pod_claims",
    "provider_allocation",
    "twin_claim",
    "twin_pod_claims",
    "with_owner",
]
