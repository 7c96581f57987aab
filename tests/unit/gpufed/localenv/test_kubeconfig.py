"""Kubeconfig files: self-contained, one context per cluster, owner-only."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import yaml

from gpufed.localenv import kubeconfig
from gpufed.localenv.pki import ensure_pki


def test_build_merge_write(tmp_path: Path) -> None:
    a = ensure_pki(tmp_path / "a", cluster="a", service_cidr="10.96.0.0/16")
    b = ensure_pki(tmp_path / "b", cluster="b", service_cidr="10.96.0.0/16")
    ca = kubeconfig.build("a", "https://127.0.0.1:1", a, "admin")
    cb = kubeconfig.build("b", "https://127.0.0.1:2", b, "scheduler")
    assert ca["current-context"] == "a"
    assert base64.b64decode(ca["clusters"][0]["cluster"]["certificate-authority-data"]) == a.ca_cert.read_bytes()
    assert base64.b64decode(cb["users"][0]["user"]["client-certificate-data"]) == b.cert("scheduler").read_bytes()

    merged = kubeconfig.merge([ca, cb])
    assert [c["name"] for c in merged["contexts"]] == ["a", "b"]
    assert merged["current-context"] == "a"
    assert {u["name"] for u in merged["users"]} == {"a-admin", "b-scheduler"}

    out = tmp_path / "dir" / "kubeconfig"
    kubeconfig.write(out, merged)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert yaml.safe_load(out.read_text()) == merged
