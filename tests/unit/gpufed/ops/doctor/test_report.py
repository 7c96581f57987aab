"""gpufed.ops.doctor.report: which checks run for this cluster and each peering, their order, each
check's own timeout, and the peers named on the command line."""

from __future__ import annotations

import time
from pathlib import Path

from tests.unit.gpufed.ops.doctor.scenario import (
    CONSUMER,
    NODE,
    NS,
    PROVIDER,
    Scenario,
    by_name,
    certificate,
    environment,
    run,
)


async def test_a_healthy_peering_is_ok_except_the_missing_fabric(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        report = await run(env)
    checks = by_name(report)
    assert [(c.peer, c.name) for c in report.checks] == [
        ("", "install"),
        ("", "identity"),
        ("", "controller"),
        ("", "webhook"),
        (PROVIDER, "peering"),
        (PROVIDER, "credentials"),
        (PROVIDER, "api"),
        (PROVIDER, "grant"),
        (PROVIDER, "virtual-nodes"),
        (PROVIDER, "serving-certificates"),
        (PROVIDER, "tunnel"),
        (PROVIDER, "estimator"),
    ]
    assert {n: c.status for n, c in checks.items() if c.status != "OK"} == {"tunnel": "WARN"}, report
    assert report.status == "WARN" and not report.failed
    assert report.cluster_id == CONSUMER
    assert "/version answered in" in checks["api"].finding and "v1.31.0-fake" in checks["api"].finding
    assert (
        "valid until" in checks["credentials"].finding
        and f"gpufed:consumer:{CONSUMER}" in checks["credentials"].finding
    )
    assert "nvidia.com/gpu 8/8" in checks["grant"].finding
    assert f"{NODE} Ready, lease renewed" in checks["virtual-nodes"].finding
    assert checks["serving-certificates"].finding.startswith(f"{NODE}: serving certificate ")
    assert "valid until" in checks["serving-certificates"].finding
    assert "answers over TLS verified with the caBundle" in checks["webhook"].finding
    assert "webhook answers" in checks["controller"].finding
    assert checks["tunnel"].finding == "no network fabric: pods cannot reach each other across clusters"
    assert checks["tunnel"].fix.startswith(f"create it: gpufed network connect --kubeconfig {env.kubeconfig}")
    assert "--remote-kubeconfig" in checks["tunnel"].fix
    assert all(c.fix == "" for c in report.checks if c.status == "OK")


async def test_an_unreachable_provider_fails_within_its_check_timeout(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(hang_provider=True)) as env:
        started = time.monotonic()
        report = await run(env, check_timeout_s=0.5)
        took = time.monotonic() - started
    checks = by_name(report)
    assert took < 2.5, f"the report took {took:.1f} s"
    assert checks["api"].status == "FAIL" and checks["api"].finding == "no answer within 0.5 s"
    assert "reachable" in checks["api"].fix
    assert checks["grant"].status == "OK", "checks that read only the consumer are unaffected"


async def test_missing_credentials_and_an_unknown_peer(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        env.consumer.remove("secrets", NS, f"gpufed-remote-{PROVIDER}")
        checks = by_name(await run(env))
        assert (
            checks["credentials"].status == "FAIL" and "Secret gpufed/gpufed-remote-" in checks["credentials"].finding
        )
        assert "gpufed peer" in checks["credentials"].fix
        assert checks["api"].status == "FAIL"
        report = await run(env, remote_cluster_id="gpu-z-00000000")
    c = report.checks[-1]
    assert (c.name, c.status, c.peer) == ("peering", "FAIL", "gpu-z-00000000")
    assert f"its peers: {PROVIDER}" in c.finding and "gpufed peer" in c.fix


async def test_the_provider_side_view(tmp_path: Path) -> None:
    cert, _key = certificate(90)
    async with environment(tmp_path) as env:
        s = env.consumer
        for key in [k for k in s.objects if k[0] in ("foreignclusters", "resourceslices", "nodes")]:
            s.remove(*key)
        s.create(
            "foreignclusters",
            {"metadata": {"name": "consumer-99"}, "spec": {"clusterId": "consumer-99", "roles": ["Consumer"]}},
        )
        s.create(
            "tenants",
            {
                "metadata": {"name": "consumer-99"},
                "spec": {"consumerClusterId": "consumer-99", "authGeneration": 2},
                "status": {
                    "phase": "Authenticated",
                    "namespace": "gpufed-tenant-consumer-99",
                    "certificate": cert.decode(),
                },
            },
        )
        s.create(
            "resourceslices",
            {
                "metadata": {"name": "gpu-a", "namespace": "gpufed-tenant-consumer-99"},
                "spec": {"providerClusterId": CONSUMER, "resources": {"nvidia.com/gpu": "2"}},
                "status": {"conditions": [{"type": "Resources", "status": "False", "reason": "InsufficientCapacity"}]},
            },
        )
        report = await run(env)
    assert [(c.name, c.status) for c in report.checks if c.peer == "consumer-99"] == [
        ("tunnel", "WARN"),
        ("tenant", "OK"),
        ("tenant-certificate", "OK"),
        ("tenant-grant", "FAIL"),
    ]
    assert [(p.cluster_id, p.role) for p in report.peers] == [("consumer-99", "consumer")]
    tunnel = next(c for c in report.checks if c.name == "tunnel")
    assert tunnel.fix.endswith(f"--remote-kubeconfig {env.kubeconfig}"), "run from the consumer, pointing at us"
    assert by_name(report)["webhook"].status == "OK"


async def test_an_expired_serving_certificate_of_a_virtual_node_fails(tmp_path: Path) -> None:
    async with environment(tmp_path, Scenario(serving_days=30, serving_age_days=31)) as env:
        report = await run(env)
    check = by_name(report)["serving-certificates"]
    assert (
        check.status == "FAIL"
        and check.finding.startswith(f"{NODE}: serving certificate ")
        and "expired" in check.finding
    )
    assert "kubelet-serving" in check.fix
