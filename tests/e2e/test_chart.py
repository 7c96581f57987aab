"""The Helm chart (deploy/charts/gpufed) with helm built from its Go module and a real local
apiserver: it lints and renders for several value sets (the defaults and each role among them), bad
values fail with the reason, every rendered object — CRDs and RBAC included — passes a server-side
dry-run apply, its pods meet the Pod Security level the chart documents, `helm install` with the
defaults is accepted by the API server (a dry run: the shared clusters run gpufed already) and
prints its notes, a real `helm install --wait` with the defaults works in one more cluster that has
nothing of gpufed (its CRDs Established, its controller available) and `helm uninstall` leaves
nothing of the release there (but the CRDs, which Helm keeps by design), the workloads the
controller makes from the chart's templates pass it too, every flag the chart passes exists in the
command it runs, and rendered RBAC grants nothing beyond what each component's code is run with in
this suite (deploy/rbac/) plus the in-cluster additions whose users are named below.

`helm uninstall` leaves nothing the controller created: the webhook configuration and admission
policies the controllers of this suite wrote carry an ownerReference to the ClusterRole
`gpufed-controller` (which the chart owns), and deleting such an owner, as `helm uninstall` does,
lets the garbage collector delete what it owns (shown on objects of the same kinds with an owner
made for the test: deleting the real one would break the shared clusters).

The in-cluster pieces of the controller are exercised here against the real API server too:
leader election between two candidates, and the per-peering virtual-kubelet Deployment that
follows a real peering.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from gpufed.apis.wire import ClusterID
from gpufed.app.release import ANCHOR, OWNED, ReleaseOwner
from gpufed.app.workloads import VIRTUAL_KUBELET, Workloads, WorkloadSettings
from gpufed.cli import app as cli_app
from gpufed.kube import rest
from gpufed.kube.client import api_client
from gpufed.kube.leader import LeaderElector, LeaderSettings
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import PORTS_PER_CLUSTER, Topology
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, peered_session
from vkprovider.forge import workloads as forge

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "charts" / "gpufed"
RBAC = REPO / "deploy" / "rbac"
KUBE_VERSION = "1.36.3"
ADDRESS = ["--set", "estimator.address=gpu.example.com:9700"]

#: Value sets an operator would use: (id, helm flags).
VALUE_SETS: list[tuple[str, list[str]]] = [
    ("defaults", []),
    ("consumer", ["--set", "role=consumer"]),
    ("provider", [*ADDRESS, "--set", "role=provider", "--set", "estimator.service.type=LoadBalancer"]),
    (
        "ha-gateway-monitoring",
        [
            *ADDRESS,
            "--set",
            "controller.replicas=3",
            "--set",
            "gateway.enabled=true",
            "--set",
            "gateway.wireguard.implementation=kernel",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "estimator.service.type=NodePort",
            "--set",
            "estimator.service.nodePort=30970",
            "--set",
            "virtualKubelet.consumerApiServer=10.71.0.1:6443",
        ],
    ),
    ("single-replica", [*ADDRESS, "--set", "controller.replicas=1", "--set", "controller.leaderElection=false"]),
]

#: Grants only the in-cluster controller needs, and the module whose code uses each.
IN_CLUSTER: dict[tuple[str, str], str] = {
    ("coordination.k8s.io", "leases"): "gpufed/kube/leader.py",
    ("apps", "deployments"): "gpufed/app/workloads.py",
    ("", "services"): "gpufed/app/workloads.py",
}

#: A stand-in for the Prometheus Operator's CRD, so ServiceMonitors can be dry-run too.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def helm(clusters: Clusters, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(clusters.env.binary("helm")), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and proc.returncode:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def render(clusters: Clusters, flags: list[str], *extra: str) -> list[dict[str, Any]]:
    out = helm(
        clusters, "template", "gpufed", str(CHART), "-n", "gpufed", "--kube-version", KUBE_VERSION, *extra, *flags
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dry_run(clusters: Clusters, objects: list[dict[str, Any]]) -> None:
    text = "\n---\n".join(yaml.safe_dump(o) for o in objects)
    clusters.kubectl(
        "consumer",
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=helm-dry-run",
        "--dry-run=server",
        "-f",
        "-",
        input_text=text,
        timeout=120,
    )


@pytest.fixture(scope="module")
def service_monitor_crd(clusters: Clusters) -> Iterator[None]:
    clusters.kubectl("consumer", "apply", "-f", "-", input_text=json.dumps(SERVICE_MONITOR_CRD))
    clusters.kubectl(
        "consumer", "wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com", "--timeout=30s"
    )
    yield
    clusters.kubectl("consumer", "delete", "crd", "servicemonitors.monitoring.coreos.com", "--ignore-not-found")


@pytest.mark.parametrize(("name", "flags"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_the_chart_lints_renders_and_passes_a_server_side_dry_run(
    clusters: Clusters, service_monitor_crd: None, name: str, flags: list[str]
) -> None:
    lint = helm(clusters, "lint", str(CHART), "--strict", "-n", "gpufed", "--kube-version", KUBE_VERSION, *flags)
    assert "0 chart(s) failed" in lint.stdout, lint.stdout
    objects = render(clusters, flags, "--include-crds")
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "ClusterRole", "Deployment", "ServiceAccount"} <= kinds, kinds
    dry_run(clusters, objects)
    # What the controller makes of the templates is valid for the API server too.
    (config_map,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpufed-workload-templates"
    ]
    for component, container, env in (
        ("virtual-kubelet", "virtual-kubelet", "GPUFED_PROVIDER"),
        ("gateway", "gateway", "GPUFED_GATEWAY_NAME"),
    ):
        docs = list(yaml.safe_load_all(config_map["data"][f"{component}.yaml"]))
        template = forge.check(component, container, env, docs, source=component)
        owner = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": "0b6a3f52-0000-4000-8000-000000000001",
        }
        dry_run(clusters, forge.render(template, "gpu-a-0123abcd", "gpufed", owner))


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["-n", "default", *ADDRESS], "must be installed into the namespace gpufed"),
        (["-n", "gpufed", "--set", "estimator.adress=x:1"], "additional properties 'adress' not allowed"),
        (["-n", "gpufed", "--set", "virtualKubelet.capacity=lots"], "value must be one of 'live', 'static'"),
        (["-n", "gpufed", "--set", "gateway.wireguard.implementation=ebpf"], "one of 'kernel', 'userspace'"),
        (["-n", "gpufed", "--set", "logLevel=loud"], "/logLevel"),
    ],
)
def test_bad_values_fail_with_the_reason(clusters: Clusters, flags: list[str], reason: str) -> None:
    proc = helm(clusters, "template", "gpufed", str(CHART), "--kube-version", KUBE_VERSION, *flags, check=False)
    assert proc.returncode != 0
    assert reason in proc.stderr, proc.stderr


def _options(command: typer.core.TyperCommand) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def test_every_flag_the_chart_passes_exists_in_its_command(clusters: Clusters) -> None:
    flags = VALUE_SETS[3][1]
    objects = render(clusters, flags)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    for key in ("virtual-kubelet.yaml", "gateway.yaml"):
        pods += [
            d["spec"]["template"]["spec"]
            for d in yaml.safe_load_all(config_map["data"][key])
            if d["kind"] == "Deployment"
        ]
    group = typer.main.get_command(cli_app)
    assert isinstance(group, typer.core.TyperGroup)
    seen = set()
    for pod in pods:
        for container in pod["containers"]:
            verb, *args = container["args"]
            command = group.commands.get(verb)
            assert isinstance(command, typer.core.TyperCommand), f"the chart runs `gpufed {verb}`, which does not exist"
            known = _options(command)
            for arg in args:
                assert arg.split("=", 1)[0] in known, f"`gpufed {verb}` has no option {arg.split('=', 1)[0]}"
            for env in container.get("env") or []:
                envvars = {p.envvar for p in command.params if isinstance(p, typer.core.TyperOption) and p.envvar}
                if env["name"].startswith("GPUFED_"):
                    assert env["name"] in envvars, f"`gpufed {verb}` reads no {env['name']}"
            seen.add(verb)
    assert seen == {"controller", "virtual-kubelet", "gateway", "gpu-agent"}


def _rules(objects: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str, str]]]:
    """ServiceAccount name -> granted (apiGroup, resource, verb, resourceName or '*'), over bindings."""
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    out: dict[str, set[tuple[str, str, str, str]]] = {}
    for b in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = b["roleRef"]
        key = (ref["kind"], b["metadata"].get("namespace", "") if ref["kind"] == "Role" else "", ref["name"])
        role = roles.get(key)
        if role is None:
            assert ref["name"] == "extension-apiserver-authentication-reader", (
                f"binding {b['metadata']['name']} to unknown {key}"
            )
            role = {
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "verbs": ["get", "list", "watch"],
                        "resourceNames": ["extension-apiserver-authentication"],
                    }
                ]
            }
        for subject in b.get("subjects") or []:
            if subject["kind"] != "ServiceAccount":
                continue
            grants = out.setdefault(subject["name"], set())
            for rule in role.get("rules") or []:
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        for verb in rule["verbs"]:
                            for name in rule.get("resourceNames") or ["*"]:
                                grants.add((group, resource, verb, name))
    return out


def test_rendered_rbac_grants_nothing_beyond_what_the_code_is_run_with(clusters: Clusters) -> None:
    # What the components run with throughout this suite (the local environment binds these files).
    tested = [d for p in sorted(RBAC.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    allowed = _rules(tested)
    for name, flags in VALUE_SETS:
        rendered = _rules(render(clusters, flags))
        for account, grants in rendered.items():
            extra = grants - allowed.get(account, set())
            for group, resource, verb, _name in extra:
                assert account == "gpufed-controller", (
                    f"{name}: {account} may {verb} {group}/{resource}, beyond deploy/rbac"
                )
                module = IN_CLUSTER.get((group, resource))
                assert module is not None, f"{name}: the controller may {verb} {group}/{resource}: no code uses it"
                assert f'"{resource}"' in (REPO / module).read_text(), f"{module} does not use {resource}"
            for grant in grants:
                assert "*" not in grant[:3], f"{name}: {account} has a wildcard grant {grant}"
        # And nothing the code needs is missing from the chart (for the parts this value set enables).
        if name == "ha-gateway-monitoring":
            for account, grants in allowed.items():
                assert grants <= rendered.get(account, set()), f"the chart lacks grants of {account}"


def test_leader_election_against_the_real_api_server(clusters: Clusters) -> None:
    async def main() -> None:
        async with api_client(clusters.kubeconfig, "consumer") as api:

            def candidate(identity: str) -> LeaderElector:
                s = LeaderSettings(
                    namespace="gpufed",
                    name="gpufed-e2e-election",
                    identity=identity,
                    lease_duration_s=3.0,
                    renew_deadline_s=2.0,
                    retry_period_s=0.5,
                )
                return LeaderElector(api, s)

            a, b = candidate("replica-a"), candidate("replica-b")
            try:
                await a.acquire()
                assert not await b.try_acquire_or_renew(), "one leader at a time"
                # The leader stops renewing (a crash): the other takes over once the lease expires.
                loop = asyncio.get_running_loop()
                started = loop.time()
                await asyncio.wait_for(b.acquire(), 15)
                assert loop.time() - started >= 2.5, "not before the lease expired"
                assert not await a.try_acquire_or_renew()
                await b.release()
                assert await a.try_acquire_or_renew(), "a released lease is taken at once"
            finally:
                await a.release()

    asyncio.run(main())
    clusters.kubectl("consumer", "delete", "lease", "-n", "gpufed", "gpufed-e2e-election", "--ignore-not-found")


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "2")})


def test_a_virtual_kubelet_deployment_follows_the_peering(
    clusters: Clusters, ids: dict[str, ClusterID], tmp_path: Path
) -> None:
    objects = render(clusters, VALUE_SETS[0][1])
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    template = tmp_path / "virtual-kubelet.yaml"
    template.write_text(config_map["data"]["virtual-kubelet.yaml"])
    provider = ids["gpu-a"]
    name = forge.name_for("gpufed-virtual-kubelet", provider)

    async def sync() -> None:
        async with api_client(clusters.kubeconfig, "consumer") as api:
            await Workloads(api, WorkloadSettings(virtual_kubelet_template=template)).sync()

    try:
        asyncio.run(sync())
        got = json.loads(clusters.kubectl("consumer", "get", "deployment", "-n", "gpufed", name, "-o", "json").stdout)
        (container,) = got["spec"]["template"]["spec"]["containers"]
        assert {"name": "GPUFED_PROVIDER", "value": provider} in container["env"]
        assert got["metadata"]["ownerReferences"][0]["kind"] == "ForeignCluster"
        assert got["spec"]["template"]["spec"]["serviceAccountName"] == "gpufed-virtual-kubelet"
        asyncio.run(sync())  # idempotent
        assert got["metadata"]["labels"]["gpufed.io/component"] == VIRTUAL_KUBELET
    finally:
        clusters.kubectl("consumer", "delete", "deployment", "-n", "gpufed", name, "--ignore-not-found", "--wait=false")
    eventually(
        "the test's Deployment gone",
        lambda: clusters.kubectl("consumer", "get", "deployment", "-n", "gpufed", name, check=False).returncode != 0,
    )


def test_the_chart_confines_the_virtual_kubelet_and_binds_metrics_on_purpose(clusters: Clusters) -> None:
    """The admission policy that confines the virtual kubelet to its own nodes and pods comes with
    it (and only with it), the one that confines the controller's pod writes always; every component
    is told to listen for Prometheus on every interface, as the binaries themselves default to
    loopback."""
    controller = {
        (d["kind"], d["metadata"]["name"])
        for d in yaml.safe_load_all((RBAC / "controller.yaml").read_text())
        if d and d["kind"].startswith("ValidatingAdmission")
    }
    assert ("ValidatingAdmissionPolicy", "gpufed-controller-pods") in controller
    objects = render(clusters, VALUE_SETS[3][1])
    policies = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"].startswith("ValidatingAdmission")}
    assert policies == {
        ("ValidatingAdmissionPolicy", "gpufed-virtual-kubelet"),
        ("ValidatingAdmissionPolicyBinding", "gpufed-virtual-kubelet"),
        *controller,
    }, policies
    without = render(clusters, VALUE_SETS[2][1])
    left = {(o["kind"], o["metadata"]["name"]) for o in without if o["kind"].startswith("ValidatingAdmission")}
    assert left == controller, f"policies without the virtual kubelet: {left}"
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    for key in ("virtual-kubelet.yaml", "gateway.yaml"):
        docs = [d for d in yaml.safe_load_all(config_map["data"][key]) if d]
        pods += [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    for pod in pods:
        for container in pod["containers"]:
            args = container["args"]
            if any(a.startswith("--metrics-port=") for a in args):
                assert "--metrics-host=0.0.0.0" in args, (container["name"], args)


def test_helm_install_with_the_defaults_is_accepted_and_tells_what_is_next(clusters: Clusters) -> None:
    """A dry run against the real API server (its version against kubeVersion, the rendered objects
    built against its API); --take-ownership only because this suite's clusters run gpufed already."""
    kubeconfig = ["--kubeconfig", str(clusters.kubeconfig), "--kube-context", "consumer"]
    proc = helm(
        clusters, "install", "gpufed", str(CHART), "-n", "gpufed", "--dry-run=server", "--take-ownership", *kubeconfig
    )
    assert "STATUS: pending-install" in proc.stdout, proc.stdout
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "(role: both)" in notes and "rollout status deployment/gpufed-controller" in notes, notes
    assert "helm uninstall gpufed -n gpufed" in notes


