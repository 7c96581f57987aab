"""`reflection_reports`: how the provider's refusals are told apart."""

from __future__ import annotations

import pytest

from gpufed.kube.client import KubeError
from vkprovider.remote.reflection_reports import refusal_rule


@pytest.mark.parametrize(
    ("message", "rule"),
    [
        (
            "ValidatingAdmissionPolicy 'gpufed-consumer-objects' with binding 'b' denied request",
            "gpufed-consumer-objects",
        ),
        (
            'admission webhook "validate.nginx.ingress.kubernetes.io" denied the request: x',
            "validate.nginx.ingress.kubernetes.io",
        ),
        ("exceeded quota: gpufed-grant, requested: count/configmaps=1", "ResourceQuota"),
        ('pods "x" is forbidden: violates PodSecurity "baseline:latest"', "PodSecurity"),
        ('User "c" cannot patch resource "ingresses"', "RBAC"),
    ],
)
def test_a_refusal_is_told_apart_by_the_rule_that_made_it(message: str, rule: str) -> None:
    assert refusal_rule(KubeError(f"reflect: 403 {message}", status=403)) == rule
