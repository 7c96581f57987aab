"""Kueue for local clusters: its command line, its configuration and the API objects that wire it in.

Owns: how upstream Kueue's manager (built from its Go module, deploy/local/kueue/go.mod, by
deploy/local/build.sh) runs as one more process of a local cluster, outside the cluster, and which of
upstream's manifests it needs, rewritten for that:

- its identity: the client certificate `IDENTITY` (user `USER`, no groups); RBAC binds that user to
  upstream's manager ClusterRole (`config/components/rbac/role.yaml`), metrics-auth ClusterRole
  (TokenReviews/SubjectAccessReviews for its metrics endpoint) and the Role reading Secrets in
  `NAMESPACE` (MultiKueue's kubeconfigs: without it Kueue's cache never syncs and nothing is admitted),
  renamed with upstream's `kueue-` prefix;
- its configuration (`config.kueue.x-k8s.io/v1beta2`): leader election off (one process), internal
  certificate management off, webhook server, metrics and health probes on `HOST` only, the visibility
  API server off (it would want certificates under /visibility), only jobs carrying the queue-name
  label `QUEUE_NAME_LABEL` are managed (`manageJobsWithoutQueueName: false`), and the integrations
  `DEFAULT_FRAMEWORKS`: batch Jobs and JobSets (`JOBSET_FRAMEWORK`; the manager role already grants
  what Kueue needs on jobsets, and a cluster that does not serve JobSets only has Kueue wait for
  their API);
- its certificates: one serving certificate signed by the cluster CA for `HOST` (`SERVING_STEM`,
  SANs `serving_sans`), as `tls.crt`/`tls.key` in one directory (`CERT_FILES`) that serves the webhook
  server (`webhook.certDir`) and the metrics endpoint (`METRICS_CERT_ENV`: upstream reads the metrics
  certificate from /etc/kueue/metrics/certs; build.sh builds Kueue with that one line made settable);
- its CRDs, from the module's `config/components/crd/bases`, with upstream's conversion webhooks
  (`config/components/crd/patches`) pointed at its webhook server;
- its admission webhooks, from `config/components/webhook/manifests.yaml` with upstream's
  namespaceSelector patches, `clientConfig.url: https://HOST:<port><path>` plus the cluster CA as
  `caBundle` (the apiserver calls the local process directly: no Service), and only the webhooks for
  Kueue's own kinds and the enabled integrations (a Pod webhook with failurePolicy Fail only when
  the `pod` integration is on).

Pure but for `sources`, which reads upstream's YAML files from the module's directory (the directory
`SOURCE_DIR_ARGV` prints when run in deploy/local/kueue). Does not: issue certificates (`pki`), write
files, start or wait for Kueue, or apply objects (the launcher does).
"""

from __future__ import annotations

import base64
import copy
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The Go module Kueue is built from (pinned in deploy/local/kueue/go.mod).
MODULE = "sigs.k8s.io/kueue"
#: Run in deploy/local/kueue (GOTOOLCHAIN=local, GOFLAGS=-mod=readonly): prints the module's source
#: directory in the module cache, where upstream's manifests are read from.
SOURCE_DIR_ARGV = ("go", "list", "-m", "-f", "{{.Dir}}", MODULE)
#: File stem of Kueue's client certificate and kubeconfig.
IDENTITY = "kueue"
#: The user Kueue authenticates as (CN of its client certificate).
USER = "system:kueue"
#: File stem of its serving certificate (webhooks and metrics).
SERVING_STEM = "kueue-serving"
#: The address every Kueue listener binds and the apiserver calls its webhooks at.
HOST = "127.0.0.1"
#: Kueue's own namespace (its configuration's `namespace`; no Pod of Kueue runs there).
NAMESPACE = "kueue-system"
#: The label that hands a Job, a JobSet or (`pod` integration) a Pod to a LocalQueue.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
#: Pod groups: pods sharing this label form one Workload (`pod` integration)...
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
#: ... of this many pods (annotation).
POD_GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
#: Names of the certificate and key in the certificate directory (controller-runtime's defaults).
CERT_FILES = ("tls.crt", "tls.key")
#: Environment variable naming the metrics endpoint's certificate directory (added by build.sh).
METRICS_CERT_ENV = "GPUFED_KUEUE_METRICS_CERT_DIR"
#: Kueue's framework name of its JobSet integration (JobSets of `jobset.x-k8s.io`).
JOBSET_FRAMEWORK = "jobset.x-k8s.io/jobset"
#: Integrations (Kueue's framework names) enabled by default: batch Jobs and JobSets. Their webhooks
#: (failurePolicy Fail) see only Jobs and JobSets: while Kueue is stopped none can be created, pods
#: can. Kueue sets up an integration whose API is not served (no JobSet CRD yet) once it appears,
#: polling discovery with a backoff from 1 s to 2 min. The `pod` integration would put a webhook with
#: failurePolicy Fail on every Pod created outside kube-system: with Kueue stopped (or restarting) no
#: pod of any namespace could be created, gpufed's twins included.
DEFAULT_FRAMEWORKS = ("batch/job", JOBSET_FRAMEWORK)
#: The API resource each supported integration's webhooks act on (group, plural).
FRAMEWORK_RESOURCES: Mapping[str, tuple[str, str]] = {
    "batch/job": ("batch", "jobs"),
    JOBSET_FRAMEWORK: ("jobset.x-k8s.io", "jobsets"),
    "pod": ("", "pods"),
    "deployment": ("apps", "deployments"),
    "statefulset": ("apps", "statefulsets"),
}
#: Upstream's kustomize name prefix, kept for every cluster-scoped object taken from its manifests.
NAME_PREFIX = "kueue-"
#: Kueue's API group (webhooks for its own kinds are always installed).
GROUP = "kueue.x-k8s.io"
#: Upstream's files, relative to the module's directory.
CRD_DIR = "config/components/crd"
WEBHOOK_DIR = "config/components/webhook"
RBAC_DIR = "config/components/rbac"
#: Upstream's ClusterRoles and Roles (in upstream's placeholder namespace `system`, here `NAMESPACE`)
#: Kueue's user is bound to: (file, name without the prefix).
BOUND_ROLES = (
    ("role.yaml", "manager-role"),
    ("metrics_auth_role.yaml", "metrics-auth-role"),
    ("manager_secrets_role.yaml", "manager-secrets-role"),
)
#: Client-side rate limit (upstream's shipped configuration; its built-in default is 20/30).
CLIENT_QPS = 50
CLIENT_BURST = 100


