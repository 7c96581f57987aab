"""Launcher behaviour that needs no cluster: refusals with clear errors, process bookkeeping."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufed.localenv import components, supervise
from gpufed.localenv.launcher import LocalEnvError, LocalEnvironment, LocalSettings
from gpufed.localenv.topology import Topology, default_topology


def _one_cluster(base_port: int) -> Topology:
    return Topology.model_validate(
        {"basePort": base_port, "clusters": [{"name": "solo", "nodePools": [{"name": "p", "count": 1}]}]}
    )


def _fake_bins(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for b in components.BINARIES:
        f = d / b
        f.write_text("#!/bin/sh\nexit 0\n")
        f.chmod(0o755)
    return d


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A listening port below the ephemeral range (topologies take base ports up to 60000)."""
    for port in range(24000, 25000, 10):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            s.listen()
            yield port
            return
    raise RuntimeError("no free port in 24000-25000")


def test_missing_binaries_are_named(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "nobins"), default_topology())
    with pytest.raises(LocalEnvError, match=r"missing binaries .*kube-apiserver.*kwok.*make binaries"):
        asyncio.run(env.ensure_binaries(lambda _m: None))


def test_failed_build_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "build.sh"
    script.write_text("echo 'error: Go 1.20 is too old' >&2; exit 3\n")
    msgs: list[str] = []
    env = LocalEnvironment(LocalSettings(tmp_path / "s", tmp_path / "b", build_script=script), default_topology())
    with pytest.raises(LocalEnvError, match="exit 3"):
        asyncio.run(env.ensure_binaries(msgs.append))
    assert any("too old" in m for m in msgs)


def test_port_in_use_is_refused_before_anything_starts(tmp_path: Path, busy_port: int) -> None:
    # The busy port is the apiserver port of the only cluster.
    env = LocalEnvironment(LocalSettings(tmp_path / "state", _fake_bins(tmp_path / "bin")), _one_cluster(busy_port))
    with pytest.raises(LocalEnvError, match=rf"127\.0\.0\.1:{busy_port} \(solo kube-apiserver\).*--base-port"):
        asyncio.run(env.up())
    state = (
        json.loads((tmp_path / "state" / "state.json").read_text())
        if (tmp_path / "state" / "state.json").exists()
        else {}
    )
    assert not state.get("clusters"), "nothing may be started when a port is taken"


def test_different_topology_is_refused_while_running(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = {
            "topology": default_topology().model_dump(mode="json", by_alias=True),
            "clusters": {
                "consumer": {
                    "components": {"etcd": {"pid": sleeper.pid, "start_time": supervise.start_time(sleeper.pid)}}
                }
            },
        }
        (state_dir / "state.json").write_text(json.dumps(state))
        env = LocalEnvironment(LocalSettings(state_dir, _fake_bins(tmp_path / "bin")), _one_cluster(23000))
        with pytest.raises(LocalEnvError, match=r"different topology.*local down"):
            asyncio.run(env.up())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_without_state_is_a_no_op(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "never-created", tmp_path / "bin"), default_topology())
    assert env.down() == 0


def test_down_stops_recorded_processes_and_removes_state(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    state = {
        "topology": {},
        "clusters": {"c": {"components": {"etcd": {"pid": p.pid, "start_time": supervise.start_time(p.pid)}}}},
    }
    (state_dir / "state.json").write_text(json.dumps(state))
    env = LocalEnvironment(LocalSettings(state_dir, tmp_path / "bin"), default_topology())
    assert env.down() == 1
    assert supervise.start_time(p.pid) is None, "the recorded process must be gone"
    assert not state_dir.exists()


def test_changed_topology_of_a_stopped_environment_discards_old_state(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    old = state_dir / "clusters" / "consumer" / "etcd"
    old.mkdir(parents=True)
    (old / "member").write_text("old data")
    state = {
        "topology": default_topology().model_dump(mode="json", by_alias=True),
        "clusters": {"consumer": {"components": {"etcd": {"pid": None}}}},
    }
    (state_dir / "state.json").write_text(json.dumps(state))
    msgs: list[str] = []
    env = LocalEnvironment(LocalSettings(state_dir, tmp_path / "nobins"), _one_cluster(23000))
    with pytest.raises(LocalEnvError, match="missing binaries"):
        asyncio.run(env.up(msgs.append))
    assert not old.exists()
    assert any("discarding" in m for m in msgs)


def test_metrics_server_is_a_supervised_component_of_every_cluster(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    assert "metrics-server" in components.COMPONENTS and "metrics-server" in components.BINARIES
    cmd = env._command(env.topology.cluster("gpu-a"), "metrics-server")
    assert cmd[0] == str(tmp_path / "bin" / "metrics-server")
    pki = env.pki("gpu-a")
    for flag in (
        "--secure-port=20027",
        f"--kubeconfig={env.kubeconfig_path('gpu-a', 'metrics-server')}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        f"--tls-cert-file={pki.cert('metrics-server-serving')}",
    ):
        assert flag in cmd, flag
    # `gpufed local status` lists it with its port (nothing runs here, so it is down).
    statuses = asyncio.run(env.status())
    ms = {s.name: [c for c in s.components if c.name == "metrics-server"] for s in statuses}
    assert [(c.port, c.running) for c in ms["gpu-a"]] == [(20027, False)]
    assert all(len(v) == 1 for v in ms.values())


def test_apiserver_audit_log_is_opt_in(tmp_path: Path) -> None:
    topo = default_topology(base_port=20000)
    plain = LocalEnvironment(LocalSettings(tmp_path / "a", tmp_path / "bin"), topo)
    assert not any(a.startswith("--audit") for a in plain._command(topo.cluster("gpu-a"), "kube-apiserver"))
    env = LocalEnvironment(LocalSettings(tmp_path / "b", tmp_path / "bin", audit=True), topo)
    spec = topo.cluster("gpu-a")
    env._prepare_cluster(spec)
    cmd = env._command(spec, "kube-apiserver")
    policy = env.cluster_dir("gpu-a") / "audit-policy.yaml"
    for flag in (
        f"--audit-policy-file={policy}",
        f"--audit-log-path={env.audit_log_path('gpu-a')}",
        "--audit-log-format=json",
        f"--audit-log-maxsize={components.AUDIT_LOG_MAX_MB}",
    ):
        assert flag in cmd, flag
    assert "level: Metadata" in policy.read_text() and "RequestReceived" in policy.read_text()
    assert env.audit_log_path("gpu-a").parent.is_dir()
