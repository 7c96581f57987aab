"""Lifecycle of an environment on real binaries: a failing component is reported with its log,
`down` leaves no process, port or state behind, and a fixed environment comes up."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from gpufed.localenv import supervise
from gpufed.localenv.launcher import LocalEnvError, LocalEnvironment, LocalSettings
from gpufed.localenv.pki import ensure_pki
from gpufed.localenv.topology import Topology
from tests.e2e.conftest import REPO, Clusters

SOLO_BASE_PORT = 18100


def _ours(state_dir: Path, bin_dir: Path) -> list[int]:
    return supervise.orphans(state_dir, bin_dir)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_component_failure_then_clean_down_then_up(clusters: Clusters, tmp_path: Path) -> None:
    # `clusters` is requested so the binaries are built and so both environments coexist.
    bin_dir = clusters.env.settings.bin_dir
    state_dir = tmp_path / "solo-state"
    topo = Topology.model_validate(
        {
            "basePort": SOLO_BASE_PORT,
            "clusters": [
                {
                    "name": "solo",
                    "podCIDR": "10.50.0.0/16",
                    "nodePools": [{"name": "g", "count": 1, "gpus": 2, "gpuProduct": "NVIDIA-L4"}],
                }
            ],
        }
    )
    env = LocalEnvironment(
        LocalSettings(state_dir, bin_dir, build_script=REPO / "deploy/local/build.sh", start_timeout_s=120), topo
    )
    ports = topo.ports("solo")

    # A broken service-account key makes kube-apiserver exit at start.
    pki = ensure_pki(env.cluster_dir("solo") / "pki", cluster="solo", service_cidr="10.96.0.0/16")
    pki.sa_pub.write_text("not a key\n")
    with pytest.raises(LocalEnvError) as err:
        asyncio.run(env.up())
    msg = str(err.value)
    assert "kube-apiserver of cluster solo exited" in msg
    assert "last lines of" in msg and len(msg.splitlines()) > 3, msg

    # etcd was started and is still running: down must stop it.
    assert _ours(state_dir, bin_dir), "etcd should be running before down"
    assert env.down() >= 1
    assert _ours(state_dir, bin_dir) == []
    assert not state_dir.exists()
    assert not _listening(ports.etcd_client)

    # Fixed (fresh state): up succeeds, then down leaves nothing.
    asyncio.run(env.up())
    statuses = asyncio.run(env.status())
    assert statuses[0].healthy and statuses[0].nodes_ready == 1 and statuses[0].gpus == 2
    pids = [c.pid for c in statuses[0].components]
    assert all(pids) and len(set(pids)) == 6  # etcd, apiserver, kcm, scheduler, kwok, metrics-server

    # A crashed component is restarted by the next `up`; the others are left alone.
    by_name = {c.name: c.pid for c in statuses[0].components}
    kwok_pid = by_name["kwok"]
    assert kwok_pid is not None
    os.kill(kwok_pid, signal.SIGKILL)
    for _ in range(100):
        if supervise.start_time(kwok_pid) is None:
            break
        time.sleep(0.05)
    assert not asyncio.run(env.status())[0].healthy, "a dead component makes the cluster unhealthy"
    asyncio.run(env.up())
    again = {c.name: c.pid for c in asyncio.run(env.status())[0].components}
    assert again["kwok"] != kwok_pid
    assert {k: v for k, v in again.items() if k != "kwok"} == {k: v for k, v in by_name.items() if k != "kwok"}
    pids = list(again.values())
    stopped = env.down()
    assert stopped == 6
    assert _ours(state_dir, bin_dir) == []
    for pid in pids:
        assert pid is not None and supervise.start_time(pid) is None, pid
    for port in ports.all().values():
        assert not _listening(port), port
    assert not state_dir.exists()
    assert clusters.kubeconfig.exists(), "the session environment is untouched"
