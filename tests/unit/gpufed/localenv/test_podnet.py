"""The demo's pod networks without root: the kube-proxy stand-in's ruleset, names, requirements."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufed.localenv.podnet import PodNetwork, hold_tag, missing_requirements, service_ruleset


def test_service_ruleset_dnats_the_cluster_ip_round_robin_to_every_endpoint() -> None:
    rules = service_ruleset("10.96.0.25", 80, [("10.64.1.5", 8080), ("10.66.1.2", 8080)])
    assert "type nat hook output priority -100" in rules
    assert "ip daddr 10.96.0.25 tcp dport 80 jump service" in rules
    assert "numgen inc mod 2 vmap { 0 : goto endpoint0, 1 : goto endpoint1 }" in rules
    assert "meta l4proto tcp dnat to 10.64.1.5:8080" in rules and "meta l4proto tcp dnat to 10.66.1.2:8080" in rules
    with pytest.raises(ValueError):
        service_ruleset("10.96.0.25", 80, [])
    with pytest.raises(ValueError):
        service_ruleset("not-an-ip", 80, [("10.64.1.5", 8080)])


def test_pod_network_names_fit_the_kernel_limits(tmp_path: Path) -> None:
    net = PodNetwork(wireguard_go=tmp_path / "wg", kubeconfig=tmp_path / "kc", gpufed=["gpufed"], logs=tmp_path)
    assert net.ns("cgw0").startswith("gfdemo") and net.tag in net.ns("cgw0")
    assert net.client == net.ns("cpod")
    names = [net._next_link(net.ns("pgw0"), "pod") for _ in range(3)]
    assert names == ["pod0", "pod1", "pod2"]
    assert net._next_link(net.ns("cpod"), "eth") == "eth0"
    assert all(len(n) <= 15 for n in names)


def test_missing_requirements_name_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("shutil.which", lambda tool: None if tool in ("nft", "ping") else f"/usr/sbin/{tool}")
    why = missing_requirements(tmp_path / "wireguard-go")
    assert any("not root" in w for w in why)
    assert any("`nft`" in w and "nftables" in w for w in why)
    assert any("`ping`" in w and "iputils-ping" in w for w in why)
    assert any("wireguard-go" in w and "make binaries" in w for w in why)
    assert not any("`ip`" in w for w in why)


def test_a_tag_is_held_by_one_run_until_it_releases_it(tmp_path: Path) -> None:
    first = hold_tag(tmp_path, "ab12")
    assert first is not None
    assert hold_tag(tmp_path, "ab12") is None  # held: another run must take another tag
    os.close(first)  # what the kernel does when the holder dies
    again = hold_tag(tmp_path, "ab12")
    assert again is not None
    os.close(again)


async def test_prepare_takes_another_tag_when_a_living_run_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reaped: list[Path] = []

    async def reap(registry: Path) -> list[str]:
        reaped.append(registry)
        return ["deleted netns gfdemo0000-cgw0"]

    monkeypatch.setattr("gpufed.localenv.podnet.reap_stale", reap)
    held = hold_tag(tmp_path, "ab12")
    assert held is not None
    net = PodNetwork(
        wireguard_go=tmp_path / "wg", kubeconfig=tmp_path / "kc", gpufed=["gpufed"], logs=tmp_path, tag="ab12",
        registry=tmp_path,
    )  # fmt: skip
    assert await net.prepare() == ["deleted netns gfdemo0000-cgw0"]
    assert net.tag != "ab12" and (tmp_path / f"{net.tag}.lock").exists()
    assert hold_tag(tmp_path, net.tag) is None
    assert await net.prepare() == [] and reaped == [tmp_path]  # once held, nothing more
    assert await net.teardown() == []
    assert not (tmp_path / f"{net.tag}.lock").exists()
    os.close(held)
