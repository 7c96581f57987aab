"""Launcher behaviour that needs no cluster: refusals with clear errors, process bookkeeping."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufed.localenv import components, kueue, supervise
from gpufed.localenv.launcher import LocalEnvError, LocalEnvironment, LocalSettings
from gpufed.localenv.topology import Topology, default_topology
from tests.unit.gpufed.localenv.test_kueue import write_module


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
        "--secure-port=20032",
        f"--kubeconfig={env.kubeconfig_path('gpu-a', 'metrics-server')}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        f"--tls-cert-file={pki.cert('metrics-server-serving')}",
    ):
        assert flag in cmd, flag
    # `gpufed local status` lists it with its port (nothing runs here, so it is down).
    statuses = asyncio.run(env.status())
    ms = {s.name: [c for c in s.components if c.name == "metrics-server"] for s in statuses}
    assert [(c.port, c.running) for c in ms["gpu-a"]] == [(20032, False)]
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


def _kueue_cluster(base_port: int, *, kueue: bool = True) -> Topology:
    return Topology.model_validate(
        {
            "basePort": base_port,
            "clusters": [{"name": "solo", "kueue": kueue, "nodePools": [{"name": "p", "count": 1}]}],
        }
    )


def test_a_cluster_running_kueue_gets_its_configuration_and_certificate_directory(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    for spec in env.topology.clusters:
        env._prepare_cluster(spec)
    d = env.cluster_dir("consumer")
    cert_dir = d / components.KUEUE_CERT_DIR
    pki = env.pki("consumer")
    assert (cert_dir / "tls.crt").read_bytes() == pki.cert(kueue.SERVING_STEM).read_bytes()
    assert (cert_dir / "tls.key").read_bytes() == pki.key(kueue.SERVING_STEM).read_bytes()
    assert stat.S_IMODE(cert_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((cert_dir / "tls.key").stat().st_mode) == 0o600
    config = yaml.safe_load((d / components.KUEUE_CONFIG_FILE).read_text())
    assert config == components.kueue_config(env, env.topology.cluster("consumer"), env.topology.ports("consumer"))
    assert env.kubeconfig_path("consumer", kueue.IDENTITY).exists()
    # providers run no Kueue
    assert not (env.cluster_dir("gpu-a") / components.KUEUE_CONFIG_FILE).exists()
    assert not (env.cluster_dir("gpu-a") / components.KUEUE_CERT_DIR).exists()
    # a second preparation (a second `up`) rewrites the same
    env._prepare_cluster(env.topology.cluster("consumer"))
    assert (cert_dir / "tls.key").read_bytes() == pki.key(kueue.SERVING_STEM).read_bytes()


def test_kueues_module_is_found_next_to_the_build_script(tmp_path: Path) -> None:
    topo = default_topology()
    script = tmp_path / "deploy" / "local" / "build.sh"
    assert LocalEnvironment(LocalSettings(tmp_path / "s", tmp_path / "b", build_script=script), topo).kueue_module == (
        tmp_path / "deploy" / "local" / "kueue"
    )
    given = LocalSettings(tmp_path / "s", tmp_path / "b", build_script=script, kueue_module=tmp_path / "k")
    assert LocalEnvironment(given, topo).kueue_module == tmp_path / "k"
    checkout = LocalEnvironment(LocalSettings(tmp_path / "s", tmp_path / "b"), topo).kueue_module
    assert checkout.parts[-3:] == ("deploy", "local", "kueue") and (checkout / "go.mod").exists()


def _fake_go(bin_dir: Path, module: Path, source: Path, *, fail: bool = False) -> None:
    """A `go` that answers only `go list -m -f {{.Dir}} sigs.k8s.io/kueue`, run in `module` without
    toolchain downloads, with `source`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = bin_dir / "go"
    go.write_text(
        "#!/bin/sh\n"
        '[ "$*" = "list -m -f {{.Dir}} sigs.k8s.io/kueue" ] || { echo "unexpected: $*" >&2; exit 2; }\n'
        f'[ "$(pwd)" = "{module}" ] || {{ echo "wrong directory $(pwd)" >&2; exit 2; }}\n'
        '[ "$GOTOOLCHAIN" = local ] && [ "$GOFLAGS" = -mod=readonly ] || { echo "toolchain" >&2; exit 2; }\n'
        + ('echo "go: sigs.k8s.io/kueue: not a known dependency" >&2; exit 1\n' if fail else f"echo {source}\n")
    )
    go.chmod(0o755)


def test_kueues_manifests_are_read_from_the_module_go_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "kueue-module"
    module.mkdir()
    _fake_go(tmp_path / "gobin", module, write_module(tmp_path / "src"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'gobin'}:/usr/bin:/bin")
    env = LocalEnvironment(LocalSettings(tmp_path / "s", tmp_path / "b", kueue_module=module), default_topology())
    src = asyncio.run(env._read_kueue_sources())
    assert [c["metadata"]["name"] for c in src.crds] == ["workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"]


def test_kueues_manifests_that_cannot_be_found_are_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "kueue-module"
    module.mkdir()
    _fake_go(tmp_path / "gobin", module, tmp_path, fail=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'gobin'}:/usr/bin:/bin")
    env = LocalEnvironment(LocalSettings(tmp_path / "s", tmp_path / "b", kueue_module=module), default_topology())
    with pytest.raises(LocalEnvError, match=rf"cannot read Kueue's manifests from its Go module {module}.*not a known"):
        asyncio.run(env._read_kueue_sources())
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LocalEnvError, match=r"cannot read Kueue's manifests.*not installed"):
        asyncio.run(env._read_kueue_sources())


def test_kueues_ports_are_checked_only_where_it_runs(tmp_path: Path, busy_port: int) -> None:
    # The busy port is Kueue's health port (+11).
    env = LocalEnvironment(
        LocalSettings(tmp_path / "state", _fake_bins(tmp_path / "bin")), _kueue_cluster(busy_port - 11)
    )
    with pytest.raises(LocalEnvError, match=rf"127\.0\.0\.1:{busy_port} \(solo kueue\)"):
        asyncio.run(env.up())
    # without Kueue the port is reserved but nobody binds it: no refusal there (the up then fails
    # for want of a real etcd, after the port check)
    env = LocalEnvironment(
        LocalSettings(tmp_path / "state2", _fake_bins(tmp_path / "bin2")), _kueue_cluster(busy_port - 11, kueue=False)
    )
    with pytest.raises(LocalEnvError) as err:
        asyncio.run(env.up())
    assert "ports in use" not in str(err.value)


def test_kueue_is_listed_and_stopped_with_the_cluster_that_runs_it(tmp_path: Path) -> None:
    env = LocalEnvironment(LocalSettings(tmp_path / "state", tmp_path / "bin"), default_topology(base_port=20000))
    statuses = {s.name: [c for c in s.components if c.name == components.KUEUE] for s in asyncio.run(env.status())}
    assert [(c.port, c.running) for c in statuses["consumer"]] == [(20009, False)]
    assert statuses["gpu-a"] == [] and statuses["gpu-b"] == []

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    state = {
        "topology": {},
        "clusters": {"consumer": {"components": {"kueue": {"pid": p.pid, "start_time": supervise.start_time(p.pid)}}}},
    }
    (state_dir / "state.json").write_text(json.dumps(state))
    assert env.down() == 1
    assert supervise.start_time(p.pid) is None
