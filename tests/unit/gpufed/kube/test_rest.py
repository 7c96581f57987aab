"""REST paths: every name, namespace and subresource is one quoted segment; a traversal is refused
before any request leaves the process."""

from __future__ import annotations

import pytest

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from tests.unit.fakes import FakeApiServer, serve


def test_paths_of_ordinary_names_are_unchanged() -> None:
    assert (
        rest.path("v1", "secrets", "db-password", namespace="payments")
        == "/api/v1/namespaces/payments/secrets/db-password"
    )
    assert rest.path("gpufed.io/v1alpha1", "twinnamespaces", namespace="gpufed-tenant-c") == (
        "/apis/gpufed.io/v1alpha1/namespaces/gpufed-tenant-c/twinnamespaces"
    )
    assert rest.path("v1", "serviceaccounts", "default", namespace="team", sub="token") == (
        "/api/v1/namespaces/team/serviceaccounts/default/token"
    )
    assert rest.path("rbac.authorization.k8s.io/v1", "clusterroles", "system:controller:x") == (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:controller:x"
    )


@pytest.mark.parametrize(
    ("name", "namespace", "sub"),
    [
        ("../../gpufed/secrets/x", "team", ""),  # the imagePullSecrets traversal
        ("..", "team", ""),
        (".", "team", ""),
        ("a/b", "team", ""),
        ("x", "../kube-system", ""),
        ("x", "..", ""),
        ("x", "team", "../../secrets"),
        ("x\\..\\y", "team", ""),
        ("x\n", "team", ""),
    ],
)
def test_a_segment_that_would_leave_its_place_is_refused(name: str, namespace: str, sub: str) -> None:
    with pytest.raises(rest.InvalidPathError) as refused:
        rest.path("v1", "secrets", name, namespace=namespace, sub=sub)
    assert isinstance(refused.value, KubeError) and refused.value.status == 400 and not refused.value.transient


def test_other_characters_are_quoted_not_interpreted() -> None:
    assert (
        rest.path("v1", "secrets", "a?b#c d%", namespace="team") == "/api/v1/namespaces/team/secrets/a%3Fb%23c%20d%25"
    )
    assert rest.segment("..x") == "..x"


async def test_no_request_leaves_for_a_traversal() -> None:
    server = FakeApiServer()
    server.create("secrets", {"metadata": {"name": "x", "namespace": "gpufed"}, "data": {"k": "dg=="}})
    async with serve(server) as (_, api):
        with pytest.raises(rest.InvalidPathError):
            await rest.get(api, rest.path("v1", "secrets", "../../gpufed/secrets/x", namespace="team"))
    assert server.requests == []
