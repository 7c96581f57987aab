"""JobSet for local clusters: its command line, its configuration and the API objects that wire it in.

Owns: how upstream JobSet's controller manager (built from its Go module, deploy/local/jobset/go.mod,
by deploy/local/build.sh) runs as one more process of a local cluster, outside the cluster, and which
of upstream's manifests it needs, rewritten for that:

- its identity: the client certificate `IDENTITY` (user `USER`, no groups); RBAC binds that user to
  upstream's manager ClusterRole (`config/components/rbac/role.yaml`) and nothing else, renamed with
  upstream's `jobset-` prefix. Upstream's other roles are left out on purpose: leader election is off
  (one process), internal certificate management is off (no Secret to read), and the metrics endpoint
  is off (no TokenReviews or SubjectAccessReviews to make);
- its configuration (`config.jobset.x-k8s.io/v1alpha1`): leader election off, internal certificate
  management off, the webhook server and the health probes on `HOST` only, the metrics endpoint off
  (`bindAddress: "0"`: a local cluster has no use for it and it would want one more port);
- its certificate: one serving certificate signed by the cluster CA for `HOST` (`SERVING_STEM`, SANs
  `serving_sans`), as `tls.crt`/`tls.key` in one directory (`CERT_FILES`, the webhook's `certDir`);
- its CRD, from the module's `config/components/crd/bases` (the files its kustomization lists).
  Upstream's patches that would make the CRD convert by webhook are not applied: the CRD has a single
  version, so the apiserver never converts, and a conversion webhook would only be one more call
  that fails while JobSet is down;
- its admission webhooks, from `config/components/webhook/manifests.yaml` with upstream's JSON patches
  (they limit the Pod webhooks to JobSet's pods by an objectSelector), prefixed `jobset-`, with
  `clientConfig.url: https://HOST:<port><path>` plus the cluster CA as `caBundle` (the apiserver calls
  the local process directly: no Service).

Pure but for `sources`, which reads upstream's YAML files from the module's directory (the directory
`SOURCE_DIR_ARGV` prints when run in deploy/local/jobset). Does not: issue certificates (`pki`),
write files, start or wait for JobSet, or apply objects (the launcher does).
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The Go module JobSet is built from (pinned in deploy/local/jobset/go.mod).
MODULE = "sigs.k8s.io/jobset"
#: Run in deploy/local/jobset (GOTOOLCHAIN=local, GOFLAGS=-mod=readonly): prints the module's source
#: directory in the module cache, where upstream's manifests are read from.
SOURCE_DIR_ARGV = ("go", "list", "-m", "-f", "{{.Dir}}", MODULE)
#: File stem of JobSet's client certificate and kubeconfig.
IDENTITY = "jobset"
#: The user JobSet authenticates as (CN of its client certificate).
USER = "system:jobset"
#: File stem of its serving certificate (webhooks).
SERVING_STEM = "jobset-serving"
#: The address every JobSet listener binds and the apiserver calls its webhooks at.
HOST = "127.0.0.1"
CONFIG_API_VERSION = "config.jobset.x-k8s.io/v1alpha1"
#: Names of the certificate and key in the certificate directory (controller-runtime's defaults).
CERT_FILES = ("tls.crt", "tls.key")
#: Upstream's kustomize name prefix, kept for every cluster-scoped object taken from its manifests.
NAME_PREFIX = "jobset-"
#: Upstream's files, relative to the module's directory.
CRD_DIR = "config/components/crd"
WEBHOOK_DIR = "config/components/webhook"
RBAC_DIR = "config/components/rbac"
#: Upstream's ClusterRole JobSet's user is bound to: (file, name without the prefix).
BOUND_ROLE = ("role.yaml", "manager-role")
#: Client-side rate limit (upstream's default is 500/500, sized for a dedicated control plane).
CLIENT_QPS = 50
CLIENT_BURST = 100
_WEBHOOK_INDEX = re.compile(r"^/webhooks/(\d+)$")


@dataclass(frozen=True)
class Sources:
    """Upstream's manifests as read from the module (documents as parsed YAML)."""

    #: CustomResourceDefinitions, in kustomization order.
    crds: tuple[dict[str, Any], ...]
    #: The Mutating- and ValidatingWebhookConfiguration, unprefixed, with service clientConfigs,
    #: upstream's patches applied.
    webhooks: tuple[dict[str, Any], ...]
    #: The ClusterRole of `BOUND_ROLE`, unprefixed.
    role: dict[str, Any]


#: libyaml's safe loader where PyYAML has it: upstream's CRD is ~0.7 MB of YAML.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_LOADER) if d]


