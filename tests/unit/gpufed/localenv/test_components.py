"""The command lines of the local clusters' components, built without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.localenv import components, jobset, kueue
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import default_topology


def test_every_controller_serves_the_capacity_estimator_on_its_port(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    for spec in env.topology.clusters:
        cmd = components.command(env, spec, env.topology.ports(spec.name), components.CONTROLLER, audit=False)
        port = env.topology.ports(spec.name).estimator
        assert f"--estimator-port={port}" in cmd and "--estimator-host=127.0.0.1" in cmd, spec.name
    assert env.topology.ports("gpu-b").estimator == 20058


def test_every_component_listens_on_loopback_on_its_own_port(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    spec = env.topology.cluster("consumer")
    ports = env.topology.ports("consumer")
    assert set(components.ports_of(ports)) == set(components.COMPONENTS)
    assert len(set(components.ports_of(ports).values())) == len(components.COMPONENTS)
    for comp in components.COMPONENTS:
        cmd = components.command(env, spec, ports, comp, audit=False)
        assert cmd[0] == str(tmp_path / "bin" / comp), comp
        assert not any("0.0.0.0" in a for a in cmd), comp
        assert any(str(components.ports_of(ports)[comp]) in a for a in cmd), comp


def test_every_identity_has_a_kubeconfig_and_unknown_components_are_refused(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology())
    assert {"admin", components.CONTROLLER, components.VIRTUAL_KUBELET} <= set(components.IDENTITIES)
    spec = env.topology.cluster("gpu-a")
    with pytest.raises(ValueError, match="nope"):
        components.command(env, spec, env.topology.ports("gpu-a"), "nope", audit=False)


def test_kueue_is_a_component_of_the_clusters_that_run_it(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    consumer, gpu_a = env.topology.cluster("consumer"), env.topology.cluster("gpu-a")
    assert components.components_of(consumer) == (*components.COMPONENTS, components.KUEUE, components.JOBSET)
    assert components.components_of(gpu_a) == components.COMPONENTS
    assert "kueue" in components.BINARIES and kueue.IDENTITY in components.IDENTITIES
    ports = env.topology.ports("consumer")
    assert components.ports_of(ports, kueue=True)[components.KUEUE] == ports.kueue_webhook == 20009
    assert components.KUEUE not in components.ports_of(ports)
    assert components.other_ports(ports, components.KUEUE) == (20010, 20011)
    assert components.other_ports(ports, "etcd") == (ports.etcd_peer,)
    assert components.other_ports(ports, "kwok") == ()


def test_jobset_runs_with_its_own_identity_configuration_and_ports(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    spec = env.topology.cluster("consumer")
    d = env.cluster_dir("consumer")
    assert "jobset" in components.BINARIES and jobset.IDENTITY in components.IDENTITIES
    ports = env.topology.ports("consumer")
    assert components.ports_of(ports, jobset=True)[components.JOBSET] == ports.jobset_webhook == 20012
    assert components.JOBSET not in components.ports_of(ports, kueue=True)
    assert components.other_ports(ports, components.JOBSET) == (20013,)
    cmd = components.command(env, spec, ports, components.JOBSET, audit=False)
    assert cmd == [
        str(tmp_path / "bin" / "jobset"),
        f"--config={d / components.JOBSET_CONFIG_FILE}",
        f"--kubeconfig={env.kubeconfig_path('consumer', jobset.IDENTITY)}",
    ]
    cfg = components.jobset_config(env, spec, ports)
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 20012, "certDir": str(d / components.JOBSET_CERT_DIR)}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:20013"}


def test_kueue_runs_with_its_own_identity_configuration_and_certificates(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    spec = env.topology.cluster("consumer")
    d = env.cluster_dir("consumer")
    cmd = components.command(env, spec, env.topology.ports("consumer"), components.KUEUE, audit=False)
    assert cmd == [
        "env",
        f"{kueue.METRICS_CERT_ENV}={d / components.KUEUE_CERT_DIR}",
        str(tmp_path / "bin" / "kueue"),
        f"--config={d / components.KUEUE_CONFIG_FILE}",
        f"--kubeconfig={env.kubeconfig_path('consumer', kueue.IDENTITY)}",
    ]
    cfg = components.kueue_config(env, spec, env.topology.ports("consumer"))
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 20009, "certDir": str(d / components.KUEUE_CERT_DIR)}
    assert cfg["metrics"] == {"bindAddress": "127.0.0.1:20010"}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:20011"}
    assert cfg["integrations"] == {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]}