def test_the_pods_meet_the_pod_security_level_the_chart_documents(clusters: Clusters) -> None:
    """restricted for every pod but the gateway's (NET_ADMIN, /dev/net/tun: privileged), checked by
    the API server's Pod Security admission on a namespace that warns at restricted."""
    objects = render(clusters, ["--set", "gateway.enabled=true"])
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    pods = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "0b6a3f52-0000-4000-8000-000000000002"}
    for component, container, env in (
        ("virtual-kubelet", "virtual-kubelet", "GPUFED_PROVIDER"),
        ("gateway", "gateway", "GPUFED_GATEWAY_NAME"),
    ):
        docs = list(yaml.safe_load_all(config_map["data"][f"{component}.yaml"]))
        template = forge.check(component, container, env, docs, source=component)
        pods += [o for o in forge.render(template, "gpu-a-0123abcd", "gpufed", owner) if o["kind"] == "Deployment"]
    ns = f"t-pod-security-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", ns)
    try:
        clusters.kubectl("consumer", "label", "namespace", ns, "pod-security.kubernetes.io/warn=restricted")
        names = set()
        for pod in pods:
            pod = {**pod, "metadata": {**pod["metadata"], "namespace": ns}}
            pod["metadata"].pop("ownerReferences", None)
            proc = clusters.kubectl(
                "consumer", "apply", "--dry-run=server", "-f", "-", input_text=json.dumps(pod), timeout=60
            )
            name = pod["metadata"]["name"]
            names.add(name)
            violates = "would violate PodSecurity" in proc.stderr
            assert violates == name.startswith("gpufed-gateway"), (name, proc.stderr)
        assert {"gpufed-controller", "gpufed-gpu-agent"} <= names and len(names) == 4, names
    finally:
        clusters.kubectl("consumer", "delete", "namespace", ns, "--wait=false", check=False)


