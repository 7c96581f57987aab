"""Kueue's command line, configuration and the upstream manifests rewritten for a local process."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.localenv import kueue

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


def _crd(plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
        "spec": {"group": "kueue.x-k8s.io", "names": {"plural": plural}, "versions": []},
    }


def write_module(root: Path) -> Path:
    """A miniature of the module's config/ tree, laid out and kustomized like upstream's."""
    crd = root / kueue.CRD_DIR
    (crd / "bases").mkdir(parents=True)
    (crd / "patches").mkdir()
    for plural in ("workloads", "resourceflavors"):
        (crd / "bases" / f"kueue.x-k8s.io_{plural}.yaml").write_text("---\n" + yaml.safe_dump(_crd(plural)))
    (crd / "patches" / "webhook_in_workloads.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": "workloads.kueue.x-k8s.io"},
                "spec": {
                    "conversion": {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {
                                "service": {"namespace": "system", "name": "webhook-service", "path": "/convert"}
                            },
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                },
            }
        )
    )
    (crd / "kustomization.yaml").write_text(
        "resources:\n- bases/kueue.x-k8s.io_workloads.yaml\n- bases/kueue.x-k8s.io_resourceflavors.yaml\n"
        "patches:\n- path: patches/webhook_in_workloads.yaml\n#- path: patches/webhook_in_resourceflavors.yaml\n"
    )
    wh = root / kueue.WEBHOOK_DIR
    wh.mkdir(parents=True)
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            _webhook("mjob.kb.io", "/mutate-batch-v1-job", "batch", "jobs"),
            _webhook("mpod.kb.io", "/mutate--v1-pod", "", "pods"),
            _webhook("mdeployment.kb.io", "/mutate-apps-v1-deployment", "apps", "deployments"),
            _webhook("mrayjob.kb.io", "/mutate-ray-io-v1-rayjob", "ray.io", "rayjobs"),
            _webhook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "jobsets"),
            _webhook(
                "mresourceflavor.kb.io",
                "/mutate-kueue-x-k8s-io-v1beta2-resourceflavor",
                "kueue.x-k8s.io",
                "resourceflavors",
            ),
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            _webhook("vjob.kb.io", "/validate-batch-v1-job", "batch", "jobs"),
            _webhook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "jobsets"),
            _webhook(
                "vclusterqueue.kb.io",
                "/validate-kueue-x-k8s-io-v1beta2-clusterqueue",
                "kueue.x-k8s.io",
                "clusterqueues",
            ),
        ],
    }
    (wh / "manifests.yaml").write_text("---\n" + yaml.safe_dump(mutating) + "---\n" + yaml.safe_dump(validating))
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}
        ]
    }
    patch = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [{"name": "mpod.kb.io", "namespaceSelector": selector}],
    }
    (wh / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["manifests.yaml", "service.yaml"], "patches": [{"patch": yaml.safe_dump(patch)}]})
    )
    rbac = root / kueue.RBAC_DIR
    rbac.mkdir(parents=True)
    rule = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "update", "patch"]}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "manager-role"},
        "rules": [rule],
    }
    (rbac / "role.yaml").write_text("---\n" + yaml.safe_dump(role))
    auth = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "metrics-auth-role"},
        "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}],
    }
    (rbac / "metrics_auth_role.yaml").write_text(yaml.safe_dump(auth))
    secrets = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "manager-secrets-role", "namespace": "system"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "update"]}],
    }
    (rbac / "manager_secrets_role.yaml").write_text(yaml.safe_dump(secrets))
    return root


@pytest.fixture
def src(tmp_path: Path) -> kueue.Sources:
    return kueue.sources(write_module(tmp_path))


def test_configuration_runs_one_local_process_on_loopback_with_our_certificates() -> None:
    cfg = kueue.configuration(
        webhook_port=21100, metrics_port=21101, health_port=21102, cert_dir=Path("/s/kueue-certs")
    )
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert cfg["kind"] == "Configuration"
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 21100, "certDir": "/s/kueue-certs"}
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:21101"
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:21102"
    assert cfg["manageJobsWithoutQueueName"] is False
    # batch Jobs and JobSets: the pod integration's webhook would hold up every Pod while Kueue is down
    assert cfg["integrations"]["frameworks"] == ["batch/job", "jobset.x-k8s.io/jobset"]
    assert cfg["featureGates"]["VisibilityOnDemand"] is False
    # Nothing listens on a wildcard address.
    assert ":" + "8443" not in yaml.safe_dump(cfg)


def test_configuration_refuses_integrations_whose_webhooks_it_cannot_select() -> None:
    with pytest.raises(ValueError, match=r"ray\.io/rayjob"):
        kueue.configuration(
            webhook_port=1, metrics_port=2, health_port=3, cert_dir=Path("/c"), frameworks=["ray.io/rayjob"]
        )
    with pytest.raises(ValueError):
        kueue.configuration(webhook_port=1, metrics_port=2, health_port=3, cert_dir=Path("/c"), frameworks=[])


def test_args_hand_the_metrics_certificate_directory_through_the_environment() -> None:
    argv = kueue.args(
        Path("/bin/kueue"),
        config=Path("/s/kueue.yaml"),
        kubeconfig=Path("/s/kueue.kubeconfig"),
        cert_dir=Path("/s/certs"),
    )
    assert argv == [
        "env",
        "GPUFED_KUEUE_METRICS_CERT_DIR=/s/certs",
        "/bin/kueue",
        "--config=/s/kueue.yaml",
        "--kubeconfig=/s/kueue.kubeconfig",
    ]


def test_certificate_directory_and_serving_names() -> None:
    assert kueue.cert_files(Path("/p/kueue-serving.crt"), Path("/p/kueue-serving.key")) == {
        "tls.crt": Path("/p/kueue-serving.crt"),
        "tls.key": Path("/p/kueue-serving.key"),
    }
    dns, ips = kueue.serving_sans()
    assert ipaddress.ip_address(kueue.HOST) in ips
    assert "localhost" in dns
    assert kueue.health_url(21102) == "http://127.0.0.1:21102/readyz"


def test_sources_follow_upstreams_kustomizations(src: kueue.Sources) -> None:
    assert [c["metadata"]["name"] for c in src.crds] == ["workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"]
    # The commented-out patch is not applied.
    assert set(src.conversions) == {"workloads.kueue.x-k8s.io"}
    assert [w["kind"] for w in src.webhooks] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert [r["metadata"]["name"] for r in src.roles] == ["manager-role", "metrics-auth-role", "manager-secrets-role"]


def test_sources_refuse_a_module_without_the_expected_roles(tmp_path: Path) -> None:
    root = write_module(tmp_path)
    (root / kueue.RBAC_DIR / "role.yaml").write_text("---\n")
    with pytest.raises(ValueError, match="manager-role"):
        kueue.sources(root)


def test_crds_convert_through_kueues_local_webhook_server(src: kueue.Sources) -> None:
    crds = {c["metadata"]["name"]: c for c in kueue.crds(src, webhook_port=21100, ca_pem=CA)}
    conv = crds["workloads.kueue.x-k8s.io"]["spec"]["conversion"]
    assert conv["strategy"] == "Webhook"
    assert conv["webhook"]["conversionReviewVersions"] == ["v1"]
    assert conv["webhook"]["clientConfig"] == {
        "url": "https://127.0.0.1:21100/convert",
        "caBundle": base64.b64encode(CA).decode(),
    }
    assert "conversion" not in crds["resourceflavors.kueue.x-k8s.io"]["spec"]
    # The sources are not changed in place.
    assert "url" not in str(src.conversions)


def test_webhooks_call_the_local_process_by_url_with_the_cluster_ca(src: kueue.Sources) -> None:
    configs = {c["kind"]: c for c in kueue.webhooks(src, port=21100, ca_pem=CA, frameworks=["batch/job", "pod"])}
    mutating = configs["MutatingWebhookConfiguration"]
    assert mutating["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    by_name = {w["name"]: w for w in mutating["webhooks"]}
    # Kueue's own kinds and the enabled integrations only.
    assert set(by_name) == {"mjob.kb.io", "mpod.kb.io", "mresourceflavor.kb.io"}
    assert by_name["mjob.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:21100/mutate-batch-v1-job",
        "caBundle": base64.b64encode(CA).decode(),
    }
    # Upstream's patch keeps the Pod webhook out of kube-system and Kueue's namespace.
    values = by_name["mpod.kb.io"]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert values == ["kube-system", "kueue-system"]
    validating = configs["ValidatingWebhookConfiguration"]
    assert validating["metadata"]["name"] == "kueue-validating-webhook-configuration"
    assert {w["name"] for w in validating["webhooks"]} == {"vjob.kb.io", "vclusterqueue.kb.io"}
    assert all("service" not in w["clientConfig"] for c in configs.values() for w in c["webhooks"])


def test_without_the_pod_integration_no_pod_is_held_up_by_kueue(src: kueue.Sources) -> None:
    configs = kueue.webhooks(src, port=1, ca_pem=CA)  # the default: batch/job and JobSets
    names = {w["name"] for c in configs for w in c["webhooks"]}
    assert "mpod.kb.io" not in names
    assert "mjob.kb.io" in names


def test_jobsets_are_kueues_by_default_through_its_jobset_webhooks(src: kueue.Sources) -> None:
    cfg = kueue.configuration(webhook_port=21100, metrics_port=21101, health_port=21102, cert_dir=Path("/c"))
    assert kueue.JOBSET_FRAMEWORK in cfg["integrations"]["frameworks"]
    configs = {c["kind"]: c for c in kueue.webhooks(src, port=21100, ca_pem=CA)}
    by_name = {w["name"]: w for c in configs.values() for w in c["webhooks"]}
    # JobSets are defaulted (suspended when queued) and validated by Kueue, at its local server.
    assert {"mjobset.kb.io", "vjobset.kb.io"} <= set(by_name)
    assert by_name["mjobset.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:21100/mutate-jobset-x-k8s-io-v1alpha2-jobset",
        "caBundle": base64.b64encode(CA).decode(),
    }
    assert by_name["vjobset.kb.io"]["clientConfig"]["url"].endswith("/validate-jobset-x-k8s-io-v1alpha2-jobset")
    # Only the integration's own kind: other kinds Kueue integrates stay without a webhook.
    assert "mrayjob.kb.io" not in by_name


def test_without_the_jobset_integration_no_jobset_webhook_is_kept(src: kueue.Sources) -> None:
    configs = kueue.webhooks(src, port=1, ca_pem=CA, frameworks=["batch/job"])
    names = {w["name"] for c in configs for w in c["webhooks"]}
    assert not names & {"mjobset.kb.io", "vjobset.kb.io"}
    assert "mjob.kb.io" in names


def test_rbac_binds_upstreams_roles_to_kueues_user(src: kueue.Sources) -> None:
    docs = kueue.rbac(src)
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert set(roles) == {"kueue-manager-role", "kueue-metrics-auth-role"}
    assert roles["kueue-manager-role"]["rules"] == src.roles[0]["rules"]
    bindings = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert set(bindings) == {"kueue-manager-rolebinding", "kueue-metrics-auth-rolebinding"}
    for b in bindings.values():
        assert b["subjects"] == [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:kueue"}]
        assert b["roleRef"]["name"] in roles
    assert kueue.namespace()["metadata"]["name"] == "kueue-system"


def test_secrets_are_readable_only_in_kueues_namespace(src: kueue.Sources) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in kueue.rbac(src)}
    role = docs[("Role", "kueue-manager-secrets-role")]
    assert role["metadata"]["namespace"] == "kueue-system"
    binding = docs[("RoleBinding", "kueue-manager-secrets-rolebinding")]
    assert binding["metadata"]["namespace"] == "kueue-system"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"][0]["name"] == kueue.USER
    cluster_wide = [d for d in docs.values() if d["kind"] == "ClusterRole"]
    assert not any("secrets" in r.get("resources", []) for d in cluster_wide for r in d["rules"])
