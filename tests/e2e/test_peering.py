"""Peering on the real local clusters: `gpufed peer` / `unpeer` / `info`, the handshake, grants,
quotas and the consumer's least-privilege identity, exercised with the consumer's own certificate.

The tests run in file order and share the peerings they create; the last one unpeers everything
and proves that nothing is left.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.wire import CONSUMER_LABEL
from gpufed.localenv import dra
from peering import handshake
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import cluster_id, eventually, gpufed, leftovers, out, peer, unpeer

pytestmark = pytest.mark.e2e

A100 = "NVIDIA-A100-SXM4-40GB"
L4 = "NVIDIA-L4"


def slice_of(clusters: Clusters, provider_id: str) -> dict[str, Any]:
    s: dict[str, Any] = clusters.kubectl_json(
        "consumer", "get", "resourceslices.gpufed.io", "-n", "gpufed", provider_id
    )
    return s


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


# ---------------------------------------------------------------------------- bad input first


def test_bad_inputs_are_refused_clearly_and_leave_nothing(clusters: Clusters, tmp_path: Path) -> None:
    kc = str(clusters.kubeconfig)
    assert leftovers(clusters) == []

    p = gpufed("peer", "--kubeconfig", str(tmp_path / "nope"), "--remote-kubeconfig", kc, "--remote-context", "gpu-a")
    assert p.returncode == 2 and "does not exist" in out(p), out(p)  # a usage error: checked before any call

    p = gpufed(
        "peer",
        "--kubeconfig",
        kc,
        "--context",
        "no-such-context",
        "--remote-kubeconfig",
        kc,
        "--remote-context",
        "gpu-a",
    )
    assert p.returncode == 2 and "no-such-context" in out(p), out(p)

    cfg = yaml.safe_load(Path(kc).read_text())
    for cl in cfg["clusters"]:
        cl["cluster"]["server"] = "https://127.0.0.1:1"
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(cfg))
    p = gpufed(
        "peer",
        "--kubeconfig",
        kc,
        "--context",
        "consumer",
        "--remote-kubeconfig",
        str(dead),
        "--remote-context",
        "gpu-a",
    )
    assert p.returncode == 1 and "cannot reach the provider API server https://127.0.0.1:1" in out(p), out(p)

    p = peer(clusters, "gpu-a", "--gpus", "-2")
    assert p.returncode == 2 and "must not be negative" in out(p), out(p)
    p = peer(clusters, "gpu-a", "--cpu", "lots")
    assert p.returncode == 2 and "invalid slice" in out(p) and "cpu" in out(p), out(p)

    p = gpufed("peer", "--kubeconfig", kc, "--context", "gpu-a", "--remote-kubeconfig", kc, "--remote-context", "gpu-a")
    assert p.returncode == 1 and "cannot peer with itself" in out(p), out(p)

    # A slice asking for an unknown resource is refused by the API server's schema.
    bad = clusters.create(
        "consumer",
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "ResourceSlice",
            "metadata": {"name": "bad", "namespace": "gpufed"},
            "spec": {"providerClusterId": "gpu-a-00000000", "resources": {"example.com/fpga": "1"}},
        },
        check=False,
    )
    assert bad.returncode != 0 and "resources may only be cpu, memory, pods, nvidia.com/gpu" in bad.stderr, bad.stderr

    assert leftovers(clusters) == [], "a refused command left state behind"


# ---------------------------------------------------------------------------- peering


def test_consumer_peers_with_both_providers(clusters: Clusters) -> None:
    a, b = cluster_id(clusters, "gpu-a"), cluster_id(clusters, "gpu-b")
    consumer = cluster_id(clusters, "consumer")

    p = peer(clusters, "gpu-a", "--gpus", "8")
    assert p.returncode == 0, out(p)
    for step in ("challenge issued", "challenge signed", "verified", "least-privilege identity", "Granted"):
        assert step in out(p), f"missing step {step!r} in:\n{out(p)}"
    p = peer(clusters, "gpu-b", "--gpus", "4", "--gpu-product", A100)
    assert p.returncode == 0, out(p)

    sa, sb = slice_of(clusters, a), slice_of(clusters, b)
    assert sa["status"]["granted"]["nvidia.com/gpu"] == "8" and condition(sa, "Resources")["reason"] == "Granted"
    assert sb["status"]["granted"]["nvidia.com/gpu"] == "4" and condition(sb, "Resources")["reason"] == "Granted"
    assert condition(sa, "Authentication")["status"] == "True"

    table = clusters.kubectl("consumer", "get", "resourceslices.gpufed.io", "-n", "gpufed").stdout
    assert "Granted" in table and a in table and b in table, table

    # kubectl's conventions: scripts wait on Ready; `kubectl get gpufed` lists every kind with its age.
    clusters.kubectl(
        "consumer",
        "wait",
        "--for=condition=Ready",
        f"foreigncluster/{a}",
        f"foreigncluster/{b}",
        "--timeout=60s",
        timeout=70,
    )
    fc = clusters.kubectl_json("consumer", "get", "foreigncluster", a)
    assert {c["observedGeneration"] for c in fc["status"]["conditions"]} == {fc["metadata"]["generation"]}
    ready = condition(sa, "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == sa["metadata"]["generation"], sa["status"]
    listed = clusters.kubectl("consumer", "get", "gpufed", "-A").stdout
    for name in (f"foreigncluster.gpufed.io/{a}", f"resourceslice.gpufed.io/{b}", "READY", "AGE"):
        assert name in listed, listed

    info = gpufed("info", "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer", "-o", "json")
    assert info.returncode == 0, out(info)
    data = json.loads(info.stdout)
    assert data["clusterId"] == consumer
    by_id = {p["clusterId"]: p for p in data["providers"]}
    assert by_id[a]["phase"] == "Peered" and by_id[b]["phase"] == "Peered"
    assert by_id[a]["slices"][0]["granted"]["nvidia.com/gpu"] == "8"
    assert by_id[b]["slices"][0]["gpuProduct"] == A100

    # The provider's side: an authenticated tenant, its namespace, a quota that admits nothing there.
    clusters.kubectl(
        "gpu-a", "wait", "--for=condition=Ready", f"tenant.gpufed.io/{consumer}", "--timeout=60s", timeout=70
    )
    tenant = clusters.kubectl_json("gpu-a", "get", "tenant", consumer)
    assert tenant["status"]["phase"] == "Authenticated" and tenant["status"]["granted"]["nvidia.com/gpu"] == "8"
    # its ForeignCluster for the consumer follows the Tenant: scripts wait on it on this side too
    clusters.kubectl(
        "gpu-a", "wait", "--for=condition=Ready", f"foreigncluster/{consumer}", "--timeout=60s", timeout=70
    )
    fc_p = clusters.kubectl_json("gpu-a", "get", "foreigncluster", consumer)
    assert fc_p["status"]["phase"] == "Peered" and condition(fc_p, "TenantReady")["status"] == "True", fc_p
    quota = clusters.kubectl_json("gpu-a", "get", "resourcequota", "-n", f"gpufed-tenant-{consumer}", "gpufed-grant")
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "0"
    info_p = gpufed("info", "--kubeconfig", str(clusters.kubeconfig), "--context", "gpu-a", "-o", "json")
    assert json.loads(info_p.stdout)["consumers"][0]["clusterId"] == consumer


def test_peering_twice_is_a_noop(clusters: Clusters) -> None:
    a = cluster_id(clusters, "gpu-a")
    consumer = cluster_id(clusters, "consumer")
    secret = f"gpufed-remote-{a}"
    before = clusters.kubectl_json("consumer", "get", "secret", "-n", "gpufed", secret)["metadata"]["resourceVersion"]
    csrs = len(clusters.kubectl_json("gpu-a", "get", "csr", "-l", f"{CONSUMER_LABEL}={consumer}")["items"])
    slice_gen = slice_of(clusters, a)["metadata"]["generation"]

    p = peer(clusters, "gpu-a", "--gpus", "8")
    assert p.returncode == 0, out(p)
    assert "already authenticated" in out(p), out(p)
    after = clusters.kubectl_json("consumer", "get", "secret", "-n", "gpufed", secret)["metadata"]["resourceVersion"]
    assert after == before, "the credentials were rewritten"
    assert len(clusters.kubectl_json("gpu-a", "get", "csr", "-l", f"{CONSUMER_LABEL}={consumer}")["items"]) == csrs
    assert slice_of(clusters, a)["metadata"]["generation"] == slice_gen


def test_partial_and_denied_grants_say_why(clusters: Clusters) -> None:
    b = cluster_id(clusters, "gpu-b")
    consumer = cluster_id(clusters, "consumer")

    p = peer(clusters, "gpu-b", "--gpus", "100")
    assert p.returncode == 0, out(p)
    assert "PartialGrant" in out(p) and "of 100" in out(p), out(p)
    s = slice_of(clusters, b)
    assert condition(s, "Resources")["reason"] == "PartialGrant"
    assert 0 < int(s["status"]["granted"]["nvidia.com/gpu"]) < 100
    assert "PartialGrant" in clusters.kubectl("consumer", "get", "resourceslices.gpufed.io", "-n", "gpufed", b).stdout

    # The provider's policy refuses partial grants and allows A100s only.
    clusters.kubectl(
        "gpu-b",
        "patch",
        "tenant",
        consumer,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"policy": {"allowPartial": False, "allowedGpuProducts": [A100]}}}),
    )
    p = peer(clusters, "gpu-b", "--gpus", "100", "--gpu-product", A100)
    assert p.returncode == 3, out(p)
    assert "PartialGrantRefused" in out(p), out(p)
    assert (
        "PartialGrantRefused"
        in clusters.kubectl("consumer", "get", "resourceslices.gpufed.io", "-n", "gpufed", b).stdout
    )
    p = peer(clusters, "gpu-b", "--gpus", "2", "--gpu-product", L4)
    assert p.returncode == 3 and "GPUProductNotAllowed" in out(p), out(p)
    p = peer(clusters, "gpu-b", "--gpus", "1", "--gpu-product", "NVIDIA-B200")
    assert p.returncode == 3 and "GPUProductNotAllowed" in out(p), out(p)

    clusters.kubectl(
        "gpu-b", "patch", "tenant", consumer, "--type=json", "-p", '[{"op":"remove","path":"/spec/policy"}]'
    )
    # A policy change re-decides the standing slice without the consumer doing anything.
    eventually(
        "the slice to be re-decided",
        lambda: condition(slice_of(clusters, b), "Resources").get("reason") == "GPUProductNotFound",
    )
    p = peer(clusters, "gpu-b", "--gpus", "1", "--gpu-product", "NVIDIA-B200")
    assert p.returncode == 3 and "GPUProductNotFound" in out(p), out(p)
    p = peer(clusters, "gpu-b", "--gpus", "4", "--gpu-product", A100)
    assert p.returncode == 0 and "Granted" in out(p), out(p)


def _free_gpus(clusters: Clusters, context: str) -> int:
    """Device-plugin GPUs and DRA devices of gpu.nvidia.com (its class maps nvidia.com/gpu), less requests."""
    nodes = clusters.kubectl_json(context, "get", "nodes")["items"]
    total = sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", "0")) for n in nodes)
    slices = clusters.kubectl_json(context, "get", "resourceslices.resource.k8s.io")["items"]
    total += sum(len(s["spec"].get("devices") or []) for s in slices if s["spec"]["driver"] == dra.DRIVER)
    pods = clusters.kubectl_json(
        context, "get", "pods", "-A", "--field-selector=status.phase!=Succeeded,status.phase!=Failed"
    )["items"]
    used = 0
    for pod in pods:
        if pod["spec"].get("nodeName"):
            for c in pod["spec"]["containers"]:
                used += int(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu", "0"))
    return total - used


def test_provider_load_lowers_the_grant(clusters: Clusters, namespace: str) -> None:
    a = cluster_id(clusters, "gpu-a")
    p = peer(clusters, "gpu-a", "--gpus", "16")
    assert p.returncode == 0 and "Granted" in out(p), out(p)
    assert slice_of(clusters, a)["status"]["granted"]["nvidia.com/gpu"] == "16"

    # The provider's own users start GPU work: three 8-GPU pods.
    for i in range(3):
        clusters.run_pod("gpu-a", namespace, f"train-{i}", gpus=8)
    free = _free_gpus(clusters, "gpu-a")
    assert free < 16, f"the load did not take GPUs ({free} free)"
    # The standing grant is re-decided against the new capacity...
    eventually(
        "the grant to shrink",
        lambda: slice_of(clusters, a)["status"]["granted"].get("nvidia.com/gpu") == str(free),
    )
    # ... and the next peer says so.
    p = peer(clusters, "gpu-a", "--gpus", "16")
    assert p.returncode == 0 and "PartialGrant" in out(p) and f"{free} of 16" in out(p), out(p)

    for i in range(3):
        clusters.kubectl("gpu-a", "delete", "pod", "-n", namespace, f"train-{i}", "--wait=true")
    eventually(
        "the grant to grow back", lambda: slice_of(clusters, a)["status"]["granted"].get("nvidia.com/gpu") == "16"
    )
    p = peer(clusters, "gpu-a", "--gpus", "8")
    assert p.returncode == 0, out(p)


# ---------------------------------------------------------------------------- least privilege


@pytest.fixture
def consumer_kubeconfig(clusters: Clusters, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """kubectl against gpu-a with the consumer's own credentials, as stored by its controller."""
    a = cluster_id(clusters, "gpu-a")
    secret = clusters.kubectl_json("consumer", "get", "secret", "-n", "gpufed", f"gpufed-remote-{a}")
    path = tmp_path / "consumer-on-gpu-a.kubeconfig"
    path.write_bytes(base64.b64decode(secret["data"]["kubeconfig"]))

    def kubectl(*args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(clusters.env.binary("kubectl")), f"--kubeconfig={path}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            input=input_text,
            check=False,
        )

    return kubectl