def _owners(clusters: Clusters, context: str, plural: str, name: str) -> list[dict[str, Any]] | None:
    proc = clusters.kubectl(context, "get", plural, name, "-o", "json", check=False)
    if proc.returncode:
        return None
    refs: list[dict[str, Any]] = json.loads(proc.stdout)["metadata"].get("ownerReferences") or []
    return refs


def _owned_by(clusters: Clusters, context: str, plural: str, name: str, uid: str) -> bool:
    refs = _owners(clusters, context, plural, name) or []
    return any(r["uid"] == uid and r["kind"] == "ClusterRole" for r in refs)


def _gone(clusters: Clusters, context: str, plural: str, name: str) -> bool:
    return _owners(clusters, context, plural, name) is None


def test_what_the_controller_creates_is_owned_by_the_charts_cluster_role(
    clusters: Clusters, ids: dict[str, ClusterID]
) -> None:
    """The consumer's webhook configuration and the provider's admission policies (made once a
    consumer peered) are owned by the ClusterRole gpufed-controller of their cluster."""
    for context, plurals in (
        ("consumer", ("mutatingwebhookconfigurations",)),
        ("gpu-a", ("validatingadmissionpolicies", "validatingadmissionpolicybindings")),
    ):
        role = json.loads(clusters.kubectl(context, "get", "clusterrole", ANCHOR[2], "-o", "json").stdout)
        uid = role["metadata"]["uid"]
        for _, plural, name in (o for o in OWNED if o[1] in plurals):
            eventually(
                f"{context}: {plural}/{name} owned by ClusterRole {ANCHOR[2]}",
                functools.partial(_owned_by, clusters, context, plural, name, uid),
                timeout=75,
            )


