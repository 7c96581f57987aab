"""Every CRD kind gpufed defines, in one tuple: what the controller checks is installed, what the
CRD generator writes, what `gpufed doctor` looks for.

Owns: `KINDS` (the kinds in install order) and `CRDKind` (the type of one of them).

Does not: define a kind (`gpufed.apis.peering`, `offloading`, `network`), or build a CRD from
one (`gpufed.devtools.crdgen`).

Pure: no I/O.
"""

from __future__ import annotations

from gpufed.apis.network import Connection, Gateway, NetworkConfig, RemoteNetwork
from gpufed.apis.offloading import NamespaceOffloading, TwinNamespace
from gpufed.apis.peering import ForeignCluster, ResourceSlice, Tenant

CRDKind = (
    type[ForeignCluster]
    | type[ResourceSlice]
    | type[Tenant]
    | type[TwinNamespace]
    | type[NamespaceOffloading]
    | type[NetworkConfig]
    | type[RemoteNetwork]
    | type[Gateway]
    | type[Connection]
)
KINDS: tuple[CRDKind, ...] = (
    ForeignCluster,
    ResourceSlice,
    Tenant,
    TwinNamespace,
    NamespaceOffloading,
    NetworkConfig,
    RemoteNetwork,
    Gateway,
    Connection,
)
