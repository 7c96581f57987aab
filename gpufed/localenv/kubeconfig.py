"""Kubeconfig files for local clusters.

Owns: one kubeconfig per (cluster, identity) with the certificate data embedded (so the file is
self-contained and can be handed to another process or machine), and the merged kubeconfig with
one context per cluster named after the cluster. Files are written 0600 because they embed keys.

Does not: generate keys (see `pki`) or talk to an API server.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gpufed.localenv.pki import ClusterPKI


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def build(cluster: str, server: str, pki: ClusterPKI, identity: str, *, user_name: str | None = None) -> dict[str, Any]:
    """A kubeconfig whose only context is named `cluster`, authenticating as `identity`'s cert."""
    user = user_name or f"{cluster}-{identity}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)}}],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(pki.cert(identity)),
                    "client-key-data": _b64(pki.key(identity)),
                },
            }
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }


def merge(configs: Iterable[dict[str, Any]], current: str | None = None) -> dict[str, Any]:
    """Merge single-context kubeconfigs; the first context is current unless `current` is given."""
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [],
        "users": [],
        "contexts": [],
        "preferences": {},
    }
    for cfg in configs:
        for key in ("clusters", "users", "contexts"):
            out[key].extend(cfg[key])
    if out["contexts"]:
        out["current-context"] = current or out["contexts"][0]["name"]
    return out


def write(path: Path, config: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    tmp.replace(path)