def test_deleting_the_owner_as_helm_uninstall_does_removes_what_it_owns(clusters: Clusters) -> None:
    """Objects written as the controller writes them (server-side apply) are tied to an owner by
    ReleaseOwner, keep the reference when their writer applies them again, and are deleted by the
    garbage collector once the owner is deleted as `helm uninstall` deletes it."""
    suffix = secrets.token_hex(3)
    anchor = ("rbac.authorization.k8s.io/v1", "clusterroles", f"gpufed-e2e-release-{suffix}")
    labels = {"app.kubernetes.io/managed-by": "gpufed"}
    admission = "admissionregistration.k8s.io/v1"
    name = f"gpufed-e2e-{suffix}"
    objects = {
        "mutatingwebhookconfigurations": {
            "apiVersion": admission,
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name, "labels": labels},
        },
        "validatingadmissionpolicybindings": {
            "apiVersion": admission,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": labels},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    }
    owned = tuple((admission, plural, name) for plural in objects)
    clusters.create("consumer", {"apiVersion": anchor[0], "kind": "ClusterRole", "metadata": {"name": anchor[2]}})
    try:

        async def own() -> None:
            async with api_client(clusters.kubeconfig, "consumer") as api:
                for plural, obj in objects.items():
                    await rest.apply(api, rest.path(admission, plural, name), obj)
                assert await ReleaseOwner(api, anchor=anchor, owned=owned).sync() == 2
                for plural, obj in objects.items():
                    again = await rest.apply(api, rest.path(admission, plural, name), obj)
                    refs = again["metadata"].get("ownerReferences") or []
                    assert [r["name"] for r in refs] == [anchor[2]], f"{plural}: {refs}"

        asyncio.run(own())
        # What `helm uninstall` does to the chart's ClusterRole (background propagation).
        clusters.kubectl("consumer", "delete", "clusterrole", anchor[2], "--cascade=background")
        for plural in objects:
            eventually(
                f"{plural}/{name} deleted with its owner",
                functools.partial(_gone, clusters, "consumer", plural, name),
                timeout=60,
            )
    finally:
        for _, plural, obj_name in (anchor, *owned):
            clusters.kubectl("consumer", "delete", plural, obj_name, "--ignore-not-found", check=False)


# ---------------------------------------------------------------------------------------- a bare cluster

#: The gpufed kinds whose CRDs the chart carries (its crds/ directory).
CHART_CRDS = sorted(p.name.removeprefix("gpufed.io_").removesuffix(".yaml") for p in (CHART / "crds").glob("*.yaml"))


@pytest.fixture(scope="module")
def bare(clusters: Clusters) -> Iterator[Clusters]:
    """One more local cluster, next to the suite's, with nothing of gpufed in it (no CRDs, no RBAC, no
    controller): what an operator installs the chart into. Its ports follow the suite's clusters'."""
    topology = Topology.model_validate(
        {
            "clusters": [{"name": "bare", "nodePools": [{"name": "cpu", "count": 1}]}],
            "basePort": clusters.topology.base_port + PORTS_PER_CLUSTER * len(clusters.topology.clusters),
        }
    )
    state = clusters.env.state_dir.with_name(f"{clusters.env.state_dir.name}-bare")
    env = LocalEnvironment(LocalSettings(state, clusters.env.settings.bin_dir), topology)
    try:
        asyncio.run(env.up(lambda m: print(f"[bare] {m}", flush=True)))
        yield Clusters(env)
    finally:
        env.down(lambda m: print(f"[bare] {m}", flush=True))


def test_the_chart_installs_with_its_defaults_into_a_cluster_that_has_nothing_and_uninstalls_cleanly(
    clusters: Clusters, bare: Clusters
) -> None:
    kubeconfig = ["--kubeconfig", str(bare.kubeconfig), "--kube-context", "bare"]
    assert bare.kubectl("bare", "get", "crd", "-o", "name").stdout.strip() == ""  # nothing there
    proc = helm(
        clusters,
        "install",
        "gpufed",
        str(CHART),
        "-n",
        "gpufed",
        "--create-namespace",
        "--wait",
        "--timeout=120s",
        *kubeconfig,
    )
    assert "STATUS: deployed" in proc.stdout, proc.stdout + proc.stderr
    assert "(role: both)" in proc.stdout.split("NOTES:", 1)[1]
    crds = bare.kubectl_json("bare", "get", "crd")["items"]
    established = {
        c["metadata"]["name"]
        for c in crds
        if any(x["type"] == "Established" and x["status"] == "True" for x in c["status"].get("conditions") or [])
    }
    assert established == {f"{plural}.gpufed.io" for plural in CHART_CRDS}
    deployment = bare.kubectl_json("bare", "get", "deployment", "gpufed-controller", "-n", "gpufed")
    assert deployment["status"].get("availableReplicas") == deployment["spec"]["replicas"], deployment["status"]
    selector = "app.kubernetes.io/instance=gpufed"
    kinds = "clusterroles,clusterrolebindings,roles,rolebindings,serviceaccounts,deployments,services,configmaps"

    def owned() -> list[str]:
        return bare.kubectl("bare", "get", kinds, "-A", "-l", selector, "-o", "name").stdout.split()

    assert owned(), "the release's objects carry the instance label"

    helm(clusters, "uninstall", "gpufed", "-n", "gpufed", "--wait", "--timeout=120s", *kubeconfig)
    eventually("nothing of the release left", lambda: owned() == [], timeout=60)
    # Helm never deletes the CRDs of a chart's crds/ directory (they hold users' objects): they stay.
    assert {c["metadata"]["name"] for c in bare.kubectl_json("bare", "get", "crd")["items"]} == established
