"""What the launcher writes into a cluster for Kueue: in which order, at which URLs, server-side."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from gpufed.kube import manifests, rest
from gpufed.localenv import install


def _crd(name: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": name}}


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(what, URL) of every server-side apply and every wait for Established CRDs, in order."""
    calls: list[tuple[str, str]] = []

    async def apply(api: Any, url: str, obj: Mapping[str, Any], *, what: str = "") -> dict[str, Any]:
        await asyncio.sleep(0)
        calls.append((f"{obj['kind']}/{obj['metadata']['name']}", url))
        return dict(obj)

    async def wait_established(api: Any, names: Iterable[str], timeout_s: float = 60.0) -> None:
        calls.append(("established", ",".join(names)))

    monkeypatch.setattr(rest, "apply", apply)
    monkeypatch.setattr(manifests, "wait_established", wait_established)
    return calls


async def test_kueues_namespace_comes_first_then_its_crds_then_rbac_then_the_wait(
    applied: list[tuple[str, str]],
) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "kueue-manager-secrets-role", "namespace": "kueue-system"},
    }
    await install.apply_kueue(object(), ns, [_crd("a.kueue.x-k8s.io"), _crd("b.kueue.x-k8s.io")], [role])
    assert applied[0] == ("Namespace/kueue-system", "/api/v1/namespaces/kueue-system")
    crds = {"CustomResourceDefinition/a.kueue.x-k8s.io", "CustomResourceDefinition/b.kueue.x-k8s.io"}
    assert {c for c, _ in applied[1:3]} == crds
    assert applied[1][1].startswith("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/")
    assert applied[3] == (
        "Role/kueue-manager-secrets-role",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kueue-system/roles/kueue-manager-secrets-role",
    )
    assert applied[4] == ("established", "a.kueue.x-k8s.io,b.kueue.x-k8s.io")


async def test_webhook_configurations_are_applied_at_their_cluster_scoped_urls(applied: list[tuple[str, str]]) -> None:
    await install.apply(
        object(),
        [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": f"kueue-{kind.lower()}"},
                "webhooks": [],
            }
            for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        ],
    )
    assert [url for _, url in applied] == [
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kueue-mutatingwebhookconfiguration",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kueue-validatingwebhookconfiguration",
    ]
