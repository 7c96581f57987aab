"""The Helm chart deploy/charts/gpufed rendered by helm alone (no cluster): the default values and
each role preset render and lint, the roles pick the parts that run and a part's own `enabled`
overrides its role, values.schema.json refuses misspelled keys and bad values, kubeVersion is the
floor of the ValidatingAdmissionPolicy API, everything Helm owns says so, and NOTES.txt tells what
was installed and what to do next.

helm is the one `make binaries` builds (deploy/local/build.sh; $GPUFED_BIN_DIR), which the e2e tier
builds first; without it these tests fail saying so (test_chart.py renders the same against a real
API server).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.devtools import metricsdoc
from tests.paths import REPO

CHART = REPO / "deploy" / "charts" / "gpufed"
KUBE_VERSION = "1.36.3"


def _helm() -> str | None:
    built = Path(os.environ.get("GPUFED_BIN_DIR", REPO / ".cache" / "bin")) / "helm"
    return str(built) if built.is_file() else shutil.which("helm")


HELM = _helm()


def helm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert HELM is not None, "helm is not built: run `make binaries` (deploy/local/build.sh)"
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60, check=False, env=env)


def render(*flags: str, kube_version: str = KUBE_VERSION) -> list[dict[str, Any]]:
    proc = helm("template", "gpufed", str(CHART), "-n", "gpufed", "--kube-version", kube_version, *flags)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def workloads(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The parts that run: Deployments, DaemonSets and the webhook and estimator Services."""
    kinds = ("Deployment", "DaemonSet")
    names = ("gpufed-webhook", "gpufed-estimator")
    return {
        (o["kind"], o["metadata"]["name"])
        for o in objects
        if o["kind"] in kinds or (o["kind"] == "Service" and o["metadata"]["name"] in names)
    }


def templates_of(objects: list[dict[str, Any]]) -> set[str]:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    return set(config_map["data"])


def controller_args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


CONTROLLER = ("Deployment", "gpufed-controller")
CONSUMER_PARTS = {("Service", "gpufed-webhook")}
PROVIDER_PARTS = {("Service", "gpufed-estimator"), ("DaemonSet", "gpufed-gpu-agent")}


def test_the_defaults_render_and_lint_with_every_part_of_both_roles() -> None:
    lint = helm("lint", str(CHART), "--strict", "-n", "gpufed", "--kube-version", KUBE_VERSION)
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr
    objects = render()
    assert workloads(objects) == {CONTROLLER, *CONSUMER_PARTS, *PROVIDER_PARTS}
    args = controller_args(objects)
    # Nothing to fill in: the estimator is advertised under its Service's name in this cluster.
    assert "--estimator-address=gpufed-estimator.gpufed.svc:9700" in args
    assert "--virtual-kubelet-template=/etc/gpufed/templates/virtual-kubelet.yaml" in args
    (estimator,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "gpufed-estimator"]
    assert estimator["spec"]["type"] == "ClusterIP", "a Service type every cluster can serve"


@pytest.mark.parametrize(
    ("role", "parts", "vk_template"),
    [
        ("consumer", CONSUMER_PARTS, True),
        ("provider", PROVIDER_PARTS, False),
        ("both", CONSUMER_PARTS | PROVIDER_PARTS, True),
    ],
)
def test_each_role_preset_runs_its_parts(role: str, parts: set[tuple[str, str]], vk_template: bool) -> None:
    lint = helm("lint", str(CHART), "--strict", "-n", "gpufed", "--kube-version", KUBE_VERSION, "--set", f"role={role}")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objects = render("--set", f"role={role}")
    assert workloads(objects) == {CONTROLLER, *parts}
    args = controller_args(objects)
    assert any(a.startswith("--virtual-kubelet-template=") for a in args) == vk_template
    assert any(a.startswith("--webhook-port=") for a in args) == vk_template
    assert any(a.startswith("--estimator-port=") for a in args) == (role != "consumer")
    # The virtual kubelet's RBAC and admission policy come with it only.
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    assert ("gpufed-virtual-kubelet" in accounts) == vk_template
    assert ("gpufed-gpu-agent" in accounts) == (role != "consumer")


def test_a_parts_own_enabled_overrides_its_role() -> None:
    objects = render("--set", "role=consumer", "--set", "gpuAgent.enabled=true", "--set", "webhook.enabled=false")
    assert workloads(objects) == {CONTROLLER, ("DaemonSet", "gpufed-gpu-agent")}
    objects = render("--set", "estimator.address=gpu.example.com:9700", "--set", "estimator.service.type=LoadBalancer")
    assert "--estimator-address=gpu.example.com:9700" in controller_args(objects)


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--set", "estimator.adress=gpu.example.com:9700"], "additional properties 'adress' not allowed"),
        (["--set", "rol=consumer"], "additional properties 'rol' not allowed"),
        (["--set", "controller.resources.request.cpu=1"], "additional properties 'request' not allowed"),
        (["--set", "role=lender"], "role"),
        (["--set", "virtualKubelet.capacity=lots"], "capacity"),
        (["--set", "gateway.wireguard.implementation=ebpf"], "implementation"),
        (["--set", "logLevel=loud"], "logLevel"),
        (["--set", "estimator.address=no-port"], "address"),
        (["--set", "controller.replicas=0"], "replicas"),
    ],
)
def test_the_schema_refuses_misspelled_keys_and_bad_values(flags: list[str], reason: str) -> None:
    for verb in ("template", "lint"):
        proc = helm(verb, *(["gpufed"] if verb == "template" else []), str(CHART), "-n", "gpufed", *flags)
        assert proc.returncode != 0, f"helm {verb} accepted {flags}"
        assert reason in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_only_the_namespace_gpufed() -> None:
    proc = helm("template", "gpufed", str(CHART), "-n", "default", "--kube-version", KUBE_VERSION)
    assert proc.returncode != 0 and "must be installed into the namespace gpufed" in proc.stderr


