"""gpufed.ops.doctor.probes against in-memory API servers and a real TLS webhook: one thing broken at
a time, each probe's check says what is wrong and how to fix it (run through `diagnose`, as the CLI
runs them)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from gpufed.kube import servingtls
from tests.unit.gpufed.ops.doctor.scenario import (
    CONSUMER,
    NODE,
    NS,
    PROVIDER,
    Scenario,
    b64,
    by_name,
    environment,
    run,
    stamp,
)


async def test_a_slow_provider_api_is_a_warn(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        report = await run(env, slow_api_ms=0.001)
    api = by_name(report)["api"]
    assert api.status == "WARN" and api.finding.startswith("slow: GET http"), api
    assert "/version answered in" in api.finding


async def test_a_fresh_tunnel_is_ok_and_its_mtu_is_judged(tmp_path: Path) -> None:
    began = time.monotonic()
    async with environment(tmp_path, Scenario(fabric=(20, "Connected", 1420))) as env:
        checks = by_name(await run(env))
    elapsed = time.monotonic() - began  # the handshake was stamped 20 s before "now" while setting up
    assert checks["tunnel"].status == "OK"
    found = re.fullmatch(r"Connected \(Client\), handshake (\d+) s ago, RTT 0\.40 ms", checks["tunnel"].finding)
    assert found is not None, checks["tunnel"].finding
    assert 20 <= int(found[1]) <= 21 + elapsed, checks["tunnel"].finding
    assert checks["mtu"].status == "OK" and "MTU 1420 (automatic)" in checks["mtu"].finding


async def test_expired_credentials_fail_with_a_renewal_and_no_secret_is_shown(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(cert_days=-2)) as env:
        report = await run(env)
    c = by_name(report)["credentials"]
    assert c.status == "FAIL" and "expired 2 days ago" in c.finding, c
    assert "authGeneration" in c.fix and "gpufed peer --kubeconfig" in c.fix
    assert report.failed
    dumped = json.dumps(report.to_dict())
    assert "PRIVATE KEY" not in dumped and b64(env.key_pem) not in dumped and "not-a-real-token" not in dumped


async def test_credentials_expiring_within_a_week_warn(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(cert_days=3)) as env:
        c = by_name(await run(env))["credentials"]
    assert c.status == "WARN" and "expires in" in c.finding and "authGeneration" in c.fix


async def test_a_denied_slice_fails_with_its_reason_and_what_to_change(tmp_path: Path) -> None:
    sc = Scenario(slice_condition=("False", "PolicyLimit", "the tenant may use at most 4 nvidia.com/gpu"))
    async with environment(tmp_path, sc) as env:
        c = by_name(await run(env))["grant"]
    assert c.status == "FAIL"
    assert c.finding == f"slice {PROVIDER} Denied (PolicyLimit): the tenant may use at most 4 nvidia.com/gpu"
    assert "spec.policy.maxResources" in c.fix and f"edit tenant.gpufed.io {CONSUMER}" in c.fix


async def test_a_partial_grant_warns(tmp_path: Path) -> None:
    sc = Scenario(slice_condition=("True", "PartialGrant", "4 of 8"), granted_gpus="4")
    async with environment(tmp_path, sc) as env:
        c = by_name(await run(env))["grant"]
    assert c.status == "WARN" and "nvidia.com/gpu 4/8" in c.finding and "ask for less" in c.fix


async def test_a_not_ready_virtual_node_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(node_ready=False)) as env:
        c = by_name(await run(env))["virtual-nodes"]
    assert c.status == "FAIL"
    assert f"{NODE} NotReady (ProviderUnreachable: the provider's API does not answer)" in c.finding
    assert f"describe node {NODE}" in c.fix


async def test_a_stale_node_lease_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(lease_age_s=300)) as env:
        c = by_name(await run(env))["virtual-nodes"]
    assert c.status == "FAIL" and "renewed 5 min ago (expires after 40 s)" in c.finding
    assert "virtual kubelet" in c.fix and "gpufed controller" in c.fix


async def test_a_stale_or_missing_handshake_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(fabric=(600, "Down", 1420))) as env:
        c = by_name(await run(env))["tunnel"]
    assert c.status == "FAIL" and "last WireGuard handshake 10 min ago (stale after 180 s)" in c.finding
    assert f"gpufed gateway --name {PROVIDER}" in c.fix and "192.0.2.7:51820" in c.fix
    async with environment(tmp_path, Scenario(fabric=(None, "Pending", 0))) as env:
        c = by_name(await run(env))["tunnel"]
    assert c.status == "FAIL" and c.finding.startswith(f"no WireGuard handshake with {PROVIDER} ever")


async def test_a_missing_webhook_configuration_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(webhook=False)) as env:
        report = await run(env)
    checks = by_name(report)
    assert checks["webhook"].status == "FAIL"
    assert "MutatingWebhookConfiguration gpufed-offloading is missing" in checks["webhook"].finding
    assert "--webhook-port" in checks["webhook"].fix
    assert checks["controller"].status == "WARN", "no Lease and no webhook: the controller cannot be confirmed"


async def test_a_webhook_that_does_not_answer_fails_and_says_how_to_unblock_pods(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:

        def dead(cfg: dict[str, Any]) -> None:
            cfg["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:1/mutate-pods"

        env.consumer.update("mutatingwebhookconfigurations", "", "gpufed-offloading", dead)
        c = by_name(await run(env))["webhook"]
    assert c.status == "FAIL" and "https://127.0.0.1:1/healthz does not answer" in c.finding
    assert "delete mutatingwebhookconfiguration gpufed-offloading" in c.fix


async def test_the_estimator_this_cluster_serves_answers_tls_with_its_published_ca(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(webhook=False)) as env:
        cm = {"metadata": {"name": "gpufed-estimator", "namespace": NS}, "data": {"endpoint": env.tls_endpoint}}
        cm["data"]["ca.crt"] = env.tls_ca.decode()
        env.consumer.create("configmaps", cm)
        checks = by_name(await run(env))
        assert checks["estimator-server"].status == "OK", checks["estimator-server"]
        assert "certificate verified with the published ca.crt" in checks["estimator-server"].finding
        assert checks["controller"].status == "OK" and "capacity estimator answers" in checks["controller"].finding

        def other_ca(obj: dict[str, Any]) -> None:
            obj["data"]["ca.crt"] = servingtls.issue("127.0.0.1", days=1).ca_pem.decode()

        env.consumer.update("configmaps", NS, "gpufed-estimator", other_ca)
        c = by_name(await run(env))["estimator-server"]
    assert c.status == "FAIL" and "certificate not signed by the published ca.crt" in c.finding
    assert "--estimator-port" in c.fix


async def test_a_stale_controller_lease_fails(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        env.consumer.create(
            "leases",
            {
                "metadata": {"name": "gpufed-controller", "namespace": NS},
                "spec": {"holderIdentity": "ctl-0", "leaseDurationSeconds": 15, "renewTime": stamp(100, True)},
            },
        )
        began = time.monotonic()
        c = by_name(await run(env))["controller"]
        elapsed = time.monotonic() - began
    found = re.search(r"last renewed (\d+) s ago by ctl-0", c.finding)
    assert c.status == "FAIL" and found is not None, c
    assert 100 <= int(found[1]) <= 101 + elapsed, c
    assert "gpufed controller --kubeconfig" in c.fix


async def test_a_refused_connection_to_the_provider_fails_with_the_address(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(provider_url="http://127.0.0.1:1")) as env:
        c = by_name(await run(env))["api"]
    assert c.status == "FAIL" and "cannot reach http://127.0.0.1:1 from here" in c.finding
    assert "--remote-api-server" in c.fix


async def test_a_cluster_without_gpufed_fails_the_install_checks(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        for key in [k for k in env.consumer.objects if k[0] in ("customresourcedefinitions", "configmaps")]:
            env.consumer.remove(*key)
        checks = by_name(await run(env))
    assert checks["install"].status == "FAIL" and "CRD foreignclusters.gpufed.io" in checks["install"].finding
    assert "deploy/crds/" in checks["install"].fix
    assert checks["identity"].status == "FAIL" and "gpufed controller --kubeconfig" in checks["identity"].fix