def test_rbac_matrix_with_the_consumers_real_credentials(
    clusters: Clusters, consumer_kubeconfig: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    k = consumer_kubeconfig
    consumer = cluster_id(clusters, "consumer")
    tenant_ns = f"gpufed-tenant-{consumer}"
    twin = f"team-a-{consumer}"

    who = k("auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == f"gpufed:consumer:{consumer}"

    # Another tenant's secret that must stay out of reach.
    clusters.kubectl("gpu-a", "create", "namespace", "gpufed-tenant-someone-else")
    clusters.kubectl(
        "gpu-a", "create", "secret", "generic", "creds", "-n", "gpufed-tenant-someone-else", "--from-literal=k=v"
    )
    try:
        # Twin namespaces come through the provider's controller, not namespace rights.
        r = k(
            "create",
            "-f",
            "-",
            input_text=json.dumps(
                {
                    "apiVersion": "gpufed.io/v1alpha1",
                    "kind": "TwinNamespace",
                    "metadata": {"name": "team-a", "namespace": tenant_ns},
                    "spec": {"namespace": "team-a"},
                }
            ),
        )
        assert r.returncode == 0, r.stderr
        eventually(
            "the twin namespace",
            lambda: (
                clusters.kubectl(
                    "gpu-a", "get", "twinnamespace", "-n", tenant_ns, "team-a", "-o", "jsonpath={.status.phase}"
                ).stdout
                == "Ready"
            ),
        )
        ns = clusters.kubectl_json("gpu-a", "get", "namespace", twin)
        assert ns["metadata"]["labels"][CONSUMER_LABEL] == consumer
        eventually(
            "the twin's quota",
            lambda: (
                clusters.kubectl("gpu-a", "get", "resourcequota", "-n", twin, "gpufed-grant", check=False).returncode
                == 0
            ),
        )

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-job", "namespace": twin},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        }
        allowed = {
            "create configmap in tenant ns": k("create", "configmap", "c1", "-n", tenant_ns, "--from-literal=a=b"),
            "create pod in twin ns": k("create", "-f", "-", input_text=json.dumps(pod)),
            "list pods in twin ns": k("get", "pods", "-n", twin),
            "create secret in twin ns": k("create", "secret", "generic", "s1", "-n", twin, "--from-literal=a=b"),
            "read own quota": k("get", "resourcequota", "-n", twin),
            "list own slices": k("get", "resourceslices.gpufed.io", "-n", tenant_ns),
        }
        for what, r in allowed.items():
            assert r.returncode == 0, f"{what} should be allowed: {r.stderr}"

        forbidden = {
            "get nodes": k("get", "nodes"),
            "list namespaces": k("get", "namespaces"),
            "read kube-system secrets": k("get", "secrets", "-n", "kube-system"),
            "read another tenant's secret": k("get", "secret", "creds", "-n", "gpufed-tenant-someone-else"),
            "list pods everywhere": k("get", "pods", "-A"),
            "create a namespace": k("create", "namespace", "sneaky"),
            "create a clusterrole": k("create", "clusterrole", "x", "--verb=get", "--resource=pods"),
            "create pod in default": k("run", "p", "--image=x", "-n", "default"),
            "delete own quota": k("delete", "resourcequota", "gpufed-grant", "-n", twin),
            "write own slice status": k(
                "patch",
                "resourceslices.gpufed.io",
                cluster_id(clusters, "gpu-a"),
                "-n",
                tenant_ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                '{"status":{"granted":{"nvidia.com/gpu":"999"}}}',
            ),
            "read tenants": k("get", "tenants"),
        }
        for what, r in forbidden.items():
            assert r.returncode != 0 and "forbidden" in r.stderr.lower(), (
                f"{what} should be Forbidden: {r.stdout}{r.stderr}"
            )

        # A second twin namespace shares the grant: the quotas together never exceed it, and the
        # namespace using GPUs keeps what it uses.
        second = f"team-b-{consumer}"
        r = k(
            "create",
            "-f",
            "-",
            input_text=json.dumps(
                {
                    "apiVersion": "gpufed.io/v1alpha1",
                    "kind": "TwinNamespace",
                    "metadata": {"name": "team-b", "namespace": tenant_ns},
                    "spec": {"namespace": "team-b"},
                }
            ),
        )
        assert r.returncode == 0, r.stderr

        def gpu_hard() -> dict[str, int]:
            quotas = clusters.kubectl_json("gpu-a", "get", "resourcequota", "-A", "-l", f"{CONSUMER_LABEL}={consumer}")
            return {
                q["metadata"]["namespace"]: int(q["spec"]["hard"]["requests.nvidia.com/gpu"]) for q in quotas["items"]
            }

        def settled() -> dict[str, int] | None:
            h = gpu_hard()
            return h if second in h and h.get(twin, 0) >= 2 and sum(h.values()) == 8 else None

        split = eventually("the grant split over both twins", settled)
        assert split[tenant_ns] == 0 and split[twin] + split[second] == 8 and split[second] >= 1, split

        # The grant is enforced even against direct API use: 8 GPUs granted, 2 in use.
        greedy = {**pod, "metadata": {"name": "greedy", "namespace": twin}}
        greedy["spec"] = {
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "7"}}}]
        }
        r = k("create", "-f", "-", input_text=json.dumps(greedy))
        assert r.returncode != 0 and "exceeded quota" in r.stderr, r.stderr
        # The tenant namespace holds control objects only: its quota admits no pods at all.
        r = k(
            "run",
            "p",
            "--image=x",
            "-n",
            tenant_ns,
            "--overrides",
            '{"spec":{"containers":[{"name":"p","image":"x","resources":{"requests":{"cpu":"1m","memory":"1Mi"}}}]}}',
        )
        assert r.returncode != 0 and "exceeded quota: gpufed-grant" in r.stderr, r.stderr

        # Withdrawing the requests removes the twin namespaces.
        assert k("delete", "twinnamespace", "team-a", "team-b", "-n", tenant_ns).returncode == 0

        def twins_gone() -> bool:
            return all(
                clusters.kubectl("gpu-a", "get", "namespace", ns, check=False).returncode != 0 for ns in (twin, second)
            )

        eventually("the twin namespaces to go", twins_gone, timeout=90)
    finally:
        clusters.kubectl("gpu-a", "delete", "namespace", "gpufed-tenant-someone-else", "--wait=false", check=False)


