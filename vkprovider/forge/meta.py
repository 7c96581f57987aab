"""Twin metadata forge: what every remote twin (pod, token Secret, reflected object) carries.

Owns: `Target` (where a twin goes: consumer identity, owning virtual node, twin namespace), the
origin labels (`origin_labels`: consumer ClusterID, local UID, managed-by gpufed), the twin's
metadata as a whitelist of the local object's (`twin_metadata`: name, twin namespace, labels,
annotations without kubectl's last-applied and, for pods, without gpufed's own), the annotation
filter itself (`twin_annotations`), the consumer's `kube-root-ca.crt` name, the ownership test
every update or delete of a remote object must pass (`owned_by`), and the name rules of Kubernetes
(`is_dns_subdomain`, `is_dns_label`) that every name coming from a pod or a peer is checked against
before it is used to address an object.

Invariants: the origin labels are applied last, so a local label can never forge ownership; nothing
the API server assigns (uid, resourceVersion, managedFields, ...) or that points at consumer objects
(ownerReferences, finalizers) is copied.

Does not: shape a pod's spec (`forge.pods`), a token Secret (`forge.tokens`) or a reflected object's
content (`forge.reflection`); this is the bottom layer of `vkprovider.forge` and imports none of them.

Pure: no I/O, no client imports; inputs are never mutated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL

#: Annotation kubectl writes on `apply`: it describes the local object, not the twin.
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
#: Prefix of gpufed's own labels/annotations and of every label only virtual nodes carry.
GPUFED_PREFIX = "gpufed.io/"
#: ConfigMap every kube-api-access volume projects (the cluster's CA; each cluster has its own).
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
#: RFC 1123 label (namespaces, most names of a namespace's objects) and subdomain (ConfigMaps,
#: Secrets, ServiceAccounts, pods): what the API server accepts as an object's name.
MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_dns_label(name: str) -> bool:
    """Whether `name` is an RFC 1123 label (e.g. a namespace name)."""
    return len(name) <= MAX_DNS_LABEL and bool(_DNS_LABEL.fullmatch(name))


def is_dns_subdomain(name: str) -> bool:
    """Whether `name` is an RFC 1123 subdomain (e.g. a Secret's, ConfigMap's or pod's name)."""
    return len(name) <= MAX_DNS_SUBDOMAIN and bool(_DNS_SUBDOMAIN.fullmatch(name))


@dataclass(frozen=True)
class Target:
    """Where a twin goes: consumer identity, owning virtual node, twin namespace on the provider."""

    consumer: str
    node: str
    namespace: str
    provider: str = ""
    #: The virtual node's GPU pool product: the twin may only run on provider nodes of it.
    gpu_product: str | None = None


def twin_annotations(meta: Mapping[str, Any], *, drop_gpufed: bool) -> dict[str, str]:
    """The annotations of `meta` a twin carries: never last-applied, and gpufed's own only unless
    `drop_gpufed`."""
    out: dict[str, str] = {}
    for key, value in (meta.get("annotations") or {}).items():
        # last-applied describes the local object; a later `kubectl apply` against the provider would
        # compute a wrong three-way diff from it.
        if key == LAST_APPLIED_ANNOTATION:
            continue
        # gpufed.io/* annotations are our own bookkeeping on the consumer side (webhook decisions,
        # offloading state); on the provider they would be mistaken for the provider's own.
        if drop_gpufed and key.startswith(GPUFED_PREFIX):
            continue
        out[key] = value
    return out


def origin_labels(local_meta: Mapping[str, Any], target: Target) -> dict[str, str]:
    """The labels that make a remote object the twin of the local object `local_meta` describes."""
    return {
        ORIGIN_CLUSTER_LABEL: target.consumer,
        ORIGIN_UID_LABEL: str(local_meta.get("uid", "")),
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def twin_metadata(local: Mapping[str, Any], target: Target, extra_labels: Mapping[str, str]) -> dict[str, Any]:
    """The metadata of `local`'s twin in `target.namespace`: its labels with `extra_labels` on top
    (the origin labels go there), its annotations without gpufed's own."""
    # A whitelist, not a copy: ownerReferences point at consumer objects (the provider's garbage
    # collector would delete the twin at once), uid/resourceVersion/creationTimestamp/managedFields
    # are server-assigned, generateName is moot (the name is fixed), finalizers belong to consumer
    # controllers (nobody would remove them remotely), deletion fields are the server's.
    meta = local.get("metadata") or {}
    return {
        "name": meta.get("name", ""),
        "namespace": target.namespace,
        # origin labels last: a local label must not be able to forge ownership.
        "labels": {**(meta.get("labels") or {}), **extra_labels},
        "annotations": twin_annotations(meta, drop_gpufed=True),
    }


def owned_by(remote: Mapping[str, Any], consumer: str, uid: str | None = None) -> bool:
    """Whether `remote` is the twin of an object of `consumer` (of the object `uid` when given)."""
    labels = (remote.get("metadata") or {}).get("labels") or {}
    if labels.get(ORIGIN_CLUSTER_LABEL) != consumer:
        return False
    return uid is None or labels.get(ORIGIN_UID_LABEL) == uid