@dataclass(frozen=True)
class Sources:
    """Upstream's manifests as read from the module (documents as parsed YAML)."""

    #: CustomResourceDefinitions, in kustomization order.
    crds: tuple[dict[str, Any], ...]
    #: CRD name -> the `spec.conversion` upstream patches in (webhook conversion).
    conversions: Mapping[str, dict[str, Any]]
    #: The Mutating- and ValidatingWebhookConfiguration, unprefixed, with service clientConfigs.
    webhooks: tuple[dict[str, Any], ...]
    #: Strategic-merge patches of the webhook configurations (namespaceSelectors), as upstream applies them.
    webhook_patches: tuple[dict[str, Any], ...]
    #: The ClusterRoles and Roles of `BOUND_ROLES`, unprefixed.
    roles: tuple[dict[str, Any], ...]


#: libyaml's safe loader where PyYAML has it: upstream's CRDs are ~1.6 MB of YAML, about 1 s to parse
#: in pure Python, a tenth of that with libyaml.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_LOADER) if d]


def sources(source_dir: Path) -> Sources:
    """Read upstream's CRDs, conversion patches, webhooks and RBAC from the module's directory.

    Follows upstream's kustomizations (which CRDs, which conversion patches, which webhook patches),
    so a new release's additions come along; raises `ValueError` when a file is not what it expects.
    """
    crd_dir = source_dir / CRD_DIR
    kust = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    crds = tuple(d for f in kust["resources"] for d in _docs((crd_dir / f).read_text()))
    conversions: dict[str, dict[str, Any]] = {}
    for patch in kust.get("patches") or []:
        for doc in _docs((crd_dir / patch["path"]).read_text()):
            if doc.get("kind") == "CustomResourceDefinition" and "conversion" in doc.get("spec", {}):
                conversions[doc["metadata"]["name"]] = doc["spec"]["conversion"]
    wh_dir = source_dir / WEBHOOK_DIR
    webhooks = tuple(
        d for d in _docs((wh_dir / "manifests.yaml").read_text()) if d["kind"].endswith("WebhookConfiguration")
    )
    wh_kust = yaml.safe_load((wh_dir / "kustomization.yaml").read_text())
    patches = tuple(d for p in wh_kust.get("patches") or [] if "patch" in p for d in _docs(p["patch"]))
    roles = []
    for file, name in BOUND_ROLES:
        found = [d for d in _docs((source_dir / RBAC_DIR / file).read_text()) if d["metadata"]["name"] == name]
        if len(found) != 1 or found[0]["kind"] not in ("ClusterRole", "Role"):
            raise ValueError(f"{RBAC_DIR}/{file}: expected one ClusterRole or Role {name}")
        roles.append(found[0])
    if not crds or not webhooks:
        raise ValueError(f"{source_dir}: no CRDs or no webhook configurations found")
    return Sources(crds=crds, conversions=conversions, webhooks=webhooks, webhook_patches=patches, roles=tuple(roles))


def serving_sans() -> tuple[tuple[str, ...], tuple[ipaddress.IPv4Address, ...]]:
    """DNS names and IPs of Kueue's serving certificate (the apiserver dials `HOST`)."""
    return ("localhost",), (ipaddress.IPv4Address(HOST),)


def webhook_url(port: int, path: str) -> str:
    return f"https://{HOST}:{port}{path}"


