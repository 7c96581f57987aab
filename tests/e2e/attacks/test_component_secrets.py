"""Attacks from the COMPONENT position on gpufed's own Secrets, on the real local clusters: a
compromised virtual kubelet, with its real credentials on the consumer (the client certificate of
user `gpufed:virtual-kubelet` the local environment issued, and a token of the ServiceAccount
`gpufed/gpufed-virtual-kubelet` the chart runs it as), reaches for the other Secrets of `gpufed`.

The virtual kubelets' static Role in `gpufed` grants no Secret (deploy/rbac/virtual-kubelet.yaml);
the consumer's controller grants each peering's credentials Secret by name, with a Role and
RoleBinding `gpufed-virtual-kubelet-<provider>` owned by the ForeignCluster
(peering.controllers.credentials_access). Each test asserts the refusal (the API server's 403
naming the identity and the Secret: an RBAC refusal has no Event, the answer is the record), and
that nothing leaked (no byte of the Secret in what came back, the Role unchanged). The module
peers the consumer with gpu-a, network included (so the tunnel's key Secret exists), and checks at
the end that the per-peering Role went with the peering.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.apis.wire import (
    IDENTITY_SECRET,
    SYSTEM_NAMESPACE,
    VIRTUAL_KUBELET_SERVICE_ACCOUNT,
    VIRTUAL_KUBELET_USER,
    ClusterID,
    credentials_reader,
    remote_kubeconfig_secret,
)
from gpufed.localenv.components import VIRTUAL_KUBELET
from netfabric.ops import KEY_SECRET_PREFIX
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, peered_session

pytestmark = pytest.mark.timeout(600)

C, P = "consumer", "gpu-a"
SA_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{VIRTUAL_KUBELET_SERVICE_ACCOUNT}"


@dataclass(frozen=True)
class Identity:
    """One of the virtual kubelets' identities, as a kubeconfig holding its real credentials."""

    user: str
    kubeconfig: Path


@dataclass(frozen=True)
class Peering:
    provider: ClusterID
    identities: tuple[Identity, ...]


def _service_account_kubeconfig(clusters: Clusters, directory: Path) -> Path:
    """The consumer's server and CA with a token of the ServiceAccount (a TokenRequest by the admin,
    what the kubelet mounts into the chart's virtual-kubelet pods)."""
    token = clusters.kubectl(
        C, "create", "token", VIRTUAL_KUBELET_SERVICE_ACCOUNT, "-n", SYSTEM_NAMESPACE, "--duration=10m"
    ).stdout.strip()
    assert token, "no token for the virtual kubelets' ServiceAccount"
    config = yaml.safe_load(clusters.env.kubeconfig_path(C, VIRTUAL_KUBELET).read_text())
    user = config["contexts"][0]["context"]["user"]
    config["users"] = [{"name": user, "user": {"token": token}}]
    path = directory / "virtual-kubelet-sa.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def peering(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peering]:
    session = peered_session(clusters, {P: ()})
    ids = next(session)
    provider = ids[P]
    try:
        directory = tmp_path_factory.mktemp("virtual-kubelet-identities")
        yield Peering(
            provider,
            (
                Identity(VIRTUAL_KUBELET_USER, clusters.env.kubeconfig_path(C, VIRTUAL_KUBELET)),
                Identity(SA_USER, _service_account_kubeconfig(clusters, directory)),
            ),
        )
    finally:
        next(session, None)
    # The grant went with the peering (deleted by the controller, owned by the ForeignCluster).
    for kind in ("role", "rolebinding"):
        eventually(
            f"{kind} {credentials_reader(provider)} to go with the peering",
            _gone(clusters, kind, credentials_reader(provider)),
        )


def _gone(clusters: Clusters, kind: str, name: str) -> Callable[[], bool]:
    return lambda: "NotFound" in clusters.kubectl(C, "get", kind, "-n", SYSTEM_NAMESPACE, name, check=False).stderr


