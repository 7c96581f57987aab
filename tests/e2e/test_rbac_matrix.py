"""The RBAC matrix of every identity gpufed runs as, checked by the real API servers with SubjectAccessReviews.

Owns: one table (`MATRIX`) of rows (identity, cluster, verb, resource, namespace, name, expectation,
why) over a real peering of the consumer with gpu-a and gpu-b and an offloaded namespace, so that the
per-peering grants exist too: the consumer's RoleBindings in its tenant and twin namespaces on the
providers (peering.controllers.provider), the gateways' Roles naming their key Secrets
(netfabric.ops), the virtual kubelets' Role naming the peering's credentials Secret
(peering.controllers.credentials_access) and their reflection RoleBinding in the offloaded namespace
(peering.controllers.offloading). Each row is asked of the cluster's API server by the admin
context, for the identity as it presents itself (a certificate user with its groups, or a
ServiceAccount with `system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`);
rows of an identity with two subjects (certificate user and ServiceAccount) are asked for both.

Expectations: ALLOW rows are what the code does (the module is named in the row), DENY rows what
must stay out of reach. ADMISSION rows are denied too, but by an admission policy rather than RBAC,
for what RBAC alone cannot express (a node that is not the identity's own, a pod not bound to
one): RBAC lets the request through (asserted with the SubjectAccessReview, so that a row RBAC
starts to deny is moved to DENY), and a real request with the identity's credentials, sent as a
server-side dry run, is refused by the policy that names it (the ValidatingAdmissionPolicy
`gpufed-virtual-kubelet`, deploy/rbac/virtual-kubelet.yaml). GAP rows are allowed today although
they should not be, for a reason neither can express yet (a name chosen at run time): the row
asserts that they ARE allowed, so the day one is closed the test says to move it to DENY.

The consumer identity's real credentials are exercised in tests/e2e/test_peering.py
(`kubectl auth can-i` / real requests); here it is one identity among the others.

The virtual node's `system:node:<name>` identity: the kubelet-serving certificate a virtual
kubelet obtains (vkprovider.kubelet.servingcert) carries that subject, but its extended key usage is
server auth only, so the API server never accepts it as a client certificate; the test checks the
certificate the virtual node's kubelet API serves, rather than SARs for an identity nobody can present.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.apis.wire import (
    ESTIMATOR_CONFIGMAP,
    ESTIMATOR_TLS_SECRET,
    IDENTITY_CONFIGMAP,
    IDENTITY_SECRET,
    REFLECTION_ROLEBINDING,
    TYPE_LABEL,
    VIRTUAL_KUBELET_USER,
    VIRTUAL_NODE_TYPE,
    ClusterID,
    credentials_reader,
    pending_key_secret,
    remote_kubeconfig_secret,
    tenant_namespace,
    twin_namespace,
)
from gpufed.kube import rest
from peering.handshake import CONSUMER_GROUP, consumer_user
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, gpufed, offload, out, peered_session

pytestmark = pytest.mark.timeout(600)

Expect = Literal["ALLOW", "DENY", "ADMISSION", "GAP"]
ALLOW: Expect = "ALLOW"
DENY: Expect = "DENY"
ADMISSION: Expect = "ADMISSION"
GAP: Expect = "GAP"
#: The admission policy that refuses each identity's ADMISSION rows (deploy/rbac/<identity>.yaml).
POLICIES = {
    "virtual-kubelet": ("gpufed-virtual-kubelet",),
    "controller": ("gpufed-controller-pods", "gpufed-controller-volumes"),
}
#: A pod in kube-system, bound to no virtual node, that the ADMISSION rows aim at.
BYSTANDER_POD = "gpufed-rbac-bystander"

#: Who gpufed runs as: identity key -> subjects (user, groups). "{consumer}" is the consumer's ClusterID.
AUTHENTICATED = ("system:authenticated",)


def _sa(name: str, namespace: str = "gpufed") -> tuple[str, tuple[str, ...]]:
    return (
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", *AUTHENTICATED),
    )


IDENTITIES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    # deploy/rbac/controller.yaml: the local environment's certificate user and the chart's ServiceAccount
    "controller": (("gpufed:controller", AUTHENTICATED), _sa("gpufed-controller")),
    # deploy/rbac/virtual-kubelet.yaml (+ the reflection RoleBinding per offloaded namespace)
    "virtual-kubelet": (("gpufed:virtual-kubelet", AUTHENTICATED), _sa("gpufed-virtual-kubelet")),
    # deploy/rbac/gateway.yaml (+ a Role per peering naming its key Secret, netfabric.ops)
    "gateway": (_sa("gpufed-gateway"),),
    # deploy/rbac/gpu-agent.yaml
    "gpu-agent": (("gpufed:gpu-agent", AUTHENTICATED), _sa("gpufed-gpu-agent")),
    # deploy/rbac/consumer.yaml, bound per tenant/twin namespace by peering.controllers.provider;
    # the user of the client certificate the provider signed (peering.handshake)
    "consumer": ((consumer_user(ClusterID("{consumer}")), (CONSUMER_GROUP, *AUTHENTICATED)),),
}

# Placeholders, filled in from the live peering:
#   {ns}           the offloaded consumer namespace     {twin}     its twin on gpu-a
#   {tenant}       the consumer's tenant namespace on gpu-a
#   {other_tenant} another consumer's tenant namespace  {other_twin} another consumer's twin of {ns}
#   {peer}         gpu-a's ClusterID                    {consumer} the consumer's ClusterID
#   {vnode}        the consumer's virtual node for gpu-a; {node} a real (kwok) node of the cluster
#   {other_peer}   gpu-b's ClusterID
# Resources are written `resource[/subresource][.group]`; a leading "/" is a non-resource URL.
C, P = "consumer", "gpu-a"

# Short names of resources, for a table that fits the page.
GF = ".gpufed.io"
RB = "rolebindings.rbac.authorization.k8s.io"
CR = "clusterroles.rbac.authorization.k8s.io"
CSR = "certificatesigningrequests.certificates.k8s.io"
SIGNERS = "signers.certificates.k8s.io"
LEASES = "leases.coordination.k8s.io"
MWC = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
CRD = "customresourcedefinitions.apiextensions.k8s.io"
VAP = "validatingadmissionpolicies.admissionregistration.k8s.io"
VAPB = "validatingadmissionpolicybindings.admissionregistration.k8s.io"
ROLES = "roles.rbac.authorization.k8s.io"
PC = "priorityclasses.scheduling.k8s.io"
EXT_AUTH = "extension-apiserver-authentication"

Row = tuple[str, str, str, str, str, str, Expect, str]

# fmt: off
MATRIX: list[Row] = [
    # (identity, cluster, verb, resource, namespace, name, expectation, module that needs it / why not)
    # ---------------------------------------------------------------- the controller (every cluster)
    ("controller", C, "get", "namespaces", "", "kube-system", ALLOW, "peering/controllers/identity.py: ClusterID"),
    ("controller", C, "create", "configmaps", "gpufed", "", ALLOW, "peering/controllers/identity.py"),
    ("controller", C, "get", "secrets", "gpufed", IDENTITY_SECRET, ALLOW, "peering/controllers/identity.py"),
    ("controller", C, "create", "secrets", "gpufed", "", ALLOW, "peering/controllers/identity.py, consumer.py"),
    ("controller", C, "watch", "foreignclusters" + GF, "", "", ALLOW, "peering/controllers/consumer.py"),
    ("controller", C, "list", "resourceslices" + GF, "gpufed", "", ALLOW, "peering/controllers/consumer.py"),
    ("controller", C, "patch", "secrets", "gpufed", "{pending_key}", ALLOW, "peering/controllers/consumer.py"),
    ("controller", C, "delete", "secrets", "gpufed", "{pending_key}", ALLOW, "peering/controllers/consumer.py"),
    ("controller", C, "patch", "foreignclusters/status" + GF, "", "{peer}", ALLOW, "peering/controllers/status.py"),
    ("controller", C, "get", "secrets", "gpufed", "{remote_secret}", ALLOW, "peering/controllers/remotes.py"),
    # The virtual kubelets' Role naming the credentials Secret, per peering (a run-time name): the
    # controller holds get on that Secret itself, so the escalation check lets it grant it.
    ("controller", C, "create", ROLES, "gpufed", "", ALLOW, "peering/controllers/credentials_access.py"),
    ("controller", C, "patch", ROLES, "gpufed", "{reader}", ALLOW, "peering/controllers/credentials_access.py"),
    ("controller", C, "delete", ROLES, "gpufed", "{reader}", ALLOW, "peering/controllers/credentials_access.py"),
    ("controller", C, "watch", ROLES, "gpufed", "", ALLOW, "peering/controllers/credentials_access.py"),
    ("controller", C, "patch", RB, "gpufed", "{reader}", ALLOW, "peering/controllers/credentials_access.py"),
    ("controller", C, "watch", RB, "gpufed", "", ALLOW, "peering/controllers/credentials_access.py"),
    ("controller", C, "watch", "namespaceoffloadings" + GF, "", "", ALLOW, "peering/controllers/offloading.py"),
    ("controller", C, "patch", "namespaceoffloadings" + GF, "{ns}", "offloading", ALLOW, "offloading.py: finalizer"),
    ("controller", C, "patch", "namespaceoffloadings/status" + GF, "{ns}", "offloading", ALLOW, "offloading.py"),
    ("controller", C, "patch", "namespaces", "", "{ns}", ALLOW, "peering/controllers/offloading.py: label"),
    ("controller", C, "create", RB, "{ns}", "", ALLOW, "peering/controllers/offloading.py: reflection binding"),
    ("controller", C, "delete", RB, "{ns}", "gpufed-reflection", ALLOW, "peering/controllers/offloading.py"),
    ("controller", C, "bind", CR, "", "gpufed-virtual-kubelet-reflection", ALLOW, "offloading.py: binds it"),
    ("controller", C, "watch", "nodes", "", "", ALLOW, "offloading.py (virtual nodes), provider.py (capacity)"),
    ("controller", C, "get", CRD, "", "tenants.gpufed.io", ALLOW, "gpufed/app/controller.py: preflight"),
    ("controller", C, "get", CR, "", "gpufed-consumer-workloads", ALLOW, "gpufed/app/controller.py: preflight"),
    ("controller", C, "create", MWC, "", "", ALLOW, "vkprovider/webhook/server.py: first registration"),
    ("controller", C, "patch", MWC, "", "gpufed-offloading", ALLOW, "vkprovider/webhook/server.py"),
    ("controller", C, "update", "secrets", "gpufed", "gpufed-webhook-tls", ALLOW, "gpufed/kube/servingtls.py"),
    ("controller", C, "watch", CSR, "", "", ALLOW, "vkprovider/kubelet/csrapprove.py"),
    ("controller", C, "update", "certificatesigningrequests/approval.certificates.k8s.io", "", "x", ALLOW,
     "vkprovider/kubelet/csrapprove.py, peering/controllers/provider.py"),
    ("controller", C, "approve", SIGNERS, "", "kubernetes.io/kubelet-serving", ALLOW, "node/csrapprove.py"),
    ("controller", C, "watch", "foreignclusters" + GF, "", "", ALLOW, "gpufed/app/supervisor.py"),
    ("controller", C, "create", "events", "{ns}", "", ALLOW, "gpufed/kube/events.py"),
    ("controller", P, "watch", "tenants" + GF, "", "", ALLOW, "peering/controllers/provider.py"),
    ("controller", P, "patch", "tenants/status" + GF, "", "{consumer}", ALLOW, "peering/controllers/status.py"),
    ("controller", P, "patch", "resourceslices/status" + GF, "{tenant}", "x", ALLOW, "provider.py: grants"),
    ("controller", P, "patch", "twinnamespaces/status" + GF, "{tenant}", "{ns}", ALLOW, "provider.py: twins"),
    ("controller", P, "list", "twinnamespaces" + GF, "{tenant}", "", ALLOW, "peering/controllers/provider.py"),
    ("controller", P, "watch", "pods", "", "", ALLOW, "provider.py, gpupool/estimator/server.py: load"),
    ("controller", P, "create", "namespaces", "", "", ALLOW, "provider.py: tenant and twin namespaces"),
    ("controller", P, "patch", "namespaces", "", "{twin}", ALLOW, "provider.py: tenant and twin namespaces"),
    ("controller", P, "delete", "namespaces", "", "{twin}", ALLOW, "provider.py: twins nobody asks for"),
    ("controller", P, "patch", RB, "{tenant}", "gpufed-consumer-control", ALLOW, "provider.py: _bind"),
    ("controller", P, "create", RB, "{twin}", "", ALLOW, "provider.py: _bind"),
    ("controller", P, "bind", CR, "", "gpufed-consumer-workloads", ALLOW, "provider.py: _bind"),
    ("controller", P, "bind", CR, "", "gpufed-consumer-control", ALLOW, "provider.py: _bind"),
    ("controller", P, "patch", "resourcequotas", "{twin}", "gpufed-grant", ALLOW, "provider.py: enforcement"),
    ("controller", P, "create", "resourcequotas", "{tenant}", "", ALLOW, "provider.py: enforcement"),
    ("controller", P, "patch", "limitranges", "{twin}", "gpufed-grant", ALLOW, "provider.py: enforcement"),
    ("controller", P, "create", CSR, "", "", ALLOW, "provider.py: the consumer's client certificate"),
    ("controller", P, "approve", SIGNERS, "", "kubernetes.io/kube-apiserver-client", ALLOW, "provider.py"),
    ("controller", P, "get", "configmaps", "gpufed", "kube-root-ca.crt", ALLOW, "provider.py: the CA it publishes"),
    ("controller", P, "patch", "configmaps", "gpufed", ESTIMATOR_CONFIGMAP, ALLOW, "gpupool/estimator/server.py"),
    ("controller", P, "get", "secrets", "gpufed", ESTIMATOR_TLS_SECRET, ALLOW, "gpufed/kube/servingtls.py"),
    ("controller", P, "watch", "configmaps", "kube-system", EXT_AUTH, ALLOW, "estimator/server.py: client CA"),
    ("controller", P, "create", "events", "{tenant}", "", ALLOW, "gpufed/kube/events.py"),
    # The admission policies of consumer namespaces (peering.podsecurity), by name only.
    ("controller", P, "get", VAP, "", "gpufed-offload-policy", ALLOW, "tenant_namespaces.py: admission"),
    ("controller", P, "create", VAP, "", "gpufed-offload-policy", ALLOW, "tenant_namespaces.py: applied"),
    ("controller", P, "patch", VAP, "", "gpufed-offload-policy", ALLOW, "tenant_namespaces.py: admission"),
    ("controller", P, "create", VAPB, "", "gpufed-offload-policy", ALLOW, "tenant_namespaces.py: applied"),
    ("controller", P, "patch", VAPB, "", "gpufed-offload-policy", ALLOW, "tenant_namespaces.py: admission"),
    ("controller", P, "create", VAP, "", "gpufed-consumer-objects", ALLOW, "tenant_namespaces.py: applied"),
    ("controller", P, "patch", VAP, "", "gpufed-consumer-objects", ALLOW, "tenant_namespaces.py: admission"),
    ("controller", P, "create", VAPB, "", "gpufed-consumer-objects", ALLOW, "tenant_namespaces.py: applied"),
    ("controller", P, "patch", VAPB, "", "gpufed-consumer-objects", ALLOW, "tenant_namespaces.py: admission"),
    ("controller", P, "create", VAP, "", "gpufed-consumer-claims", ALLOW, "tenant_namespaces.py: applied"),
    ("controller", P, "patch", VAP, "", "gpufed-consumer-claims", ALLOW, "tenant_namespaces.py: admission"),
    ("controller", P, "create", VAPB, "", "gpufed-consumer-claims", ALLOW, "tenant_namespaces.py: applied"),
    ("controller", P, "patch", VAPB, "", "gpufed-consumer-claims", ALLOW, "tenant_namespaces.py: admission"),
    # Storage grants (read only): the offered classes, the static volumes, the consumers' claims.
    ("controller", P, "watch", "storageclasses.storage.k8s.io", "", "", ALLOW, "provider.py: offered classes"),
    ("controller", P, "watch", "persistentvolumes", "", "", ALLOW, "peering/controllers/provider.py: free volumes"),
    ("controller", P, "watch", "persistentvolumeclaims", "", "", ALLOW, "peering/controllers/provider.py: usage"),
    ("controller", P, "delete", "persistentvolumes", "", "x", DENY, "volumes (read only)"),
    # Shadow claims are named at run time: RBAC cannot narrow claim creation (gpufed-controller-volumes
    # allows only gpufed-local-* names, and none in a consumer's tenant or twin namespace).
    ("controller", P, "create", "persistentvolumeclaims", "{twin}", "", GAP, "claims are the consumer's"),
    ("controller", C, "create", "persistentvolumeclaims", "{ns}", "", ALLOW, "localstorage.py: shadow claims"),
    ("controller", C, "delete", "persistentvolumeclaims", "{ns}", "x", ALLOW, "localstorage.py: shadow claims"),
    ("controller", C, "patch", "persistentvolumes", "", "x", ALLOW, "localstorage.py: a volume handed to a claim"),
    ("controller", C, "create", "persistentvolumes", "", "", DENY, "volumes are provisioners' or admins'"),
    ("controller", C, "delete", "persistentvolumes", "", "x", DENY, "volume deletion"),
    ("controller", C, "update", "persistentvolumeclaims", "{ns}", "x", DENY, "users' claims are never changed"),
    ("controller", C, "delete", "persistentvolumeclaims", "kube-system", BYSTANDER_POD, ADMISSION, "users' claims"),
    ("controller", C, "patch", "persistentvolumes", "", BYSTANDER_POD, ADMISSION, "a bound volume's policy"),
    ("controller", P, "patch", "storageclasses.storage.k8s.io", "", "x", DENY, "the provider's classes"),
    # The global default PriorityClass the pod policy allows (read only).
    ("controller", P, "get", PC, "", "x", ALLOW, "peering/controllers/provider.py: default class"),
    ("controller", P, "list", PC, "", "", ALLOW, "peering/controllers/provider.py: default class"),
    ("controller", P, "watch", PC, "", "", ALLOW, "peering/controllers/provider.py: default class"),
    # The ranges a consumer's EndpointSlices may name (read only).
    ("controller", P, "get", "networkconfigs" + GF, "gpufed", "local", ALLOW, "tenant_namespaces.py: ranges"),
    ("controller", P, "get", "remotenetworks" + GF, "gpufed", "{consumer}", ALLOW, "tenant_namespaces.py: ranges"),
    ("controller", C, "create", "namespaces", "", "", ALLOW, "identity.py: gpufed; provider.py: tenants, twins"),
    # Twin namespaces are named at run time: RBAC cannot narrow namespace deletion (provider.py deletes
    # only namespaces labelled with the consumer, with a UID precondition).
    ("controller", C, "delete", "namespaces", "", "kube-system", GAP, "any namespace"),
    ("controller", C, "get", "secrets", "kube-system", "", DENY, "secrets outside gpufed"),
    ("controller", C, "list", "secrets", "", "", DENY, "secrets of every namespace"),
    ("controller", C, "get", "secrets", "{ns}", "", DENY, "a user namespace's secrets"),
    ("controller", P, "get", "secrets", "{tenant}", "", DENY, "the tenant's secrets"),
    ("controller", P, "get", "secrets", "{twin}", "", DENY, "the twin's secrets"),
    ("controller", C, "get", "configmaps", "kube-system", "kube-proxy", DENY, "kube-system config"),
    ("controller", C, "patch", "pods", "{ns}", "x", ALLOW, "vkprovider/gangs.py: releases a gated group"),
    ("controller", C, "patch", "pods/status", "{ns}", "x", ALLOW, "vkprovider/gangs.py: GangPlaced condition"),
    ("controller", C, "create", "pods/binding", "{ns}", "x", ALLOW, "vkprovider/gangs.py: binds a released group"),
    ("controller", C, "get", "jobs.batch", "{ns}", "x", ALLOW, "vkprovider/webhook/server.py: a pod's Job"),
    ("controller", C, "list", "jobs.batch", "", "", DENY, "listing Jobs (one Job is read by name)"),
    ("controller", C, "get", "jobsets.jobset.x-k8s.io", "{ns}", "x", ALLOW, "vkprovider/webhook/server.py: a JobSet"),
    ("controller", C, "list", "jobsets.jobset.x-k8s.io", "", "", DENY, "listing JobSets (one is read by name)"),
    ("controller", C, "patch", "jobsets.jobset.x-k8s.io", "{ns}", "x", DENY, "users' JobSets are never changed"),
    ("controller", C, "patch", "resourceflavors.kueue.x-k8s.io", "", "x", ALLOW, "vkprovider/kueue.py: flavors"),
    ("controller", C, "patch", "clusterqueues.kueue.x-k8s.io", "", "x", ALLOW, "vkprovider/kueue.py: GPU quotas"),
    ("controller", C, "delete", "clusterqueues.kueue.x-k8s.io", "", "x", DENY, "the admins' ClusterQueues"),
    ("controller", C, "create", "workloads.kueue.x-k8s.io", "default", "", DENY, "Kueue's workloads"),
    ("controller", C, "patch", "pods", "kube-system", BYSTANDER_POD, ADMISSION, "pods that are no gated group"),
    ("controller", C, "create", "pods/binding", "kube-system", BYSTANDER_POD, ADMISSION, "binding to a real node"),
    ("controller", C, "create", "pods", "{ns}", "", DENY, "it runs no workload"),
    ("controller", C, "delete", "pods", "kube-system", "", DENY, "pod deletion"),
    ("controller", C, "patch", "nodes", "", "{node}", DENY, "node writes"),
    ("controller", C, "delete", "nodes", "", "{vnode}", DENY, "node deletion (the virtual kubelet's)"),
    ("controller", C, "create", ROLES, "{ns}", "", DENY, "Roles outside gpufed"),
    ("controller", C, "create", ROLES, "kube-system", "", DENY, "Roles outside gpufed"),
    ("controller", C, "bind", ROLES, "gpufed", "", DENY, "it binds only what it holds (no bind)"),
    ("controller", P, "create", VAP, "", "other", DENY, "admission policies of other names"),
    ("controller", P, "patch", VAP, "", "gpufed-virtual-kubelet", DENY, "the policy confining the virtual kubelets"),
    ("controller", P, "delete", VAP, "", "gpufed-offload-policy", DENY, "removing the pod policy"),
    ("controller", P, "delete", VAPB, "", "gpufed-consumer-objects", DENY, "removing the objects policy"),
    ("controller", P, "create", PC, "", "", DENY, "priority classes (read only)"),
    ("controller", P, "patch", "networkconfigs" + GF, "gpufed", "local", DENY, "the fabric's ranges (read only)"),
    ("controller", C, "update", CR, "", "gpufed-consumer-workloads", DENY, "rewriting the roles it binds"),
    ("controller", C, "bind", CR, "", "admin", DENY, "binding roles other than gpufed's"),
    ("controller", C, "escalate", CR, "", "", DENY, "escalate"),
    ("controller", P, "approve", SIGNERS, "", "kubernetes.io/legacy-unknown", DENY, "approval for other signers"),
    ("controller", C, "delete", MWC, "", "gpufed-offloading", DENY, "it never deletes its webhook"),
    ("controller", C, "patch", MWC, "", "other", DENY, "other webhooks"),
    ("controller", C, "update", CRD, "", "tenants.gpufed.io", DENY, "it installs no CRD"),
    ("controller", C, "create", LEASES, "kube-node-lease", "", DENY, "node leases"),
    # ---------------------------------------------------------------- the virtual kubelet (consumer)
    ("virtual-kubelet", C, "get", "configmaps", "gpufed", IDENTITY_CONFIGMAP, ALLOW, "app/virtual_kubelet.py"),
    ("virtual-kubelet", C, "get", "secrets", "gpufed", "{remote_secret}", ALLOW,
     "app/virtual_kubelet.py: its peering's Role, peering/controllers/credentials_access.py"),
    ("virtual-kubelet", C, "watch", "foreignclusters" + GF, "", "", ALLOW, "app/virtual_kubelet.py"),
    ("virtual-kubelet", C, "watch", "resourceslices" + GF, "gpufed", "", ALLOW, "remote/provider.py"),
    ("virtual-kubelet", C, "create", "nodes", "", "", ALLOW, "node/node.py: registers its node"),
    ("virtual-kubelet", C, "patch", "nodes/status", "", "{vnode}", ALLOW, "node/node.py: status"),
    ("virtual-kubelet", C, "patch", "nodes", "", "{vnode}", ALLOW, "node/node.py: labels"),
    ("virtual-kubelet", C, "delete", "nodes", "", "{vnode}", ALLOW, "node/node.py: unregister"),
    ("virtual-kubelet", C, "update", LEASES, "kube-node-lease", "{vnode}", ALLOW, "node/node.py: lease"),
    ("virtual-kubelet", C, "create", LEASES, "kube-node-lease", "", ALLOW, "node/node.py: lease"),
    ("virtual-kubelet", C, "watch", "pods", "", "", ALLOW, "node/pods.py: spec.nodeName=<its node>"),
    ("virtual-kubelet", C, "patch", "pods/status", "{ns}", "x", ALLOW, "node/pods.py"),
    ("virtual-kubelet", C, "list", "persistentvolumeclaims", "", "", ALLOW, "remote/volumes.py: claims to provision"),
    ("virtual-kubelet", C, "create", "persistentvolumes", "", "", ALLOW, "remote/volumes.py: virtual volumes"),
    ("virtual-kubelet", C, "delete", "persistentvolumes", "", "x", ALLOW, "remote/volumes.py: released volumes"),
    ("virtual-kubelet", C, "update", "persistentvolumeclaims", "{ns}", "x", DENY, "users' claims"),
    ("virtual-kubelet", C, "delete", "persistentvolumeclaims", "{ns}", "x", DENY, "users' claims"),
    ("virtual-kubelet", C, "delete", "pods", "{ns}", "x", ALLOW, "node/pods.py: grace 0"),
    ("virtual-kubelet", C, "create", "events", "{ns}", "", ALLOW, "gpufed/kube/events.py"),
    ("virtual-kubelet", C, "get", "secrets", "{ns}", "x", ALLOW, "remote/references.py: a pod's references"),
    ("virtual-kubelet", C, "get", "configmaps", "{ns}", "x", ALLOW, "remote/references.py: a pod's references"),
    ("virtual-kubelet", C, "watch", "secrets", "{ns}", "", ALLOW, "remote/reflection.py"),
    ("virtual-kubelet", C, "watch", "services", "{ns}", "", ALLOW, "remote/reflection.py"),
    ("virtual-kubelet", C, "watch", "endpointslices.discovery.k8s.io", "{ns}", "", ALLOW, "remote/reflection.py"),
    ("virtual-kubelet", C, "watch", "ingresses.networking.k8s.io", "{ns}", "", ALLOW, "remote/reflection.py"),
    ("virtual-kubelet", C, "get", "configmaps", "{ns}", "kube-root-ca.crt", ALLOW, "remote/tokens.py"),
    ("virtual-kubelet", C, "create", "serviceaccounts/token", "{ns}", "default", ALLOW, "remote/tokens.py"),
    ("virtual-kubelet", C, "watch", "namespaces", "", "{ns}", ALLOW, "remote/reflection.py: allow-list"),
    ("virtual-kubelet", C, "get", "namespaceoffloadings" + GF, "{ns}", "offloading", ALLOW, "remote/reflection.py"),
    ("virtual-kubelet", C, "list", "namespaceoffloadings" + GF, "", "", ALLOW, "vkprovider/remote/offloaded.py"),
    ("virtual-kubelet", C, "watch", "namespaceoffloadings" + GF, "", "", ALLOW, "vkprovider/remote/offloaded.py"),
    ("virtual-kubelet", C, "create", "tokenreviews.authentication.k8s.io", "", "", ALLOW, "node/kubeletauth.py"),
    ("virtual-kubelet", C, "create", "subjectaccessreviews.authorization.k8s.io", "", "", ALLOW,
     "node/kubeletauth.py"),
    ("virtual-kubelet", C, "get", "configmaps", "kube-system", EXT_AUTH, ALLOW, "node/servingcert.py: client CA"),
    ("virtual-kubelet", C, "create", CSR, "", "", ALLOW, "node/servingcert.py"),
    ("virtual-kubelet", C, "get", CSR, "", "x", ALLOW, "node/servingcert.py"),
    ("virtual-kubelet", C, "delete", CSR, "", "x", ALLOW, "node/servingcert.py"),
    ("virtual-kubelet", C, "watch", "remotenetworks" + GF, "gpufed", "", ALLOW, "netfabric/controllers/translator.py"),
    ("virtual-kubelet", C, "get", "networkconfigs" + GF, "gpufed", "local", ALLOW, "netfabric/.../translator.py"),
    ("virtual-kubelet", C, "get", "secrets", "kube-system", "x", DENY, "secrets outside offloaded namespaces"),
    ("virtual-kubelet", C, "get", "secrets", "default", "x", DENY, "a namespace that is not offloaded"),
    ("virtual-kubelet", C, "get", "configmaps", "default", "x", DENY, "a namespace that is not offloaded"),
    ("virtual-kubelet", C, "list", "secrets", "", "", DENY, "secrets of every namespace"),
    ("virtual-kubelet", C, "list", "secrets", "gpufed", "", DENY, "listing gpufed's credentials"),
    ("virtual-kubelet", C, "watch", "secrets", "gpufed", "", DENY, "watching gpufed's Secrets"),
    ("virtual-kubelet", C, "get", "secrets", "gpufed", "{pending_key}", DENY, "the pending CSR key"),
    ("virtual-kubelet", C, "get", "secrets", "gpufed", "gpufed-webhook-tls", DENY, "the webhook's serving key"),
    ("virtual-kubelet", C, "patch", "secrets", "gpufed", "{remote_secret}", DENY, "rewriting its credentials"),
    ("virtual-kubelet", C, "get", "configmaps", "gpufed", ESTIMATOR_CONFIGMAP, DENY, "the identity ConfigMap only"),
    ("virtual-kubelet", C, "patch", ROLES, "gpufed", "{reader}", DENY, "widening its own Role"),
    ("virtual-kubelet", C, "get", "configmaps", "kube-system", "kube-proxy", DENY, "config it does not read"),
    ("virtual-kubelet", C, "create", "secrets", "{ns}", "", DENY, "writes in the consumer's namespaces"),
    ("virtual-kubelet", C, "create", "pods", "{ns}", "", DENY, "creating pods"),
    ("virtual-kubelet", C, "update", "pods", "{ns}", "x", DENY, "rewriting pod specs"),
    ("virtual-kubelet", C, "create", "pods/exec", "{ns}", "x", DENY, "exec (it serves exec, never asks for it)"),
    ("virtual-kubelet", C, "create", "serviceaccounts/token", "kube-system", "default", DENY, "tokens elsewhere"),
    ("virtual-kubelet", C, "patch", "namespaces", "", "{ns}", DENY, "namespace writes"),
    ("virtual-kubelet", C, "update", "certificatesigningrequests/approval.certificates.k8s.io", "", "x", DENY,
     "approving its own CSR"),
    ("virtual-kubelet", C, "approve", SIGNERS, "", "kubernetes.io/kubelet-serving", DENY, "approving its own CSR"),
    ("virtual-kubelet", C, "create", "foreignclusters" + GF, "", "", DENY, "peering objects"),
    ("virtual-kubelet", C, "update", LEASES, "gpufed", "gpufed-controller", DENY, "the controller's leader lease"),
    ("virtual-kubelet", C, "create", RB, "{ns}", "", DENY, "RBAC writes"),
    # RBAC cannot name what is chosen at run time: it lets the virtual kubelet write every Node, pods of
    # every namespace and every node Lease; the ValidatingAdmissionPolicy gpufed-virtual-kubelet
    # confines it to gpufed virtual nodes, the pods bound to them and their Leases.
    ("virtual-kubelet", C, "patch", "nodes", "", "{node}", ADMISSION, "another node"),
    ("virtual-kubelet", C, "delete", "nodes", "", "{node}", ADMISSION, "another node"),
    ("virtual-kubelet", C, "delete", "pods", "kube-system", BYSTANDER_POD, ADMISSION, "pods not bound to its node"),
    ("virtual-kubelet", C, "create", LEASES, "kube-node-lease", "{node}", ADMISSION, "another node's lease"),
    ("virtual-kubelet", C, "create", "persistentvolumes", "", "pv-x", ADMISSION, "a volume that is not gpufed's"),
    # The static Role in gpufed grants no Secret; the peering's credentials Secret is granted by name,
    # per peering (Role {reader}): the cluster's identity key and the tunnels' keys are out of reach.
    ("virtual-kubelet", C, "get", "secrets", "gpufed", IDENTITY_SECRET, DENY, "the cluster's identity key"),
    ("virtual-kubelet", C, "get", "secrets", "gpufed", "gpufed-wg-{peer}", DENY, "a tunnel's private key"),
    # ---------------------------------------------------------------- the gateway agent (both sides)
    ("gateway", C, "get", "gateways" + GF, "gpufed", "{peer}", ALLOW, "netfabric/controllers/gateway.py"),
    ("gateway", C, "watch", "gateways" + GF, "gpufed", "", ALLOW, "netfabric/controllers/gateway.py"),
    ("gateway", C, "watch", "remotenetworks" + GF, "gpufed", "", ALLOW, "netfabric/controllers/gateway.py"),
    ("gateway", C, "get", "networkconfigs" + GF, "gpufed", "local", ALLOW, "netfabric/controllers/gateway.py"),
    ("gateway", C, "patch", "gateways/status" + GF, "gpufed", "{peer}", ALLOW, "netfabric/controllers/gateway.py"),
    ("gateway", C, "patch", "connections/status" + GF, "gpufed", "{peer}", ALLOW, "netfabric/controllers/gateway.py"),
    ("gateway", C, "patch", "remotenetworks/status" + GF, "gpufed", "{peer}", ALLOW, "gateway.py: its Ready"),
    ("gateway", C, "patch", "networkconfigs/status" + GF, "gpufed", "local", ALLOW, "gateway.py: its Ready"),
    ("gateway", C, "get", "secrets", "gpufed", "gpufed-wg-{peer}", ALLOW, "gateway.py: its key (netfabric.ops Role)"),
    ("gateway", P, "get", "secrets", "gpufed", "gpufed-wg-{consumer}", ALLOW, "gateway.py: its key (ops Role)"),
    ("gateway", C, "get", "secrets", "gpufed", IDENTITY_SECRET, DENY, "other Secrets of gpufed"),
    ("gateway", C, "get", "secrets", "gpufed", "{remote_secret}", DENY, "the peering's credentials"),
    ("gateway", C, "list", "secrets", "gpufed", "", DENY, "listing Secrets"),
    ("gateway", C, "get", "secrets", "gpufed", "gpufed-wg-unknown", DENY, "a key of no peering"),
    ("gateway", C, "patch", "gateways" + GF, "gpufed", "{peer}", DENY, "its spec is the operator's"),
    ("gateway", C, "patch", "remotenetworks" + GF, "gpufed", "{peer}", DENY, "the address mapping"),
    ("gateway", C, "get", "gateways" + GF, "default", "", DENY, "outside gpufed"),
    ("gateway", C, "get", "nodes", "", "{node}", DENY, "a node by name: only list/watch"),
    ("gateway", C, "get", "pods", "gpufed", "", DENY, "a pod by name: only list/watch"),
    ("gateway", C, "watch", "pods", "", "", ALLOW, "netfabric/controllers/members.py: member pods"),
    ("gateway", C, "watch", "nodes", "", "", ALLOW, "members.py: the provider's virtual nodes"),
    ("gateway", P, "watch", "namespaces", "", "", ALLOW, "members.py: the consumer's namespaces"),
    ("gateway", P, "list", "pods", "", "", ALLOW, "members.py: twin pods"),
    ("gateway", P, "patch", "pods", "default", "", DENY, "writing pods"),
    ("gateway", P, "patch", "namespaces", "", "default", DENY, "writing namespaces"),
    ("gateway", C, "list", "secrets", "", "", DENY, "Secrets cluster-wide"),
    ("gateway", C, "list", "configmaps", "", "", DENY, "ConfigMaps cluster-wide"),
    # ---------------------------------------------------------------- the GPU node agent (providers)
    ("gpu-agent", P, "get", "nodes", "", "{node}", ALLOW, "gpupool/agent/agent.py"),
    ("gpu-agent", P, "patch", "nodes", "", "{node}", ALLOW, "gpupool/agent/agent.py: labels, annotations"),
    ("gpu-agent", P, "list", "nodes", "", "", DENY, "only its own node, by name"),
    ("gpu-agent", P, "patch", "nodes/status", "", "{node}", DENY, "node status (capacity is the kubelet's)"),
    ("gpu-agent", P, "delete", "nodes", "", "{node}", DENY, "node deletion"),
    ("gpu-agent", P, "create", "nodes", "", "", DENY, "node registration"),
    ("gpu-agent", P, "get", "pods", "", "", DENY, "pods"),
    ("gpu-agent", P, "get", "secrets", "gpufed", "", DENY, "secrets"),
    ("gpu-agent", P, "get", "configmaps", "gpufed", "", DENY, "config"),
    # ---------------------------------------------------------------- the consumer's identity on a provider
    ("consumer", P, "patch", "resourceslices" + GF, "{tenant}", "x", ALLOW, "peering/controllers/consumer.py"),
    ("consumer", P, "delete", "resourceslices" + GF, "{tenant}", "x", ALLOW, "peering/controllers/consumer.py"),
    ("consumer", P, "patch", "twinnamespaces" + GF, "{tenant}", "{ns}", ALLOW, "peering/controllers/offloading.py"),
    ("consumer", P, "watch", "twinnamespaces" + GF, "{tenant}", "", ALLOW, "vkprovider/remote/provider.py"),
    ("consumer", P, "get", "configmaps", "gpufed", ESTIMATOR_CONFIGMAP, ALLOW, "gpupool/estimator/client.py"),
    ("consumer", P, "create", "pods", "{twin}", "", ALLOW, "vkprovider/remote/provider.py: twins"),
    ("consumer", P, "patch", "pods", "{twin}", "x", ALLOW, "vkprovider/remote/provider.py"),
    ("consumer", P, "delete", "pods", "{twin}", "x", ALLOW, "vkprovider/remote/provider.py"),
    ("consumer", P, "watch", "events", "{twin}", "", ALLOW, "vkprovider/remote/provider.py: remote events"),
    ("consumer", P, "patch", "secrets", "{twin}", "x", ALLOW, "remote/references.py, remote/tokens.py"),
    ("consumer", P, "list", "secrets", "{twin}", "", ALLOW, "vkprovider/remote/tokens.py"),
    ("consumer", P, "patch", "endpointslices.discovery.k8s.io", "{twin}", "x", ALLOW, "remote/reflection.py"),
    ("consumer", P, "patch", "services", "{twin}", "x", ALLOW, "vkprovider/remote/reflection.py"),
    ("consumer", P, "get", "pods/log", "{twin}", "x", ALLOW, "vkprovider/remote/streaming.py"),
    ("consumer", P, "create", "pods/exec", "{twin}", "x", ALLOW, "vkprovider/remote/streaming.py"),
    ("consumer", P, "create", "pods/portforward", "{twin}", "x", ALLOW, "vkprovider/remote/streaming.py"),
    ("consumer", P, "list", "pods.metrics.k8s.io", "{twin}", "", ALLOW, "vkprovider/remote/streaming.py: top"),
    ("consumer", P, "watch", "ingressclasses.networking.k8s.io", "", "", ALLOW, "vkprovider/remote/reflection.py"),
    ("consumer", P, "get", "/version", "", "", ALLOW, "vkprovider/remote/provider.py: health"),
    ("consumer", P, "create", "persistentvolumeclaims", "{twin}", "", ALLOW, "vkprovider/remote/volumes.py"),
    ("consumer", P, "watch", "persistentvolumeclaims", "{twin}", "", ALLOW, "vkprovider/remote/volumes.py"),
    ("consumer", P, "delete", "persistentvolumeclaims", "{twin}", "x", ALLOW, "vkprovider/remote/volumes.py"),
    ("consumer", P, "patch", "persistentvolumeclaims", "{twin}", "x", DENY, "a claim is never changed"),
    ("consumer", P, "update", "persistentvolumeclaims", "{twin}", "x", DENY, "a claim is never changed"),
    ("consumer", P, "create", "persistentvolumeclaims", "{other_twin}", "", DENY, "another consumer's twin"),
    ("consumer", P, "get", "persistentvolumes", "", "x", DENY, "volumes (the provider binds them)"),
    ("consumer", P, "list", "storageclasses.storage.k8s.io", "", "", DENY, "the offer comes with the grant"),
    ("consumer", P, "patch", "resourceslices/status" + GF, "{tenant}", "x", DENY, "its grant is the provider's"),
    ("consumer", P, "patch", "twinnamespaces/status" + GF, "{tenant}", "{ns}", DENY, "provider-written"),
    ("consumer", P, "get", "tenants" + GF, "", "{consumer}", DENY, "tenants"),
    ("consumer", P, "patch", "resourcequotas", "{twin}", "gpufed-grant", DENY, "its own quota"),
    ("consumer", P, "create", "namespaces", "", "", DENY, "namespaces (twins come through the controller)"),
    ("consumer", P, "get", "secrets", "{other_tenant}", "x", DENY, "another tenant's secrets"),
    ("consumer", P, "create", "pods", "{other_twin}", "", DENY, "another consumer's twin"),
    ("consumer", P, "get", "secrets", "gpufed", ESTIMATOR_TLS_SECRET, DENY, "the provider's secrets"),
    ("consumer", P, "get", "configmaps", "gpufed", IDENTITY_CONFIGMAP, DENY, "only the estimator's ConfigMap"),
    ("consumer", P, "create", "pods", "default", "", DENY, "pods outside its twins"),
    ("consumer", P, "list", "pods", "", "", DENY, "every pod"),
    ("consumer", P, "get", "nodes", "", "{node}", DENY, "nodes (capacity comes from the estimator)"),
    ("consumer", P, "create", RB, "{tenant}", "", DENY, "RBAC in its tenant"),
    ("consumer", P, "create", CSR, "", "", ALLOW, "peering/controllers/renewal.py: renewal request"),
    ("consumer", P, "get", CSR, "", "x", ALLOW, "peering/controllers/renewal.py: the issued certificate"),
    ("consumer", P, "list", CSR, "", "", DENY, "other consumers' requests"),
    ("consumer", P, "watch", CSR, "", "", DENY, "other consumers' requests"),
    ("consumer", P, "delete", CSR, "", "x", DENY, "requests (the CSR cleaner removes them)"),
    ("consumer", P, "update", CSR, "", "x", DENY, "requests once filed"),
    ("consumer", C, "get", "secrets", "gpufed", "x", DENY, "the provider's user means nothing on the consumer"),
]

#: Asked for EVERY identity (the consumer's on gpu-a): cluster-wide writes, impersonation, escalation, approval.
FOR_EVERY_IDENTITY: list[Row] = [
    ("*", C, "create", "namespaces", "", "", DENY, "cluster-scoped writes"),
    ("*", C, "delete", "namespaces", "", "kube-system", DENY, "cluster-scoped writes"),
    ("*", C, "create", CR, "", "", DENY, "cluster-scoped writes"),
    ("*", C, "create", "clusterrolebindings.rbac.authorization.k8s.io", "", "", DENY, "cluster-scoped writes"),
    ("*", C, "create", CRD, "", "", DENY, "CRDs"),
    ("*", C, "delete", CRD, "", "tenants.gpufed.io", DENY, "CRDs"),
    ("*", C, "create", "validatingwebhookconfigurations.admissionregistration.k8s.io", "", "", DENY, "webhooks"),
    ("*", C, "create", "validatingadmissionpolicies.admissionregistration.k8s.io", "", "", DENY, "admission"),
    ("*", C, "get", "secrets", "kube-system", "x", DENY, "kube-system secrets"),
    ("*", C, "impersonate", "users", "", "gpufed-local-admin", DENY, "impersonation"),
    ("*", C, "impersonate", "groups", "", "system:masters", DENY, "impersonation"),
    ("*", C, "impersonate", "serviceaccounts", "kube-system", "default", DENY, "impersonation"),
    ("*", C, "escalate", "roles.rbac.authorization.k8s.io", "gpufed", "", DENY, "escalate"),
    ("*", C, "bind", CR, "", "cluster-admin", DENY, "bind"),
    ("*", C, "approve", SIGNERS, "", "kubernetes.io/kube-apiserver-client-kubelet", DENY, "CSR approval"),
    ("*", C, "create", "pods/exec", "kube-system", "x", DENY, "exec on ordinary pods"),
    ("*", C, "create", "nodes/proxy", "", "{node}", DENY, "the kubelet API of real nodes"),
    ("*", C, "get", "*", "", "", DENY, "wildcards"),
]
# fmt: on


def expand() -> list[Row]:
    """MATRIX plus FOR_EVERY_IDENTITY for each identity (the consumer's on the provider it is peered with),
    except where MATRIX asks the same question of that identity."""
    rows = list(MATRIX)
    own = {row[:6] for row in MATRIX}  # an identity's own row on the same question wins
    for who in IDENTITIES:
        for _, cluster, verb, resource, namespace, name, expect, why in FOR_EVERY_IDENTITY:
            row = (who, P if who == "consumer" else cluster, verb, resource, namespace, name, expect, why)
            if row[:6] not in own:
                rows.append(row)
    return rows


@dataclass(frozen=True)
class Peering:
    consumer: ClusterID
    provider: ClusterID
    namespace: str
    vnode: str
    #: context -> a real (kwok) node of that cluster
    nodes: dict[str, str]

    def fill(self, template: str) -> str:
        other = ClusterID("0123456789abcdef")
        return template.format(
            consumer=self.consumer,
            peer=self.provider,
            ns=self.namespace,
            twin=twin_namespace(self.namespace, self.consumer),
            tenant=tenant_namespace(self.consumer),
            other_tenant=tenant_namespace(other),
            other_twin=twin_namespace(self.namespace, other),
            remote_secret=remote_kubeconfig_secret(self.provider),
            pending_key=pending_key_secret(self.provider),
            reader=credentials_reader(self.provider),
            vnode=self.vnode,
            node="{node}",
        )


@pytest.fixture(scope="module")
def peering(clusters: Clusters) -> Iterator[Peering]:
    """The consumer peered with gpu-a (network included) and a namespace offloaded to it."""
    session = peered_session(clusters, {P: ()})
    ids = next(session)
    ns = f"rbac-{secrets.token_hex(3)}"
    twin = twin_namespace(ns, ids[C])
    clusters.kubectl(C, "create", "namespace", ns)
    try:
        offload(clusters, ns)
        eventually("the twin namespace", lambda: clusters.kubectl(P, "get", "ns", twin, check=False).returncode == 0)
        binding = ("get", "rolebinding", "-n", ns, REFLECTION_ROLEBINDING)
        eventually("the reflection RoleBinding", lambda: clusters.kubectl(C, *binding, check=False).returncode == 0)
        vnodes = clusters.kubectl_json(C, "get", "nodes", "-l", f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}")["items"]
        assert len(vnodes) == 1, [n["metadata"]["name"] for n in vnodes]
        nodes = {}
        for ctx in (C, P):
            real = clusters.kubectl_json(ctx, "get", "nodes", "-l", f"!{TYPE_LABEL}")["items"]
            nodes[ctx] = real[0]["metadata"]["name"]
        yield Peering(ids[C], ids[P], ns, vnodes[0]["metadata"]["name"], nodes)
    finally:
        p = gpufed("unoffload-namespace", ns, "--kubeconfig", str(clusters.kubeconfig), "--context", C)
        clusters.kubectl(C, "delete", "namespace", ns, "--wait=false", check=False)
        next(session, None)  # unpeer, and check that nothing is left
        assert p.returncode == 0, out(p)


def review(user: str, groups: tuple[str, ...], verb: str, resource: str, namespace: str, name: str) -> dict[str, Any]:
    """The SubjectAccessReview asking whether (user, groups) may `verb` `resource[/sub][.group]`."""
    spec: dict[str, Any] = {"user": user, "groups": list(groups)}
    if resource.startswith("/"):
        spec["nonResourceAttributes"] = {"path": resource, "verb": verb}
    else:
        res, _, group = resource.partition(".")
        plural, _, sub = res.partition("/")
        spec["resourceAttributes"] = {
            "verb": verb,
            "group": group,
            "resource": plural,
            "subresource": sub,
            "namespace": namespace,
            "name": name,
        }
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


async def test_every_identity_may_do_what_its_code_does_and_nothing_that_matters_beyond(
    clusters: Clusters, api: dict[str, Any], peering: Peering
) -> None:
    rows = expand()
    checks: list[tuple[str, str, dict[str, Any], Expect, str]] = []
    for who, cluster, verb, resource, namespace, name, expect, why in rows:
        for user, groups in IDENTITIES[who]:
            ns, nm = peering.fill(namespace), peering.fill(name).replace("{node}", peering.nodes[cluster])
            body = review(peering.fill(user), groups, verb, resource, ns, nm)
            label = f"{peering.fill(user)} {verb} {resource} ns={ns or '-'} name={nm or '-'} on {cluster} ({why})"
            checks.append((cluster, label, body, expect, who))
    sem = asyncio.Semaphore(8)

    async def ask(cluster: str, body: dict[str, Any]) -> tuple[bool, str]:
        async with sem:
            got = await rest.request(
                api[cluster], "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body
            )
        status = got.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or "")

    answers = await asyncio.gather(*(ask(cluster, body) for cluster, _, body, _, _ in checks))
    wrong = []
    for (_, label, _, expect, _), (allowed, reason) in zip(checks, answers, strict=True):
        if expect == ALLOW and not allowed:
            wrong.append(f"DENIED but the code needs it: {label}")
        elif expect == DENY and allowed:
            wrong.append(f"ALLOWED but must be denied: {label} -- {reason}")
        elif expect == GAP and not allowed:
            wrong.append(f"a known gap is closed, move the row to DENY: {label}")
        elif expect == ADMISSION and not allowed:
            wrong.append(f"RBAC now denies what admission used to, move the row to DENY: {label}")
    counts = {e: sum(1 for c in checks if c[3] == e) for e in (ALLOW, DENY, ADMISSION, GAP)}
    per_identity = {who: sum(1 for c in checks if c[4] == who) for who in IDENTITIES}
    print(f"{len(checks)} SubjectAccessReviews ({len(rows)} rows): {counts}; per identity {per_identity}")
    assert len(checks) >= 100
    assert not wrong, f"{len(wrong)} of {len(checks)} checks wrong:\n" + "\n".join(wrong)


async def test_the_virtual_nodes_serving_certificate_is_no_client_identity(
    clusters: Clusters, peering: Peering
) -> None:
    """`system:node:<virtual node>` exists only as a serving certificate: server auth, never client auth."""
    node = clusters.kubectl_json(C, "get", "node", peering.vnode)
    address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    port = int(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])

    def served() -> x509.Certificate:
        return x509.load_pem_x509_certificate(ssl.get_server_certificate((address, port), timeout=10).encode())

    cert = await asyncio.to_thread(served)
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    assert cns == [f"system:node:{peering.vnode}"], cns
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    assert ExtendedKeyUsageOID.CLIENT_AUTH not in eku, "the serving certificate would authenticate as a node"


def _as_identity(clusters: Clusters, who: str, user: str, groups: tuple[str, ...]) -> list[str]:
    """kubectl flags that act as (user, groups) on the consumer: the identity's own client
    certificate where the local environment issued one, else impersonation by the admin."""
    if who == "virtual-kubelet" and user == VIRTUAL_KUBELET_USER:
        return [f"--kubeconfig={clusters.env.kubeconfig_path(C, 'gpufed-virtual-kubelet')}"]
    return [
        f"--kubeconfig={clusters.kubeconfig}",
        f"--context={C}",
        f"--as={user}",
        *(f"--as-group={g}" for g in groups),
    ]


def _real_request(verb: str, resource: str, namespace: str, name: str) -> tuple[list[str], str | None]:
    """The kubectl arguments (and stdin) of a server-side dry run of one ADMISSION row."""
    dry = "--dry-run=server"
    if verb == "patch" and resource == "nodes":
        label = json.dumps({"metadata": {"labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE}}})
        return ["patch", "node", name, "--type=merge", "-p", label, dry], None
    if verb == "patch" and resource == "pods":
        label = json.dumps({"metadata": {"labels": {"example.com/touched": "yes"}}})
        return ["patch", "pod", name, "-n", namespace, "--type=merge", "-p", label, dry], None
    if verb == "patch" and resource == "persistentvolumes":
        policy = json.dumps({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})
        return ["patch", "pv", name, "--type=merge", "-p", policy, dry], None
    if verb == "delete" and resource in ("nodes", "pods", "persistentvolumeclaims"):
        return ["delete", resource, name, *(["-n", namespace] if namespace else []), dry], None
    if verb == "create" and resource == LEASES:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40},
        }
        return ["create", "-f", "-", dry], json.dumps(lease)
    if verb == "create" and resource == "persistentvolumes":
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/var/lib/kubelet"},
            },
        }
        return ["create", "-f", "-", dry], json.dumps(volume)
    if verb == "create" and resource == "pods/binding":
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "consumer-control-plane"},
        }
        url = f"/api/v1/namespaces/{namespace}/pods/{name}/binding?dryRun=All"
        return ["create", "--raw", url, "-f", "-"], json.dumps(binding)
    raise AssertionError(f"no real request for an ADMISSION row {verb} {resource}: add one here")


def _remove_bystanders(clusters: Clusters) -> None:
    for kind, namespace in (("pod", "kube-system"), ("pvc", "kube-system"), ("pv", "")):
        where = ["-n", namespace] if namespace else []
        clusters.kubectl(C, "delete", kind, *where, BYSTANDER_POD, "--ignore-not-found", "--wait=false")


def test_rows_denied_by_admission_are_refused_for_real_requests(clusters: Clusters, peering: Peering) -> None:
    """Each ADMISSION row as a real request with the identity's credentials (server-side dry run):
    refused by the admission policy, naming it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": BYSTANDER_POD, "namespace": "kube-system"},
        "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]},
    }
    # a user's claim and the volume bound to it, for the controller's claim and volume rows
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": BYSTANDER_POD, "namespace": "kube-system"},
        "spec": {
            "storageClassName": "",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": BYSTANDER_POD},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": "/nonexistent/gpufed-rbac"},
            "claimRef": {"namespace": "kube-system", "name": BYSTANDER_POD},
        },
    }
    _remove_bystanders(clusters)
    clusters.create(C, pod)
    clusters.create(C, claim)
    clusters.create(C, volume)
    kubectl = str(clusters.env.binary("kubectl"))
    wrong: list[str] = []
    asked = 0
    try:
        for who, cluster, verb, resource, namespace, name, expect, why in MATRIX:
            if expect != ADMISSION:
                continue
            assert cluster == C, "ADMISSION rows are asked of the consumer"
            ns, nm = peering.fill(namespace), peering.fill(name).replace("{node}", peering.nodes[cluster])
            args, stdin = _real_request(verb, resource, ns, nm)
            for user, groups in IDENTITIES[who]:
                flags = _as_identity(clusters, who, peering.fill(user), groups)
                proc = subprocess.run(
                    [kubectl, *flags, *args], capture_output=True, text=True, input=stdin, timeout=60, check=False
                )
                asked += 1
                label = f"{user} {verb} {resource} ns={ns or '-'} name={nm} ({why})"
                policies = POLICIES[who]
                if proc.returncode == 0 or not any(p in proc.stderr for p in policies):
                    wrong.append(f"not refused by {policies}: {label}: rc={proc.returncode} {proc.stderr.strip()}")
    finally:
        _remove_bystanders(clusters)
    assert asked >= 10
    assert not wrong, "\n".join(wrong)
    # Nothing happened: the dry runs changed nothing, the real node is still there and unlabelled.
    node = clusters.kubectl_json(C, "get", "node", peering.nodes[C])
    assert TYPE_LABEL not in (node["metadata"].get("labels") or {})