def test_kube_version_is_the_floor_of_validating_admission_policy_v1() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    assert render(kube_version="1.30.0")
    proc = helm("template", "gpufed", str(CHART), "-n", "gpufed", "--kube-version", "1.29.9")
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr
    policies = [o for o in render() if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert policies and {o["apiVersion"] for o in policies} == {"admissionregistration.k8s.io/v1"}


def test_what_helm_owns_says_so_and_what_the_controller_makes_does_not() -> None:
    objects = render("--set", "gateway.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
    for o in objects:
        labels = o["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", (o["kind"], o["metadata"]["name"])
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    for text in config_map["data"].values():
        assert "managed-by: Helm" not in text, "the per-peering workloads are the controller's, not Helm's"
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            pod_labels = o["spec"]["template"]["metadata"]["labels"]
            assert "app.kubernetes.io/managed-by" not in pod_labels, "Helm does not manage pods"


def _notes(tmp_path: Path, *flags: str) -> str:
    """NOTES.txt as `helm install` prints it, without a cluster: on a copy of the chart, the same
    text rendered by `tpl` into a ConfigMap (helm template leaves NOTES.txt out)."""
    chart = tmp_path / "gpufed"
    shutil.copytree(CHART, chart)
    (chart / "notes.tpl").write_text((chart / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.tpl") . | quote }}}\n'
    )
    proc = helm(
        "template",
        "gpufed",
        str(chart),
        "-n",
        "gpufed",
        "--kube-version",
        KUBE_VERSION,
        "--show-only",
        "templates/zz-notes.yaml",
        *flags,
    )
    assert proc.returncode == 0, proc.stderr
    notes: str = yaml.safe_load(proc.stdout)["data"]["notes"]
    return notes


def test_notes_say_what_was_installed_and_what_to_do_next(tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    assert "(role: both)" in notes
    for part in ("gpufed-controller", "gpufed-webhook", "gpufed-estimator", "gpufed-gpu-agent", "virtual kubelets"):
        assert part in notes, part
    assert "kubectl -n gpufed rollout status deployment/gpufed-controller" in notes
    assert "pod-security.kubernetes.io/enforce=restricted" in notes
    assert "cannot reach the estimator at gpufed-estimator.gpufed.svc:9700" in notes
    assert "gpufed peer" in notes and "kubectl get gpufed" in notes
    assert "helm uninstall gpufed -n gpufed" in notes


def test_notes_follow_the_role_and_values(tmp_path: Path) -> None:
    consumer = _notes(tmp_path / "c", "--set", "role=consumer", "--set", "gateway.enabled=true")
    assert "(role: consumer)" in consumer and "gpufed offload-namespace" in consumer
    assert "estimator" not in consumer and "gpu-agent" not in consumer
    assert "pod-security.kubernetes.io/enforce=privileged" in consumer, "the gateway needs NET_ADMIN"
    provider = _notes(tmp_path / "p", "--set", "role=provider", "--set", "estimator.address=gpu.example.com:9700")
    assert "advertised to consumers as gpu.example.com:9700" in provider
    assert "cannot reach" not in provider and "virtual kubelets" not in provider


def test_alerts_and_dashboard_render_and_query_only_metrics_gpufed_serves() -> None:
    """Off by default; on, a PrometheusRule whose every expression names metrics gpufed defines, and the
    dashboard ConfigMap carrying deploy/grafana's dashboard as Grafana's sidecar expects it."""
    kinds = {d["kind"] for d in render()}
    assert "PrometheusRule" not in kinds
    docs = render("--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.grafanaDashboard.enabled=true")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    served = {s for m in metricsdoc.families() for s in m.samples}
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert {"GpufedCredentialNotRenewed", "GpufedProviderUnreachable", "GpufedPodsFailedBack"} <= set(alerts)
    for name, r in alerts.items():
        used = set(re.findall(r"\bgpufed_[a-z_]+", r["expr"]))
        assert used and used <= served, f"{name} queries metrics gpufed does not serve: {sorted(used - served)}"
        # Prometheus fills these in: Helm must have left them as written
        assert "{{ $labels." in r["annotations"]["summary"], (name, r["annotations"])
    (dashboard,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpufed-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["gpufed-dashboard.json"])
    assert shipped == json.loads((REPO / "deploy" / "grafana" / "gpufed-dashboard.json").read_text())