def as_identity(clusters: Clusters, who: Identity, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(clusters.env.binary("kubectl")), f"--kubeconfig={who.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def secret_values(clusters: Clusters, name: str) -> list[str]:
    """The Secret's values as the admin reads them (base64 as stored, and decoded): what must not leak."""
    secret: dict[str, Any] = clusters.kubectl_json(C, "get", "secret", "-n", SYSTEM_NAMESPACE, name)
    values = [v for v in (secret.get("data") or {}).values() if v]
    assert values, f"Secret {name} holds nothing: the test would prove nothing"
    return values + [base64.b64decode(v).decode(errors="replace") for v in values]


def assert_refused_and_not_leaked(
    p: subprocess.CompletedProcess[str], who: Identity, verb: str, name: str, leak: list[str]
) -> None:
    assert p.returncode != 0, f"{who.user} could {verb} Secret {name}: {p.stdout[:200]}"
    what = f'secrets "{name}"' if name else "secrets"
    assert f'{what} is forbidden: User "{who.user}" cannot {verb} resource "secrets"' in p.stderr, p.stderr
    assert f'in the namespace "{SYSTEM_NAMESPACE}"' in p.stderr, p.stderr
    for value in leak:
        assert value not in p.stdout and value not in p.stderr, f"part of Secret {name} came back"


# ---------------------------------------------------------------- component (a compromised virtual kubelet)


def test_component_virtual_kubelet_cannot_read_the_clusters_identity_key(clusters: Clusters, peering: Peering) -> None:
    leak = secret_values(clusters, IDENTITY_SECRET)
    for who in peering.identities:
        p = as_identity(clusters, who, "get", "secret", "-n", SYSTEM_NAMESPACE, IDENTITY_SECRET, "-o", "json")
        assert_refused_and_not_leaked(p, who, "get", IDENTITY_SECRET, leak)


def test_component_virtual_kubelet_cannot_read_a_tunnels_private_key(clusters: Clusters, peering: Peering) -> None:
    name = KEY_SECRET_PREFIX + peering.provider
    leak = secret_values(clusters, name)
    for who in peering.identities:
        p = as_identity(clusters, who, "get", "secret", "-n", SYSTEM_NAMESPACE, name, "-o", "json")
        assert_refused_and_not_leaked(p, who, "get", name, leak)


def test_component_virtual_kubelet_cannot_list_or_watch_gpufeds_secrets(clusters: Clusters, peering: Peering) -> None:
    leak = secret_values(clusters, IDENTITY_SECRET) + secret_values(clusters, KEY_SECRET_PREFIX + peering.provider)
    for who in peering.identities:
        listed = as_identity(clusters, who, "get", "secrets", "-n", SYSTEM_NAMESPACE, "-o", "json")
        assert_refused_and_not_leaked(listed, who, "list", "", leak)
        # A raw watch (kubectl get --watch lists first).
        watch = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets?watch=true&timeoutSeconds=3"
        watched = as_identity(clusters, who, "get", "--raw", watch)
        assert_refused_and_not_leaked(watched, who, "watch", "", leak)


def test_component_virtual_kubelet_cannot_widen_its_credentials_role(clusters: Clusters, peering: Peering) -> None:
    name = credentials_reader(peering.provider)
    before = clusters.kubectl_json(C, "get", "role", "-n", SYSTEM_NAMESPACE, name)
    widened = '{"rules":[{"apiGroups":[""],"resources":["secrets"],"verbs":["get","list","watch"]}]}'
    for who in peering.identities:
        p = as_identity(clusters, who, "patch", "role", "-n", SYSTEM_NAMESPACE, name, "--type=merge", "-p", widened)
        assert p.returncode != 0, f"{who.user} rewrote Role {name}"
        # kubectl reads the Role before it patches; either refusal leaves the Role as it was.
        refusals = (f'User "{who.user}" cannot {verb} resource "roles"' for verb in ("get", "patch"))
        assert any(r in p.stderr for r in refusals), p.stderr
    after = clusters.kubectl_json(C, "get", "role", "-n", SYSTEM_NAMESPACE, name)
    assert after["rules"] == before["rules"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "the Role changed"


def test_component_virtual_kubelet_still_reads_its_own_peerings_credentials(
    clusters: Clusters, peering: Peering
) -> None:
    """What it is given: its peering's credentials Secret, by name, granted by a Role that names it alone."""
    name = remote_kubeconfig_secret(peering.provider)
    role = clusters.kubectl_json(C, "get", "role", "-n", SYSTEM_NAMESPACE, credentials_reader(peering.provider))
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [name]}
    ], role["rules"]
    owners = role["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"]) for o in owners] == [("ForeignCluster", peering.provider)], owners
    for who in peering.identities:
        p = as_identity(clusters, who, "get", "secret", "-n", SYSTEM_NAMESPACE, name, "-o", "json")
        assert p.returncode == 0, f"{who.user} cannot read its credentials: {p.stderr}"
        assert "kubeconfig" in p.stdout