def _patched(config: dict[str, Any], ops: list[Any], where: str) -> dict[str, Any]:
    """`config` with upstream's JSON patch `ops` applied; only `replace` of a whole webhook occurs
    upstream, anything else is refused (ValueError) rather than half applied."""
    out = copy.deepcopy(config)
    hooks = out.get("webhooks") or []
    for op in ops:
        found = _WEBHOOK_INDEX.match(str(op.get("path") or "")) if isinstance(op, Mapping) else None
        if found is None or op.get("op") != "replace" or int(found.group(1)) >= len(hooks):
            raise ValueError(f"{where}: unsupported patch operation {op!r}")
        hooks[int(found.group(1))] = copy.deepcopy(op["value"])
    return out


def sources(source_dir: Path) -> Sources:
    """Read upstream's CRD, webhooks (patched as upstream's kustomization says) and manager role.

    Follows upstream's kustomizations (which CRDs, which webhook patches), so a new release's additions
    come along; raises `ValueError` when a file is not what it expects.
    """
    crd_dir = source_dir / CRD_DIR
    kust = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    crds = tuple(d for f in kust["resources"] for d in _docs((crd_dir / f).read_text()))
    wh_dir = source_dir / WEBHOOK_DIR
    configs = [d for d in _docs((wh_dir / "manifests.yaml").read_text()) if d["kind"].endswith("WebhookConfiguration")]
    wh_kust = yaml.safe_load((wh_dir / "kustomization.yaml").read_text())
    for patch in wh_kust.get("patches") or []:
        target = patch.get("target") or {}
        ops = yaml.safe_load((wh_dir / patch["path"]).read_text()) if "path" in patch else None
        if not isinstance(ops, list):
            raise ValueError(f"{WEBHOOK_DIR}: patch {patch!r} is not a JSON patch file")
        hits = [
            i
            for i, c in enumerate(configs)
            if c["kind"] == target.get("kind") and c["metadata"]["name"] == target.get("name")
        ]
        if len(hits) != 1:
            raise ValueError(f"{WEBHOOK_DIR}: patch {patch['path']} targets no one webhook configuration")
        configs[hits[0]] = _patched(configs[hits[0]], ops, f"{WEBHOOK_DIR}/{patch['path']}")
    file, name = BOUND_ROLE
    found = [d for d in _docs((source_dir / RBAC_DIR / file).read_text()) if d["metadata"]["name"] == name]
    if len(found) != 1 or found[0]["kind"] != "ClusterRole":
        raise ValueError(f"{RBAC_DIR}/{file}: expected one ClusterRole {name}")
    if not crds or not configs:
        raise ValueError(f"{source_dir}: no CRDs or no webhook configurations found")
    return Sources(crds=crds, webhooks=tuple(configs), role=found[0])


def serving_sans() -> tuple[tuple[str, ...], tuple[ipaddress.IPv4Address, ...]]:
    """DNS names and IPs of JobSet's serving certificate (the apiserver dials `HOST`)."""
    return ("localhost",), (ipaddress.IPv4Address(HOST),)


def webhook_url(port: int, path: str) -> str:
    return f"https://{HOST}:{port}{path}"


def configuration(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """JobSet's Configuration file (written as YAML, passed with `--config`)."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"{HOST}:{health_port}"},
        # "0": controller-runtime serves no metrics.
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": HOST, "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": CLIENT_QPS, "burst": CLIENT_BURST},
    }


def args(binary: Path, *, config: Path, kubeconfig: Path) -> list[str]:
    """JobSet's command line (its listeners and certificates are in the configuration)."""
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}"]


def cert_files(serving_cert: Path, serving_key: Path) -> dict[str, Path]:
    """What the certificate directory holds: its file names -> the PKI files they are copies of."""
    return dict(zip(CERT_FILES, (serving_cert, serving_key), strict=True))


def health_url(health_port: int, check: str = "readyz") -> str:
    """JobSet's readiness (the webhook server listens) or liveness probe: plain HTTP on `HOST`."""
    return f"http://{HOST}:{health_port}/{check}"


def crds(src: Sources) -> list[dict[str, Any]]:
    """Upstream's CRDs as they are (no conversion: a single version)."""
    return [copy.deepcopy(c) for c in src.crds]


def webhooks(src: Sources, *, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, prefixed `jobset-`, calling `https://HOST:port<path>`."""
    ca = base64.b64encode(ca_pem).decode()
    out = []
    for config in src.webhooks:
        config = copy.deepcopy(config)
        config["metadata"] = {
            "name": NAME_PREFIX + config["metadata"]["name"],
            "labels": {"app.kubernetes.io/name": "jobset"},
        }
        for w in config.get("webhooks") or []:
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {"url": webhook_url(port, path), "caBundle": ca}
        out.append(config)
    return out


def rbac(src: Sources) -> list[dict[str, Any]]:
    """Upstream's manager ClusterRole (prefixed) and its binding to `USER`."""
    name = NAME_PREFIX + src.role["metadata"]["name"]
    role = {**copy.deepcopy(src.role), "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "jobset"}}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name.removesuffix("-role") + "-rolebinding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": USER}],
    }
    return [role, binding]
