"""Starts and keeps running one `gpufed virtual-kubelet` process per peered provider.

Owns: the set of virtual-kubelet child processes of this controller — one per ForeignCluster with
role Provider whose credentials exist (phase Peered); a block of `PORTS_PER_VIRTUAL_KUBELET`
kubelet ports for each from the configured range (one per pool node; kept while the process
lives); restarts with capped backoff when a process exits while its peering exists (a crash or
`kill -9` is survived: the new process adopts the nodes and their pods); stopping them when the
controller stops. When a peering is removed the virtual kubelet sees it itself, deletes its Nodes
and exits 0; the supervisor then does not restart it. A child also ends when the controller dies
without stopping it (kill -9, OOM): it runs `exit_with_supervisor` first, so the kernel sends it
SIGTERM (an ordinary stop, which leaves its Nodes and pods for the next process to adopt) instead of
leaving it running unsupervised on the kubelet ports the restarted controller hands out again.

This is how the local environment runs virtual kubelets; in a real cluster the Helm chart runs them
as Deployments and this supervisor is off (no --virtual-kubelet-kubeconfig).

Does not: talk to providers, or read the virtual kubelets' logs (they write their own files).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import VIRTUAL_NODE_PREFIX
from gpufed.kube import rest
from gpufed.kube.watch import watch

#: Backoff (s) between restarts of a virtual kubelet that keeps exiting: doubles up to the cap.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
#: A process that ran this long (s) before exiting restarts without backoff.
HEALTHY_RUN_S = 60.0
#: Seconds a stopping process gets before SIGKILL.
STOP_GRACE_S = 10.0
#: Kubelet ports per virtual kubelet: one per pool node it may serve (GPU products of a provider,
#: plus a draining node while pools change).
PORTS_PER_VIRTUAL_KUBELET = 3


@dataclass(frozen=True)
class SupervisorSettings:
    kubeconfig: Path
    kubelet_ports: tuple[int, int]
    node_address: str
    log_dir: Path | None = None
    context: str | None = None


#: The controller's own settings that must not reach its children through the environment (a
#: virtual kubelet would try to serve metrics on the controller's port).
NOT_INHERITED = ("GPUFED_METRICS_PORT", "GPUFED_METRICS_HOST")


def child_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}


#: prctl(2) option: the signal this process gets when the thread that forked it exits.
PR_SET_PDEATHSIG = 1


def exit_with_supervisor(supervisor_pid: int) -> None:
    """Called first thing in a supervised virtual kubelet (`--exit-with-parent`): SIGTERM to this
    process when its supervisor dies, however it dies. Linux only (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != supervisor_pid:  # it died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def node_name(provider: str) -> str:
    return f"{VIRTUAL_NODE_PREFIX}{provider}"


class Child:
    def __init__(self, provider: str, ports: tuple[int, int]) -> None:
        self.provider = provider
        self.ports = ports
        self.proc: asyncio.subprocess.Process | None = None
        self.wanted = True
        self.task: asyncio.Task[None] | None = None


class Supervisor:
    def __init__(self, api: Any, settings: SupervisorSettings) -> None:
        self.api = api
        self.settings = settings
        self.children: dict[str, Child] = {}
        self._log = structlog.get_logger().bind(component="virtual-kubelet-supervisor")
        self._tg: asyncio.TaskGroup | None = None

    def _peered(self, obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        st = obj.get("status") or {}
        return (
            "Provider" in (spec.get("roles") or [])
            and not obj["metadata"].get("deletionTimestamp")
            and bool(st.get("kubeconfigSecret"))
        )

    def _on_fc(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        want = kind != "DELETED" and self._peered(obj)
        child = self.children.get(name)
        if want and child is None:
            self._spawn(name)
        elif want and child is not None:
            child.wanted = True  # e.g. peered again while the last process is still exiting
        elif not want and child is not None and kind == "DELETED":
            # The virtual kubelet removes its node and exits by itself; stop waiting for it otherwise.
            child.wanted = False

    def _free_ports(self) -> tuple[int, int]:
        used = {c.ports[0] for c in self.children.values()}
        first, last = self.settings.kubelet_ports
        n = PORTS_PER_VIRTUAL_KUBELET
        for p in range(first, last + 1, n):
            if p not in used:
                return p, min(p + n - 1, last)
        raise RuntimeError(f"no free kubelet ports in {first}-{last} for another virtual kubelet ({n} each)")

    def _spawn(self, provider: str) -> None:
        assert self._tg is not None
        try:
            ports = self._free_ports()
        except RuntimeError as e:
            self._log.error("virtual kubelet not started", remote_cluster=provider, error=str(e))
            return
        child = Child(provider, ports)
        self.children[provider] = child
        child.task = self._tg.create_task(self._keep(child))

    def command(self, child: Child) -> list[str]:
        s = self.settings
        cmd = [
            sys.executable,
            "-m",
            "gpufed.cli",
            "virtual-kubelet",
            f"--kubeconfig={s.kubeconfig}",
            f"--provider-cluster-id={child.provider}",
            f"--node-name={node_name(child.provider)}",
            f"--node-address={s.node_address}",
            f"--kubelet-ports={child.ports[0]}-{child.ports[1]}",
            f"--exit-with-parent={os.getpid()}",
        ]
        if s.context:
            cmd.append(f"--context={s.context}")
        return cmd

    async def _keep(self, child: Child) -> None:
        backoff = RESTART_BACKOFF_S
        loop = asyncio.get_running_loop()
        log = self._log.bind(remote_cluster=child.provider, node=node_name(child.provider))
        try:
            while child.wanted:
                out: Any = None
                if self.settings.log_dir is not None:
                    self.settings.log_dir.mkdir(parents=True, exist_ok=True)
                    out = (self.settings.log_dir / f"virtual-kubelet-{child.provider}.log").open("ab")
                try:
                    child.proc = await asyncio.create_subprocess_exec(
                        *self.command(child),
                        stdout=out,
                        stderr=out,
                        stdin=asyncio.subprocess.DEVNULL,
                        env=child_environment(),
                    )
                finally:
                    if out is not None:
                        out.close()
                started = loop.time()
                log.info("virtual kubelet started", pid=child.proc.pid, ports=f"{child.ports[0]}-{child.ports[1]}")
                code = await child.proc.wait()
                if code == 0 or not child.wanted:
                    log.info("virtual kubelet exited", code=code)
                    # Peered again meanwhile (a new ForeignCluster of the same name)? Serve that one.
                    fc = await rest.get(self.api, rest.path(API_VERSION, "foreignclusters", child.provider))
                    child.wanted = fc is not None and self._peered(fc)
                    continue
                ran = loop.time() - started
                backoff = RESTART_BACKOFF_S if ran >= HEALTHY_RUN_S else min(backoff * 2, RESTART_BACKOFF_MAX_S)
                log.warning("virtual kubelet died; restarting", code=code, ran_s=round(ran, 1), restart_in_s=backoff)
                await asyncio.sleep(backoff)
                fc = await rest.get(self.api, rest.path(API_VERSION, "foreignclusters", child.provider))
                child.wanted = fc is not None and self._peered(fc)
        finally:
            await self._stop(child)
            self.children.pop(child.provider, None)

    async def _stop(self, child: Child) -> None:
        proc = child.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.shield(asyncio.wait_for(proc.wait(), STOP_GRACE_S))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(
                watch(self.api, rest.path(API_VERSION, "foreignclusters"), self._on_fc, what="foreignclusters")
            )
