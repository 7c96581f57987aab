"""JobSet's command line, configuration and the upstream manifests rewritten for a local process."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.localenv import jobset

CA = b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"


def _webhook(name: str, path: str, group: str, resource: str) -> dict[str, Any]:
    return {
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "name": name,
        "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}],
        "sideEffects": "None",
    }


def _pod_patch(name: str, path: str) -> list[dict[str, Any]]:
    value = _webhook(name, path, "", "pods")
    value["objectSelector"] = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    return [{"op": "replace", "path": "/webhooks/1", "value": value}]


def write_module(root: Path, *, patch: list[dict[str, Any]] | None = None) -> Path:
    """A miniature of the module's config/ tree, laid out and kustomized like upstream's."""
    crd = root / jobset.CRD_DIR
    (crd / "bases").mkdir(parents=True)
    (crd / "bases" / "jobset.x-k8s.io_jobsets.yaml").write_text(
        "---\n"
        + yaml.safe_dump(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": "jobsets.jobset.x-k8s.io"},
                "spec": {"group": "jobset.x-k8s.io", "names": {"plural": "jobsets"}, "versions": []},
            }
        )
    )
    (crd / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {"resources": ["bases/jobset.x-k8s.io_jobsets.yaml"], "patches": [{"path": "patches/webhook_in.yaml"}]}
        )
    )
    wh = root / jobset.WEBHOOK_DIR
    (wh / "patches").mkdir(parents=True)
    configs = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                _webhook("mjobset.kb.io", "/mutate-jobset", "jobset.x-k8s.io", "jobsets"),
                _webhook("mpod.kb.io", "/mutate--v1-pod", "", "pods"),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-webhook-configuration"},
            "webhooks": [
                _webhook("vjobset.kb.io", "/validate-jobset", "jobset.x-k8s.io", "jobsets"),
                _webhook("vpod.kb.io", "/validate--v1-pod", "", "pods"),
            ],
        },
    ]
    (wh / "manifests.yaml").write_text("---\n" + yaml.safe_dump_all(configs))
    (wh / "patches" / "mutating-patch.yaml").write_text(
        yaml.safe_dump(patch if patch is not None else _pod_patch("mpod.kb.io", "/mutate--v1-pod"))
    )
    (wh / "patches" / "validating-patch.yaml").write_text(yaml.safe_dump(_pod_patch("vpod.kb.io", "/validate--v1-pod")))
    target = {"group": "admissionregistration.k8s.io", "version": "v1"}
    (wh / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["manifests.yaml", "service.yaml"],
                "patches": [
                    {
                        "path": "patches/mutating-patch.yaml",
                        "target": {
                            **target,
                            "kind": "MutatingWebhookConfiguration",
                            "name": "mutating-webhook-configuration",
                        },
                    },
                    {
                        "path": "patches/validating-patch.yaml",
                        "target": {
                            **target,
                            "kind": "ValidatingWebhookConfiguration",
                            "name": "validating-webhook-configuration",
                        },
                    },
                ],
            }
        )
    )
    rbac = root / jobset.RBAC_DIR
    rbac.mkdir(parents=True)
    (rbac / "role.yaml").write_text(
        "---\n"
        + yaml.safe_dump(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "manager-role"},
                "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]}],
            }
        )
    )
    return root


def test_sources_follow_upstreams_kustomizations_and_patches(tmp_path: Path) -> None:
    src = jobset.sources(write_module(tmp_path))
    assert [c["metadata"]["name"] for c in src.crds] == ["jobsets.jobset.x-k8s.io"]
    pod_hooks = [w for c in src.webhooks for w in c["webhooks"] if w["name"] in ("mpod.kb.io", "vpod.kb.io")]
    assert len(pod_hooks) == 2
    assert all(w["objectSelector"]["matchExpressions"][0]["key"] == "jobset.sigs.k8s.io/jobset-name" for w in pod_hooks)
    assert src.role["metadata"]["name"] == "manager-role"


@pytest.mark.parametrize(
    "patch",
    [
        [{"op": "add", "path": "/webhooks/1", "value": {}}],
        [{"op": "replace", "path": "/webhooks/7", "value": {}}],
        [{"op": "replace", "path": "/metadata/name", "value": "x"}],
    ],
)
def test_a_patch_it_does_not_understand_is_refused_not_half_applied(
    tmp_path: Path, patch: list[dict[str, Any]]
) -> None:
    with pytest.raises(ValueError, match="unsupported patch"):
        jobset.sources(write_module(tmp_path, patch=patch))


def test_webhooks_call_the_local_process_by_url_with_the_cluster_ca(tmp_path: Path) -> None:
    src = jobset.sources(write_module(tmp_path))
    out = jobset.webhooks(src, port=21012, ca_pem=CA)
    assert [c["metadata"]["name"] for c in out] == [
        "jobset-mutating-webhook-configuration",
        "jobset-validating-webhook-configuration",
    ]
    for config in out:
        for w in config["webhooks"]:
            assert w["clientConfig"]["url"].startswith("https://127.0.0.1:21012/")
            assert base64.b64decode(w["clientConfig"]["caBundle"]) == CA
            assert "service" not in w["clientConfig"]
    assert out[0]["webhooks"][1]["clientConfig"]["url"] == "https://127.0.0.1:21012/mutate--v1-pod"
    # upstream's objects are not changed in place
    assert "service" in src.webhooks[0]["webhooks"][0]["clientConfig"]


def test_its_identity_is_bound_to_upstreams_manager_role_alone(tmp_path: Path) -> None:
    role, binding = jobset.rbac(jobset.sources(write_module(tmp_path)))
    assert role["kind"] == "ClusterRole" and role["metadata"]["name"] == "jobset-manager-role"
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]}]
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["roleRef"]["name"] == "jobset-manager-role"
    assert binding["subjects"] == [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": jobset.USER}]


def test_configuration_listens_on_loopback_only_without_leader_election_or_cert_management(tmp_path: Path) -> None:
    cfg = jobset.configuration(webhook_port=21012, health_port=21013, cert_dir=tmp_path / "certs")
    assert cfg["apiVersion"] == "config.jobset.x-k8s.io/v1alpha1" and cfg["kind"] == "Configuration"
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 21012, "certDir": str(tmp_path / "certs")}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:21013"}
    assert cfg["metrics"] == {"bindAddress": "0"}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert jobset.args(Path("/bin/jobset"), config=Path("/c.yaml"), kubeconfig=Path("/k")) == [
        "/bin/jobset",
        "--config=/c.yaml",
        "--kubeconfig=/k",
    ]
    assert jobset.health_url(21013) == "http://127.0.0.1:21013/readyz"
    assert jobset.serving_sans() == (("localhost",), (ipaddress.IPv4Address("127.0.0.1"),))
    assert list(jobset.cert_files(Path("a.crt"), Path("a.key"))) == ["tls.crt", "tls.key"]


def test_the_crd_is_taken_as_upstream_ships_it(tmp_path: Path) -> None:
    src = jobset.sources(write_module(tmp_path))
    out = jobset.crds(src)
    assert out == list(src.crds) and out[0] is not src.crds[0]
    assert "conversion" not in out[0]["spec"]
