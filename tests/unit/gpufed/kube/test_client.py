"""gpufed.kube.client.require_kubeconfig: the one check every command makes before it connects, with
the message each command prints and the exit code the CLI maps it to."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.errors import GpufedError
from gpufed.kube.client import KubeconfigError, KubeError, require_kubeconfig


def test_an_existing_kubeconfig_passes(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\n")
    require_kubeconfig(kc)
    require_kubeconfig(kc, "provider")


def test_a_missing_kubeconfig_is_named_with_its_role(tmp_path: Path) -> None:
    kc = tmp_path / "none"
    with pytest.raises(KubeconfigError, match=rf"^kubeconfig {kc} does not exist$"):
        require_kubeconfig(kc)
    with pytest.raises(KubeconfigError, match=rf"^provider kubeconfig {kc} does not exist$") as e:
        require_kubeconfig(kc, "provider")
    assert isinstance(e.value, KubeError) and isinstance(e.value, GpufedError)
    assert e.value.exit_code == 1