def configuration(
    *,
    webhook_port: int,
    metrics_port: int,
    health_port: int,
    cert_dir: Path,
    frameworks: Sequence[str] = DEFAULT_FRAMEWORKS,
) -> dict[str, Any]:
    """Kueue's Configuration file (written as YAML, passed with `--config`)."""
    unknown = [f for f in frameworks if f not in FRAMEWORK_RESOURCES]
    if unknown or not frameworks:
        raise ValueError(f"unsupported Kueue integrations {unknown or '(none)'}; known: {sorted(FRAMEWORK_RESOURCES)}")
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "health": {"healthProbeBindAddress": f"{HOST}:{health_port}"},
        "metrics": {"bindAddress": f"{HOST}:{metrics_port}"},
        "webhook": {"host": HOST, "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": CLIENT_QPS, "burst": CLIENT_BURST},
        "integrations": {"frameworks": list(frameworks)},
        # The on-demand visibility API is an aggregated apiserver reading its certificate from /visibility.
        "featureGates": {"VisibilityOnDemand": False},
    }


def args(binary: Path, *, config: Path, kubeconfig: Path, cert_dir: Path) -> list[str]:
    """Kueue's command line: `env` hands it the metrics certificate directory, then execs it (same pid)."""
    return [
        "env",
        f"{METRICS_CERT_ENV}={cert_dir}",
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
    ]


def cert_files(serving_cert: Path, serving_key: Path) -> dict[str, Path]:
    """What the certificate directory holds: its file names -> the PKI files they are copies of."""
    return dict(zip(CERT_FILES, (serving_cert, serving_key), strict=True))


def health_url(health_port: int, check: str = "readyz") -> str:
    """Kueue's readiness (the webhook server listens) or liveness probe: plain HTTP on `HOST`."""
    return f"http://{HOST}:{health_port}/{check}"


def crds(src: Sources, *, webhook_port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Upstream's CRDs; those upstream converts by webhook call Kueue's `/convert` at `HOST`."""
    out = []
    for crd in src.crds:
        crd = copy.deepcopy(crd)
        conversion = src.conversions.get(crd["metadata"]["name"])
        if conversion is not None:
            conversion = copy.deepcopy(conversion)
            webhook = conversion.setdefault("webhook", {})
            path = (webhook.get("clientConfig") or {}).get("service", {}).get("path", "/convert")
            webhook["clientConfig"] = {
                "url": webhook_url(webhook_port, path),
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            crd["spec"]["conversion"] = conversion
        out.append(crd)
    return out


def _merge_webhooks(config: dict[str, Any], patch: dict[str, Any]) -> None:
    by_name = {w["name"]: w for w in config.get("webhooks") or []}
    for w in patch.get("webhooks") or []:
        if w["name"] in by_name:
            by_name[w["name"]].update(copy.deepcopy({k: v for k, v in w.items() if k != "name"}))


def _wanted(webhook: dict[str, Any], resources: set[tuple[str, str]]) -> bool:
    for rule in webhook.get("rules") or []:
        groups = rule.get("apiGroups") or []
        if GROUP in groups:
            return True
        if any((g, r) in resources for g in groups for r in rule.get("resources") or []):
            return True
    return False


def webhooks(
    src: Sources,
    *,
    port: int,
    ca_pem: bytes,
    frameworks: Iterable[str] = DEFAULT_FRAMEWORKS,
) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, prefixed `kueue-`, calling `https://HOST:port<path>`.

    Only the webhooks for Kueue's kinds and the enabled `frameworks` are kept: the others would act on
    kinds nobody serves here, or (Deployments, StatefulSets) refuse objects while Kueue is down.
    """
    resources = {FRAMEWORK_RESOURCES[f] for f in frameworks}
    ca = base64.b64encode(ca_pem).decode()
    out = []
    for config in src.webhooks:
        config = copy.deepcopy(config)
        name = config["metadata"]["name"]
        for patch in src.webhook_patches:
            if patch.get("kind") == config["kind"] and patch["metadata"]["name"] == name:
                _merge_webhooks(config, patch)
        config["metadata"] = {"name": NAME_PREFIX + name, "labels": {"app.kubernetes.io/name": "kueue"}}
        kept = []
        for w in config.get("webhooks") or []:
            if not _wanted(w, resources):
                continue
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {"url": webhook_url(port, path), "caBundle": ca}
            kept.append(w)
        config["webhooks"] = kept
        out.append(config)
    return out


def rbac(src: Sources) -> list[dict[str, Any]]:
    """Upstream's roles (prefixed; Roles in `NAMESPACE`), each bound to `USER`."""
    out: list[dict[str, Any]] = []
    for role in src.roles:
        name = NAME_PREFIX + role["metadata"]["name"]
        meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "kueue"}}
        binding_meta: dict[str, Any] = {"name": name.removesuffix("-role") + "-rolebinding"}
        if role["kind"] == "Role":
            meta["namespace"] = binding_meta["namespace"] = NAMESPACE
        out.append({**copy.deepcopy(role), "metadata": meta})
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding" if role["kind"] == "Role" else "ClusterRoleBinding",
                "metadata": binding_meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": name},
                "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": USER}],
            }
        )
    return out


def namespace() -> dict[str, Any]:
    """Kueue's namespace (its configuration names it; upstream's webhooks and defaults exclude it)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