# ---------------------------------------------------------------------------- handshake attacks


def _answer(key: Ed25519PrivateKey, ch: dict[str, str]) -> dict[str, str]:
    challenge = handshake.Challenge.from_wire(ch)
    csr = handshake.make_csr(challenge.consumer, ec.generate_private_key(ec.SECP256R1()))
    sig = handshake.sign(key, challenge, csr)
    return {"nonce": ch["nonce"], "csr": csr.decode(), "signature": base64.b64encode(sig).decode()}


def test_forged_and_replayed_answers_are_refused(clusters: Clusters) -> None:
    name = "intruder-" + dt.datetime.now().strftime("%H%M%S")
    real, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()

    def tenant() -> dict[str, Any]:
        t: dict[str, Any] = clusters.kubectl_json("gpu-a", "get", "tenant", name)
        return t

    def apply_spec(gen: int, answer: dict[str, str] | None) -> None:
        spec: dict[str, Any] = {
            "consumerClusterId": name,
            "publicKey": handshake.public_key_pem(real),
            "authGeneration": gen,
        }
        if answer:
            spec["answer"] = answer
        body = {"apiVersion": "gpufed.io/v1alpha1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec}
        clusters.kubectl(
            "gpu-a",
            "apply",
            "--server-side",
            "--field-manager=test",
            "--force-conflicts",
            "-f",
            "-",
            input_text=json.dumps(body),
        )

    def challenge(gen: int) -> dict[str, str]:
        def ready() -> dict[str, str] | None:
            st = tenant().get("status") or {}
            return st.get("challenge") if st.get("authGeneration") == gen else None

        ch: dict[str, str] = eventually("a challenge", ready)
        return ch

    try:
        apply_spec(1, None)
        ch1 = challenge(1)
        # Signed with a key that is not the registered one.
        apply_spec(1, _answer(other, ch1))
        eventually("refusal", lambda: (tenant().get("status") or {}).get("phase") == "Refused")
        c = condition(tenant(), "Authentication")
        assert c["reason"] == "InvalidSignature" and "does not verify" in c["message"], c
        events = clusters.kubectl(
            "gpu-a", "get", "events", "-A", "--field-selector", f"involvedObject.name={name}"
        ).stdout
        assert "InvalidSignature" in events, events

        # A tampered answer: the right key signed, but the CSR was swapped afterwards.
        apply_spec(2, None)
        ch2 = challenge(2)
        good = _answer(real, ch2)
        swapped = {**good, "csr": _answer(real, ch2)["csr"]}
        apply_spec(2, swapped)
        eventually("refusal", lambda: (tenant().get("status") or {}).get("phase") == "Refused")
        assert condition(tenant(), "Authentication")["reason"] == "InvalidSignature"

        # The genuine answer to a fresh challenge is accepted and a certificate issued.
        apply_spec(3, None)
        ch3 = challenge(3)
        genuine = _answer(real, ch3)
        apply_spec(3, genuine)
        eventually("authentication", lambda: (tenant().get("status") or {}).get("phase") == "Authenticated", timeout=60)
        assert tenant()["status"]["certificate"].startswith("-----BEGIN CERTIFICATE-----")

        # Replaying that answer in a later handshake is refused.
        apply_spec(4, None)
        challenge(4)
        apply_spec(4, genuine)
        eventually("refusal", lambda: (tenant().get("status") or {}).get("phase") == "Refused")
        c = condition(tenant(), "Authentication")
        assert c["reason"] == "NonceReplayed", c
    finally:
        clusters.kubectl("gpu-a", "delete", "tenant", name, "--timeout=60s", check=False, timeout=70)
        clusters.kubectl(
            "gpu-a",
            "delete",
            "namespace,csr",
            "-l",
            f"{CONSUMER_LABEL}={name}",
            "--timeout=90s",
            check=False,
            timeout=100,
        )


# ---------------------------------------------------------------------------- unpeer


def test_unpeer_leaves_nothing_on_either_side(clusters: Clusters) -> None:
    for provider in ("gpu-a", "gpu-b"):
        p = unpeer(clusters, provider)
        assert p.returncode == 0 and "nothing left on either side" in out(p), out(p)
    assert leftovers(clusters) == []
    p = unpeer(clusters, "gpu-a")
    assert p.returncode == 0 and "not peered" in out(p), out(p)
