"""`gpufed local status`: what runs of each local cluster, and what its API server says.

Owns `ComponentStatus` / `ClusterStatus`, the processes' liveness from the environment's state file
(`components_status`), and the cluster's figures read from its API server (`fill`): version, nodes
Ready, GPUs — device-plugin GPUs in allocatable plus the DRA-managed nodes' devices (a DRA node
advertises no `nvidia.com/gpu`).

Does not: start or stop anything (`launcher`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufed.kube.client import api_client, client, translating
from gpufed.localenv import install, supervise
from gpufed.localenv.topology import ClusterSpec


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    port: int


@dataclass
class ClusterStatus:
    name: str
    apiserver: str
    healthy: bool
    version: str
    nodes_ready: int
    nodes_total: int
    gpus: int
    components: list[ComponentStatus] = field(default_factory=list)


def components_status(cluster_state: Mapping[str, Any], listening: Iterable[tuple[str, int]]) -> list[ComponentStatus]:
    """Each (component, port) as the state file records its process (port 0: listens nowhere fixed)."""
    out = []
    for comp, port in listening:
        info = cluster_state.get(comp, {})
        out.append(
            ComponentStatus(comp, info.get("pid"), supervise.alive(info.get("pid"), info.get("start_time")), port)
        )
    return out


async def fill(spec: ClusterSpec, st: ClusterStatus, kubeconfig: Path) -> None:
    """Version, Ready nodes and GPUs from the cluster's API server."""
    async with api_client(kubeconfig) as api, translating(f"status of {spec.name}"):
        version = await client.VersionApi(api).get_code(_request_timeout=3)
        nodes = (await client.CoreV1Api(api).list_node(_request_timeout=3)).items
    st.version = version.git_version
    st.healthy = True
    st.nodes_total = len(nodes)
    dra_gpus = {n.name: n.pool.gpus for n in spec.nodes() if n.dra}
    for n in nodes:
        if install.node_ready(n):
            st.nodes_ready += 1
        st.gpus += int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) + dra_gpus.get(n.metadata.name, 0)


__all__ = ["ClusterStatus", "ComponentStatus", "components_status", "fill"]
